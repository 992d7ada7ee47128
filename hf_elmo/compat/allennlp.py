"""AllenNLP's ELMo API on hf-elmo's model: change the import, keep the code.

    from allennlp.modules.elmo import Elmo, batch_to_ids   ->  from hf_elmo.compat.allennlp import Elmo, batch_to_ids
    from allennlp.commands.elmo import ElmoEmbedder        ->  from hf_elmo.compat.allennlp import ElmoEmbedder

`Elmo` and `batch_to_ids` have the signatures and return values of AllenNLP 2.10; `ElmoEmbedder` those of its last
release (AllenNLP 0.9; it was removed in 1.0). `options_file` / `weight_file` are the original `options.json` and
`weights.hdf5` (read directly, nothing is converted on disk), or `options_file` is an hf-elmo folder or Hub id with
`weight_file=None`.

**State.** As in AllenNLP, the LSTM state is carried from call to call by default: row `k` of a batch continues
from the final state of row `k` of the previous batch; a larger batch starts its new rows from zeros (from the
model's warm start state if the folder has one) and the store grows; a smaller batch uses and updates only its
first rows. The numbers are then AllenNLP's, call for call. `stateful=False` (a keyword that AllenNLP does not
have) makes every sentence start from zeros (or the warm start state) instead, so that its vectors depend on the
sentence alone; `reset_states()` empties the store.
"""

import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from ..character_rows import BOS_WORD_IDS, EOS_WORD_IDS, MAX_WORD_LENGTH, pad_rows, words_to_char_ids
from ..features.embed import _state_rows, _store_rows, read_lines
from ..io.files import HDF5_FILE, ElmoInputError, write_output
from ..modeling_elmo import ElmoModel
from ..scalar_mix import ScalarMix
from .loading import check_padded_batch, load_elmo

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 64
OUTPUT_FORMATS = ("all", "top", "average")
MAX_OUTPUT_REPRESENTATIONS = 1000
"""AllenNLP's models use one or two mixes; the limit refuses, before anything is built, a count whose outputs would not
fit in memory."""

_STATEFUL_NOTE = (
    "hf_elmo.compat.allennlp carries the LSTM state from call to call, as AllenNLP does: a sentence's vectors then "
    "depend on the batches before it and on its row in the batch (that is how AllenNLP's numbers are reproduced). "
    "Pass stateful=False for vectors that depend on the sentence alone (reproducible whatever the order and "
    "batching, as hf-elmo's AutoModel gives them); a folder with a warm start state (hf-elmo warm-state) then "
    "starts every sentence from a typical state instead of zeros."
)
_noted_state = False


def batch_to_ids(batch: list[list[str]]) -> torch.Tensor:
    """Tokenized sentences -> `(len(batch), longest sentence, 50)` int64 character ids, without `<S>`/`</S>` (the
    model adds them). A word is `[259, its UTF-8 bytes + 1 (the first 48), 260, 261, ...]`, a literal `<S>` or `</S>`
    the boundary row, a padding position all zeros."""
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Iterable):
        raise ElmoInputError(
            f"batch_to_ids expects a list of tokenized sentences (lists of str), got {type(batch).__name__}"
        )
    rows = []
    for index, sentence in enumerate(batch):
        if isinstance(sentence, (str, bytes)) or not isinstance(sentence, Iterable):
            raise ElmoInputError(
                f"batch_to_ids: sentence {index} must be a list of str (a tokenized sentence), got "
                f"{type(sentence).__name__}"
            )
        try:
            rows.append(words_to_char_ids(list(sentence)))
        except TypeError as error:
            raise ElmoInputError(f"batch_to_ids: sentence {index}: {error}") from None
    if not rows:
        return torch.zeros((0, 0, MAX_WORD_LENGTH), dtype=torch.long)
    check_padded_batch("batch_to_ids", len(rows), max(len(row) for row in rows))
    return torch.from_numpy(pad_rows(rows))


def _check_byte_model(model: ElmoModel, source) -> ElmoModel:
    config = model.config
    if config.char_vocabulary or config.input_word_dim:
        raise ElmoInputError(
            f"{source}: reads characters through a vocabulary (an ELMoForManyLangs model), not the UTF-8 bytes of "
            "batch_to_ids; use hf_elmo.compat.elmoformanylangs.Embedder"
        )
    if config.max_characters_per_token != MAX_WORD_LENGTH:
        raise ElmoInputError(
            f"{source}: has rows of {config.max_characters_per_token} characters per word; batch_to_ids writes "
            f"{MAX_WORD_LENGTH}"
        )
    return model


def _words_mask(char_ids: torch.Tensor) -> torch.Tensor:
    """`(B, T)` True at the positions that hold a word."""
    return (char_ids > 0).any(dim=-1)


def _without_boundaries(tensor: torch.Tensor, words_mask: torch.Tensor) -> torch.Tensor:
    """`(B, T + 2, D)` with `<S>`/`</S>` -> `(B, T, D)` of the words only, zero elsewhere."""
    return tensor[:, 1:-1] * words_mask[..., None].to(tensor.dtype)


class _CarriedStateBiLM(nn.Module):
    """The biLM of `Elmo` and `ElmoEmbedder`: adds the sentence boundaries to `batch_to_ids` rows, runs the model
    and keeps AllenNLP's state store when `stateful`. The model stays in eval mode (AllenNLP's biLM has no
    dropout)."""

    def __init__(self, model: ElmoModel, stateful: bool):
        super().__init__()
        self.model = model.eval()
        self.stateful = bool(stateful)
        self._states = None

    def train(self, mode: bool = True):
        super().train(mode)
        self.model.eval()
        return self

    def reset_states(self, mask: torch.Tensor | None = None):
        """Empties the store, or with `mask` `(rows,)` restarts the rows where it is True (AllenNLP's
        `reset_states`)."""
        if mask is None or self._states is None:
            self._states = None
            return
        rows = self._states[0].shape[1]
        if mask.dim() != 1 or mask.shape[0] != rows:
            raise ElmoInputError(
                f"reset_states: the mask must have shape ({rows},), one per stored row, got {tuple(mask.shape)}"
            )
        start = self.model.initial_state(rows, dtype=self._states[0].dtype, device=self._states[0].device)
        keep = ~mask.to(device=start[0].device, dtype=torch.bool)[None, :, None]
        self._states = tuple(torch.where(keep, old, new) for old, new in zip(self._states, start))

    def forward(self, char_ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """`(B, T, 50)` ids -> the `num_layers + 1` layers `(B, T + 2, 2P)` and the mask `(B, T + 2)`, boundaries
        included."""
        global _noted_state
        lengths = _words_mask(char_ids).sum(dim=1)
        framed = char_ids.new_zeros(char_ids.shape[0], char_ids.shape[1] + 2, char_ids.shape[2])
        framed[:, 1:-1] = char_ids
        framed[:, 0] = torch.tensor(BOS_WORD_IDS, dtype=framed.dtype, device=framed.device)
        rows = torch.arange(len(framed), device=framed.device)
        framed[rows, lengths + 1] = torch.tensor(EOS_WORD_IDS, dtype=framed.dtype, device=framed.device)
        state = None
        if self.stateful:
            if not _noted_state:
                _noted_state = True
                logger.warning(_STATEFUL_NOTE)
            if self._states is not None:
                self._states = tuple(t.to(self.model.device, self.model.dtype) for t in self._states)
                state = _state_rows(self._states, len(framed), self.model)
        out = self.model(input_ids=framed, state=state, use_cache=self.stateful, output_hidden_states=True)
        if self.stateful:
            self._states = _store_rows(self._states, tuple(t.detach() for t in out.state))
        return list(out.hidden_states), _words_mask(framed)


class Elmo(nn.Module):
    """AllenNLP's `Elmo`: `num_output_representations` learned mixes (`ScalarMix`) of the biLM layers.

    `forward(inputs, word_inputs=None)` takes `batch_to_ids` output `(batch_size, timesteps, 50)` (or more leading
    dimensions) and returns `{"elmo_representations": [num_output_representations tensors (batch_size, timesteps,
    2P)], "mask": (batch_size, timesteps) bool}`, the sentence boundaries removed unless
    `keep_sentence_boundaries`. `module` may be an `ElmoModel` (e.g. `AutoModel.from_pretrained(...)`) instead of
    the files (its parameters keep their `requires_grad`, as AllenNLP ignores `requires_grad` then). `vocab_to_cache`:
    `word_inputs` `(batch_size, timesteps)` are then ids into that list (0 = padding) and replace `inputs`; ids outside
    it fall back to `inputs`, as in AllenNLP. `stateful`: see the module docstring.
    """

    def __init__(
        self,
        options_file,
        weight_file,
        num_output_representations: int,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: list[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: list[float] | None = None,
        module: ElmoModel | None = None,
        *,
        stateful: bool = True,
    ):
        super().__init__()
        if (
            isinstance(num_output_representations, bool)
            or not isinstance(num_output_representations, int)
            or (num_output_representations < 1)
        ):
            raise ElmoInputError(f"num_output_representations must be an int >= 1, got {num_output_representations!r}")
        if num_output_representations > MAX_OUTPUT_REPRESENTATIONS:
            raise ElmoInputError(
                f"num_output_representations is {num_output_representations:,}, more than the limit of "
                f"{MAX_OUTPUT_REPRESENTATIONS:,} mixes (each call returns a (batch_size, timesteps, 2P) tensor per mix)"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ElmoInputError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if scalar_mix_parameters is not None and not all(
            isinstance(w, (int, float)) and math.isfinite(w) for w in scalar_mix_parameters
        ):
            raise ElmoInputError(f"scalar_mix_parameters must be finite numbers, got {list(scalar_mix_parameters)}")
        if module is not None:
            if options_file is not None or weight_file is not None:
                raise ElmoInputError("Elmo: give module, or options_file and weight_file, not both")
            if not isinstance(module, ElmoModel):
                raise ElmoInputError(f"Elmo: module must be an ElmoModel, got {type(module).__name__}")
            model = _check_byte_model(module, "module")
        else:
            model, _ = load_elmo(options_file, weight_file)
            model = _check_byte_model(model, options_file).requires_grad_(requires_grad)
        self._elmo_lstm = _CarriedStateBiLM(model, stateful)
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._dropout = nn.Dropout(p=dropout)
        self._scalar_mixes = []
        for k in range(num_output_representations):
            try:
                scalar_mix = ScalarMix(
                    model.config.num_layers + 1,
                    initial_weights=scalar_mix_parameters,
                    trainable=scalar_mix_parameters is None,
                    do_layer_norm=do_layer_norm,
                )
            except ValueError as error:
                raise ElmoInputError(f"scalar_mix_parameters: {error}") from None
            self.add_module(f"scalar_mix_{k}", scalar_mix)
            self._scalar_mixes.append(scalar_mix)
        self._has_cached_vocab = vocab_to_cache is not None
        if self._has_cached_vocab:
            if isinstance(vocab_to_cache, str) or not all(isinstance(word, str) for word in vocab_to_cache):
                raise ElmoInputError("vocab_to_cache must be a list of str (the words that word_inputs index)")
            rows = words_to_char_ids(list(vocab_to_cache))
            rows[:1] = 0  # id 0 is padding
            self.register_buffer("_cached_char_ids", torch.from_numpy(rows), persistent=False)

    def get_output_dim(self) -> int:
        return self._elmo_lstm.model.config.hidden_size

    def reset_states(self, mask: torch.Tensor | None = None):
        """Forgets the carried state (all rows, or those where `mask` is True)."""
        self._elmo_lstm.reset_states(mask)

    def forward(self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None) -> dict:
        if not isinstance(inputs, torch.Tensor) or inputs.dim() < 3 or inputs.shape[-1] != MAX_WORD_LENGTH:
            shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
            raise ElmoInputError(
                f"Elmo expects character ids (batch_size, timesteps, {MAX_WORD_LENGTH}) from batch_to_ids, got {shape}"
            )
        if inputs.numel() and bool((inputs < 0).any()):
            raise ElmoInputError(f"Elmo: character ids must be >= 0 (from batch_to_ids), found {int(inputs.min())}")
        output_shape = inputs.shape[:-1]
        char_ids = inputs.reshape(math.prod(inputs.shape[:-2]), *inputs.shape[-2:])
        if not len(char_ids):
            raise ElmoInputError("Elmo: the batch holds no sentence")
        if word_inputs is not None and not self._has_cached_vocab:
            logger.warning("Word inputs were passed to ELMo but it does not have a cached vocab.")
        elif word_inputs is not None:
            table = self._cached_char_ids
            if word_inputs.dim() >= 2 and bool(((word_inputs >= 0) & (word_inputs < len(table))).all()):
                output_shape = word_inputs.shape
                char_ids = table[word_inputs.reshape(-1, word_inputs.shape[-1]).long()]
        if self._keep_sentence_boundaries and len(output_shape) > 2:
            raise ElmoInputError("keep_sentence_boundaries needs inputs of shape (batch_size, timesteps, 50)")
        check_padded_batch("Elmo", char_ids.shape[0], char_ids.shape[1] + 2, self._elmo_lstm.model.config)
        layers, mask_with_boundaries = self._elmo_lstm(char_ids)
        words_mask = _words_mask(char_ids)
        representations = []
        for scalar_mix in self._scalar_mixes:
            representation = scalar_mix(layers, mask_with_boundaries)
            if not self._keep_sentence_boundaries:
                representation = _without_boundaries(representation, words_mask)
            representations.append(self._dropout(representation))
        mask = mask_with_boundaries if self._keep_sentence_boundaries else words_mask
        if len(output_shape) > 2:
            representations = [r.reshape(*output_shape, -1) for r in representations]
            mask = mask.reshape(output_shape)
        return {"elmo_representations": representations, "mask": mask}


def empty_embedding(num_layers: int = 3, dim: int = 1024) -> np.ndarray:
    """The vectors of no words."""
    return np.zeros((num_layers, 0, dim), dtype=np.float32)


class ElmoEmbedder:
    """AllenNLP's `ElmoEmbedder` (`allennlp.commands.elmo`): all biLM layers of tokenized sentences as numpy arrays
    `(num_layers + 1, n_words, 2P)`, and `embed_file` writing the HDF5 file of `allennlp elmo`. `stateful`: see the
    module docstring."""

    def __init__(self, options_file, weight_file=None, cuda_device: int = -1, *, stateful: bool = True):
        if isinstance(cuda_device, bool) or not isinstance(cuda_device, int):
            raise ElmoInputError(f"cuda_device must be an int (-1 for the CPU), got {cuda_device!r}")
        if cuda_device >= 0 and cuda_device >= torch.cuda.device_count():
            raise ElmoInputError(
                f"cuda_device={cuda_device}: this machine has {torch.cuda.device_count()} CUDA devices"
            )
        model, _ = load_elmo(options_file, weight_file)
        model = _check_byte_model(model, options_file).requires_grad_(False)
        self._model_files = [options_file, weight_file]  # never replaced by embed_file's output
        self.elmo_bilm = _CarriedStateBiLM(model, stateful)
        if cuda_device >= 0:
            self.elmo_bilm = self.elmo_bilm.cuda(device=cuda_device)
        self.cuda_device = cuda_device

    def reset_states(self):
        """Forgets the carried state."""
        self.elmo_bilm.reset_states()

    def _empty(self) -> np.ndarray:
        config = self.elmo_bilm.model.config
        return empty_embedding(config.num_layers + 1, config.hidden_size)

    def batch_to_embeddings(self, batch: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """`(activations (batch_size, num_layers + 1, timesteps, 2P), mask (batch_size, timesteps))`."""
        if isinstance(batch, list) and all(isinstance(sentence, list) for sentence in batch) and batch:
            longest = max(len(sentence) for sentence in batch)
            check_padded_batch("ElmoEmbedder", len(batch), longest + 2, self.elmo_bilm.model.config)
        character_ids = batch_to_ids(batch)
        if self.cuda_device >= 0:
            character_ids = character_ids.cuda(device=self.cuda_device)
        layers, _ = self.elmo_bilm(character_ids)
        mask = _words_mask(character_ids)
        return torch.stack([_without_boundaries(layer, mask) for layer in layers], dim=1), mask

    def embed_sentence(self, sentence: list[str]) -> np.ndarray:
        """`(num_layers + 1, n_words, 2P)` of one tokenized sentence (a batch of one: it continues row 0)."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: list[list[str]]) -> list[np.ndarray]:
        """One `(num_layers + 1, n_words, 2P)` array per sentence. A batch of only an empty sentence is not run
        (AllenNLP's special case, which leaves the state as it is)."""
        if batch == [[]]:
            return [self._empty()]
        embeddings, mask = self.batch_to_embeddings(batch)
        lengths = mask.sum(dim=1).tolist()
        return [
            embeddings[i, :, :length].detach().cpu().numpy() if length else self._empty()
            for i, length in enumerate(lengths)
        ]

    def embed_sentences(self, sentences: Iterable[list[str]], batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator:
        """`embed_batch` over consecutive groups of `batch_size` sentences, one array per sentence."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoInputError(f"batch_size must be an int >= 1, got {batch_size!r}")
        sentences = iter(sentences)
        while batch := list(itertools.islice(sentences, batch_size)):
            yield from self.embed_batch(batch)

    def embed_file(
        self,
        input_file,
        output_file_path,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """Embeds a file of whitespace-tokenized sentences, one per line (an open text file, closed at the end as
        AllenNLP does, or a path), into an HDF5 file: one float32 dataset per line named by its line number (or by
        the sentence, `use_sentence_keys`), `(num_layers + 1, n_words, 2P)` for `"all"`, `(n_words, 2P)` for
        `"top"` and `"average"`, and `sentence_to_index` (JSON of sentence -> key) unless `forget_sentences` or
        `use_sentence_keys`. The file appears complete or not at all; an existing HDF5 file is replaced."""
        if output_format not in OUTPUT_FORMATS:
            raise ElmoInputError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}; got {output_format!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoInputError(f"batch_size must be an int >= 1, got {batch_size!r}")
        inputs = list(self._model_files)
        if isinstance(input_file, (str, os.PathLike)):
            inputs.append(input_file)
            sentences = [line.strip() for line in read_lines(input_file)]
        else:
            if isinstance(getattr(input_file, "name", None), str):
                inputs.append(input_file.name)  # so that the output cannot replace it
            try:
                sentences = [line.strip() for line in input_file]
            finally:
                input_file.close()
        blank_lines = [i for i, sentence in enumerate(sentences) if sentence == ""]
        if blank_lines:
            raise ElmoInputError(f"Your input file contains empty lines at indexes {blank_lines}. Please remove them.")
        if use_sentence_keys:
            logger.warning("Using sentences as keys can fail if sentences contain forward slashes or colons.")
            first_line = {}
            for i, sentence in enumerate(sentences):
                if "/" in sentence:
                    raise ElmoInputError(f"line {i}: a sentence key cannot hold '/' (HDF5 reads it as a group path)")
                if first_line.setdefault(sentence, i) != i:
                    raise ElmoInputError(
                        f"line {i} repeats line {first_line[sentence]}: with use_sentence_keys every sentence must be "
                        "unique (do not pass use_sentence_keys to encode duplicate sentences)"
                    )

        def write(path):
            import h5py

            keys = sentences if use_sentence_keys else [str(i) for i in range(len(sentences))]
            with h5py.File(path, "w") as fout:
                embedded = self.embed_sentences((sentence.split() for sentence in sentences), batch_size)
                for key, embeddings in zip(keys, embedded):
                    if output_format == "top":
                        embeddings = embeddings[-1]
                    elif output_format == "average":
                        embeddings = np.average(embeddings, axis=0)
                    fout.create_dataset(key, embeddings.shape, dtype="float32", data=embeddings)
                if not forget_sentences and not use_sentence_keys:
                    index = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                    index[0] = json.dumps(dict(zip(sentences, keys)))

        write_output(output_file_path, write, HDF5_FILE, inputs, force=True)


__all__ = ["Elmo", "ElmoEmbedder", "batch_to_ids"]
