"""A model's warm start state, estimated from text and stored in the model folder (`hf-elmo warm-state`).

    hf-elmo warm-state --model DIR (--output-dir NEW_DIR | --in-place) TEXT_FILE... [--sentences N]

A biLM trained the original way (bilm-tf: one continuous stream per batch row, the LSTM state carried from batch to
batch) has, apart from its very first batch, never seen a zero state: started from zeros for every sentence it
scores measurably worse. The warm start state is one fixed state every row starts from instead; it keeps the model
deterministic and batch-invariant.

The estimate is the mean, over the sentence boundaries of continuous streams of the text, of the state a sentence
starts from: the text's first `N` sentences are dealt round-robin to 64 streams, each read the way bilm-tf read its
training data (the forward LSTM reads `<S> w_1 .. w_n` and goes on with the next sentence's `<S>`, the backward one
reads `</S> w_n .. w_1`, sentences in the same order), and the state after each sentence is averaged, per layer and
direction, hidden and memory separately. Measured on the bilm-tf checkpoint of the test fixtures (docs/warm-state.md),
it scores within 0.1% of bilm-tf's own stream evaluation; the mean final state of sentences each run from
zeros (with or without reading `</S>` / `<S>`) is a little worse, and a fixed point of that iteration no better.
"""

import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..character_rows import BOS_TOKEN, EOS_TOKEN
from ..io.files import ElmoInputError, replace_atomically
from ..modeling_elmo import ElmoModel, ElmoState
from ..tokenization_elmo import ElmoTokenizer
from .corpus import check_text_files, iter_sentences

STREAMS = 64
DEFAULT_SENTENCES = 2000
PIECE = 1024
"""Positions of a sentence read per model call: a longer one is read in pieces (`_read_in_pieces`)."""


def _padded(rows: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length, rows[0].shape[1]), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def _read_in_pieces(model: ElmoModel, rows: list[np.ndarray], state: ElmoState, backward_from: int) -> ElmoState:
    """The state after each of `rows` (the character ids of a sentence), from `state`: `PIECE` positions per model
    call, each row's state carried from one call to the next, so that memory does not grow with the length of a
    line. The rows from `backward_from` on are read by the backward LSTM, from their last position to their first:
    their pieces are taken from the end. Rows that fit in one piece (ordinary sentences) are read in a single call."""
    hidden, memory = state
    for start in range(0, max(len(row) for row in rows), PIECE):
        reading = [k for k, row in enumerate(rows) if len(row) > start]
        pieces = [
            rows[k][max(0, len(rows[k]) - start - PIECE) : len(rows[k]) - start]
            if k >= backward_from
            else rows[k][start : start + PIECE]
            for k in reading
        ]
        input_ids, attention_mask = _padded(pieces, hidden.device)
        every_row = len(reading) == len(rows)
        part = None if every_row else torch.tensor(reading, device=hidden.device)
        state = (hidden, memory) if every_row else (hidden[:, part], memory[:, part])
        new_hidden, new_memory = model(input_ids, attention_mask=attention_mask, state=state, use_cache=True).state
        if every_row:
            hidden, memory = new_hidden, new_memory
        else:  # the rows that ended in an earlier piece keep their state
            hidden, memory = hidden.index_copy(1, part, new_hidden), memory.index_copy(1, part, new_memory)
    return hidden, memory


@torch.no_grad()
def estimate_warm_state(
    model: ElmoModel, sentences: Sequence[list[str]], tokenizer: ElmoTokenizer | None = None, streams: int = STREAMS
) -> ElmoState:
    """The mean state at the sentence boundaries of `streams` continuous streams of `sentences` (module docstring).

    Returns:
        `(hidden (num_layers, 2P), memory (num_layers, 2D))` in float32, for `ElmoModel.set_warm_state`.
    """
    if not sentences:
        raise ValueError("Estimating a warm state needs at least one sentence; the text has none.")
    if model.config.input_word_dim:
        raise ValueError("A warm state for a model reading word embeddings (ELMoForManyLangs) is not supported.")
    tokenizer = tokenizer or ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token)
    model.eval()
    config, device = model.config, model.device
    projection_dim, cell_dim = config.projection_dim, config.cell_dim
    per_stream = [sentences[k::streams] for k in range(min(streams, len(sentences)))]
    count = len(per_stream)
    # Rows 0..count-1 carry the forward streams, rows count.. the backward ones (each direction reads its own text).
    hidden, memory = model.initial_state(2 * count, dtype=torch.float32, device=device, warm=False)
    sums = [
        torch.zeros(config.num_layers, 2 * size, dtype=torch.float64, device=device)
        for size in (projection_dim, cell_dim)
    ]
    for step in itertools.count():
        active = [k for k in range(count) if step < len(per_stream[k])]
        if not active:
            break
        words = [per_stream[k][step] for k in active]
        rows = [tokenizer.characters.rows([BOS_TOKEN, *w]) for w in words]
        rows += [tokenizer.characters.rows([*w, EOS_TOKEN]) for w in words]
        index = torch.tensor(active + [count + k for k in active], device=device)
        state = (hidden[:, index].to(model.dtype), memory[:, index].to(model.dtype))
        new_hidden, new_memory = _read_in_pieces(model, rows, state, backward_from=len(words))
        hidden[:, index], memory[:, index] = new_hidden.float(), new_memory.float()
        n = len(active)
        for total, new, size in ((sums[0], new_hidden, projection_dim), (sums[1], new_memory, cell_dim)):
            total[:, :size] += new[:, :n, :size].double().sum(dim=1)
            total[:, size:] += new[:, n:, size:].double().sum(dim=1)
    return tuple((total / len(sentences)).float().cpu() for total in sums)


def read_sentences(files: Sequence[str], limit: int, split: str = "whitespace", tokenizer=None) -> list[list[str]]:
    """The first `limit` sentences (non-blank lines) of `files`."""
    if limit < 1:
        raise ValueError(f"--sentences must be >= 1, got {limit}.")
    files = check_text_files(files, "text")
    return list(itertools.islice(iter_sentences(files, split, tokenizer), limit))


def check_single_weights_file(folder: Path) -> Path:
    """`folder/model.safetensors`, the one weights file `store_warm_state` can add the state to."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        index = folder / "model.safetensors.index.json"
        detail = "sharded weights are not supported" if index.is_file() else "no model.safetensors"
        raise ElmoInputError(f"{folder}: {detail}; load the model, call set_warm_state and save_pretrained instead.")
    return weights


def store_warm_state(folder: str | os.PathLike, state: ElmoState):
    """Writes `state` into a saved model folder: the weights first, then `config.json` (`warm_state: true`).

    Each file is replaced by a rename, so an interruption leaves either the old folder or a complete new one: extra
    warm-state weights without the config flag are ignored when loading.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(folder)
    weights, config_path = check_single_weights_file(folder), folder / "config.json"
    with safe_open(weights, framework="pt") as f:
        metadata = f.metadata()
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    prefix = "elmo." if any(key.startswith("elmo.") for key in tensors) else ""
    dtype = tensors[f"{prefix}char_encoder.char_embedding.weight"].dtype
    tensors[f"{prefix}warm_hidden"] = state[0].to(dtype).contiguous()
    tensors[f"{prefix}warm_memory"] = state[1].to(dtype).contiguous()
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["warm_state"] = True
    replace_atomically(weights, lambda path: save_file(tensors, path, metadata=metadata))
    replace_atomically(config_path, lambda path: path.write_text(json.dumps(config, indent=2) + "\n"))


def add_warm_state(model: ElmoModel, text_files, sentences: int = DEFAULT_SENTENCES):
    """Sets the warm start state of `model` estimated from the first `sentences` sentences of `text_files` (the
    converters' `--warm-state-text`)."""
    try:
        model.set_warm_state(estimate_warm_state(model, read_sentences(text_files, sentences)))
    except (ValueError, FileNotFoundError) as error:
        raise ElmoInputError(f"--warm-state-text: {error}") from None


__all__ = ["add_warm_state", "estimate_warm_state", "read_sentences", "store_warm_state"]
