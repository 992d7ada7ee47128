"""Sentence embeddings with sentence-transformers: ELMo's top layer averaged (or max-pooled) over the words of each
sentence, without the `<S>` and `</S>` positions the tokenizer adds.

    from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer

    model = elmo_sentence_transformer("path/to/elmo")       # any ELMo folder or Hub id
    model.encode(["The cat sat on the mat.", "Hello"])       # (2, 2 * projection_dim)
    model.save("elmo-sentences")
    SentenceTransformer("elmo-sentences", trust_remote_code=True)  # its modules are hf_elmo's classes

sentence-transformers' own `Pooling` would count the boundary positions as words (its mask is the attention mask).
Reloading a saved folder needs `trust_remote_code=True` because its modules are `ElmoTransformer` and
`ElmoWordPooling`, from the installed hf_elmo (sentence-transformers imports classes outside its own package only when
trusted).
"""

from functools import partial

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers.utils import cached_file

from ..configuration_elmo import MAX_PARAMETERS, ElmoConfig
from ..folder_files import read_json_object
from ..pretrained_elmo import check_tokenizer_files

DEFAULT_MAX_SEQ_LENGTH = 512
"""Positions (words and the two boundaries) a sentence keeps; longer ones are cut, keeping `</S>`. ELMo itself has no
length limit: this bounds the memory and time of one batch, which grow with its longest sentence."""

POOLING_MODES = ("mean", "max")
MODULE_OPTIONS_FILE = "sentence_bert_config.json"


def max_positions(config: ElmoConfig) -> int:
    """The most positions `max_seq_length` may keep for the model of `config`: a sentence of more would make a tensor
    of more than `MAX_PARAMETERS` (2**31) elements in its forward, the limit `ElmoConfig` states on the weights. The
    largest tensors per position: the character embeddings (slots x char_embedding_dim), a filter's window products
    (count x its windows), both directions' LSTM gates (8 x cell_dim), the layers ((num_layers + 1) x 2P)."""
    slots = config.max_characters_per_token
    per_position = max(
        slots * config.char_embedding_dim,
        *(count * (slots - width + 1) for width, count in config.filters),
        8 * config.cell_dim,
        (config.num_layers + 1) * 2 * config.projection_dim,
    )
    return MAX_PARAMETERS // per_position


def check_max_seq_length(value, config: ElmoConfig, source: str = "max_seq_length") -> None:
    """Refuses a `max_seq_length` (named by `source`) that is not an int from 3 to `max_positions(config)`."""
    largest = max_positions(config)
    if isinstance(value, bool) or not isinstance(value, int) or not 3 <= value <= largest:
        raise ValueError(
            f"{source} must be an int from 3 (<S>, a word, </S>) to {largest:,} positions (more would make a tensor of "
            f"over 2**31 elements in this model's forward), got {value!r}"
        )


def check_elmo_folder(source, **hub) -> ElmoConfig:
    """The config of the ELMo folder `source` after its JSON files are checked, each error one line naming the file:
    sentence-transformers reads them through transformers, whose errors say neither which file nor where. `hub`:
    `subfolder`, `revision`, `token`, `cache_dir`, `local_files_only`."""
    locate = partial(cached_file, str(source), _raise_exceptions_for_missing_entries=False, **hub)
    config = ElmoConfig.from_pretrained(str(source), **hub)
    check_tokenizer_files(source, locate)
    options_file = locate(MODULE_OPTIONS_FILE)
    if options_file is not None:
        options = read_json_object(options_file, "the options of a sentence-transformers module")
        if "max_seq_length" in options:
            check_max_seq_length(options["max_seq_length"], config, f"{options_file}: max_seq_length")
    return config


class ElmoTransformer(Transformer):
    """sentence-transformers' `Transformer` over an ELMo folder that checks the folder's files before transformers
    reads them (`check_elmo_folder`) and keeps `max_seq_length` within `max_positions`. A folder saved by a model of
    `elmo_sentence_transformer` names it in modules.json, so `SentenceTransformer(folder, trust_remote_code=True)`
    loads through it."""

    @classmethod
    def load(cls, model_name_or_path, subfolder="", token=None, cache_folder=None, revision=None, **kwargs):
        hub = dict(subfolder=subfolder, token=token, cache_dir=cache_folder, revision=revision)
        check_elmo_folder(model_name_or_path, **hub, local_files_only=kwargs.get("local_files_only", False))
        return super().load(
            model_name_or_path, subfolder=subfolder, token=token, cache_folder=cache_folder, revision=revision, **kwargs
        )

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.model_max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        check_max_seq_length(value, self.model.config)
        self.tokenizer.model_max_length = value


class ElmoWordPooling(Pooling):
    """sentence-transformers' `Pooling` over the words only: each row's first position (`<S>`) and last unpadded one
    (`</S>`) are left out of the mask it pools with. A sentence without words pools its `<S>` and `</S>` positions,
    as sentence-transformers pools BERT's `[CLS]` and `[SEP]` for an empty text: a finite vector in every mode."""

    @classmethod
    def load_config(
        cls,
        model_name_or_path,
        subfolder="",
        config_filename=None,
        token=None,
        cache_folder=None,
        revision=None,
        local_files_only=False,
    ):
        """sentence-transformers' `load_config`, after the module's config file is checked (one line naming it)."""
        hub = dict(token=token, cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        path = cls.load_file_path(model_name_or_path, config_filename or cls.config_file_name, subfolder, **hub)
        if path is not None:
            read_json_object(path, "the options of a sentence-transformers pooling module")
        return super().load_config(model_name_or_path, subfolder, config_filename, **hub)

    def forward(self, features, **kwargs):
        mask = features["attention_mask"]
        words = mask.clone()
        words[:, 0] = 0
        last = mask.sum(dim=1) - 1  # ElmoTokenizer pads on the right only
        words[torch.arange(len(mask), device=mask.device), last] = 0
        words = torch.where(words.any(dim=1, keepdim=True), words, mask)
        pooled = super().forward({**features, "attention_mask": words}, **kwargs)
        return {**pooled, "attention_mask": mask}


def elmo_sentence_transformer(
    model_name_or_path, max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH, pooling_mode: str = "mean", **model_kwargs
) -> SentenceTransformer:
    """A `SentenceTransformer` of the ELMo model in `model_name_or_path`: its top layer pooled over the words
    (`ElmoWordPooling`, `pooling_mode` `mean` or `max`), sentences cut to `max_seq_length` positions (3 to
    `max_positions(config)`)."""
    if pooling_mode not in POOLING_MODES:  # the others read single positions, which for ELMo are the boundaries
        raise ValueError(f"pooling_mode must be one of {POOLING_MODES} (over the words), got {pooling_mode!r}")
    config = check_elmo_folder(model_name_or_path)
    check_max_seq_length(max_seq_length, config)
    transformer = ElmoTransformer(
        str(model_name_or_path), processor_kwargs={"model_max_length": max_seq_length}, model_kwargs=model_kwargs
    )
    pooling = ElmoWordPooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    return SentenceTransformer(modules=[transformer, pooling])


__all__ = [
    "DEFAULT_MAX_SEQ_LENGTH",
    "ElmoTransformer",
    "ElmoWordPooling",
    "check_elmo_folder",
    "check_max_seq_length",
    "elmo_sentence_transformer",
    "max_positions",
]
