"""Sentence embeddings with sentence-transformers: ELMo's top layer averaged (or max-pooled) over the words of each
sentence, without the `<S>` and `</S>` positions the tokenizer adds.

    from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer

    model = elmo_sentence_transformer("path/to/elmo")       # any ELMo folder or Hub id
    model.encode(["The cat sat on the mat.", "Hello"])       # (2, 2 * projection_dim)
    model.save("elmo-sentences")
    SentenceTransformer("elmo-sentences", trust_remote_code=True)  # the pooling is hf_elmo's class

sentence-transformers' own `Pooling` would count the boundary positions as words (its mask is the attention mask).
Reloading a saved folder needs `trust_remote_code=True` because its pooling module is `ElmoWordPooling`, imported from
the installed hf_elmo (sentence-transformers imports classes outside its own package only when trusted).
"""

from functools import partial

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers.utils import cached_file

from ..configuration_elmo import ElmoConfig
from ..pretrained_elmo import check_tokenizer_files

DEFAULT_MAX_SEQ_LENGTH = 512
"""Positions (words and the two boundaries) a sentence keeps; longer ones are cut, keeping `</S>`. ELMo itself has no
length limit: this bounds the memory and time of one batch, which grow with its longest sentence."""

POOLING_MODES = ("mean", "max")


class ElmoWordPooling(Pooling):
    """sentence-transformers' `Pooling` over the words only: each row's first position (`<S>`) and last unpadded one
    (`</S>`) are left out of the mask it pools with. A sentence without words pools its `<S>` and `</S>` positions,
    as sentence-transformers pools BERT's `[CLS]` and `[SEP]` for an empty text: a finite vector in every mode."""

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
    (`ElmoWordPooling`, `pooling_mode` `mean` or `max`), sentences cut to `max_seq_length` positions."""
    if pooling_mode not in POOLING_MODES:  # the others read single positions, which for ELMo are the boundaries
        raise ValueError(f"pooling_mode must be one of {POOLING_MODES} (over the words), got {pooling_mode!r}")
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < 3:
        raise ValueError(
            f"max_seq_length must be an int of at least 3 positions (<S>, a word, </S>), got {max_seq_length!r}"
        )
    # sentence-transformers reads these files through transformers, whose errors say neither which file nor where
    locate = partial(cached_file, str(model_name_or_path), _raise_exceptions_for_missing_entries=False)
    ElmoConfig.from_pretrained(str(model_name_or_path))
    check_tokenizer_files(model_name_or_path, locate)
    transformer = Transformer(
        str(model_name_or_path), processor_kwargs={"model_max_length": max_seq_length}, model_kwargs=model_kwargs
    )
    pooling = ElmoWordPooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    return SentenceTransformer(modules=[transformer, pooling])


__all__ = ["DEFAULT_MAX_SEQ_LENGTH", "ElmoWordPooling", "elmo_sentence_transformer"]
