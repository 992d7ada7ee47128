"""Continuous streams per batch row, the way the original (bilm-tf) batches a corpus for training and evaluation.

bilm-tf's `_get_batch` gives every batch row its own stream of sentences and carries each row's LSTM state from
batch to batch. A sentence `w_1 .. w_n` is `<S> w_1 .. w_n </S>`: the forward LM reads `<S> w_1 .. w_n` and
predicts `w_1 .. w_n </S>`; the backward LM reads the reversed sentence `</S> w_n .. w_1` and predicts
`w_n .. w_1 <S>`. `</S>` (forward) and `<S>` (backward) are never read: after the last word the row reads the next
sentence's first token with the state carried over. Each batch, rows 0..B-1 in turn fill their `num_steps`
positions, a row whose sentence is used up taking the next unread sentence; the first batch in which some row finds
no sentence left is dropped, and the streams end there.

The two directions read different token sequences (the backward one is each sentence reversed, sentences in the same
order), so a batch holds both: the forward streams go in rows `0..B-1`
and the backward streams, each piece reversed in time, in rows `B..2B-1` (`stream_input_ids`, `StreamWindowDataset`);
the model runs each LSTM stack on its half of the rows only (`split_directions=True`) and scores the forward LM on
the first rows and the backward LM on the others. The final state of such a batch is the initial state of the next,
the directions never mixing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .character_rows import BOS_TOKEN, EOS_TOKEN
from .data_bilm import IGNORE_INDEX
from .tokenization_elmo import ElmoTokenizer


def assign_rows(lengths: Sequence[int], batch_size: int, num_steps: int) -> tuple[list[list[int]], int]:
    """bilm-tf's `_get_batch` layout of sentences offering `lengths` inputs each (words + 1) into batch rows.

    Returns:
        the sentences of each row in reading order, and the number of complete batches (each row then reads
        `batches * num_steps` positions of its sentences).
    """
    rows = [[] for _ in range(batch_size)]
    remaining = [0] * batch_size
    next_sentence, batches = 0, 0
    while True:
        for row in range(batch_size):
            needed = num_steps
            while needed:
                if remaining[row] == 0:
                    if next_sentence == len(lengths):
                        return rows, batches
                    rows[row].append(next_sentence)
                    remaining[row] = lengths[next_sentence]
                    next_sentence += 1
                taken = min(remaining[row], needed)
                remaining[row] -= taken
                needed -= taken
        batches += 1


@dataclass
class BiLMStreams:
    """The token streams of every batch row, as indices into `words` (the distinct words, `<S>`, `</S>` included).

    `forward_inputs` / `forward_targets` `(B, S)`: word indices read and word ids predicted by the forward LM, in
    reading order; `backward_*` the same for the backward LM (its reading order). `targets` are ids of the model's
    word vocabulary, out-of-vocabulary words as `<UNK>`.
    """

    words: list[str]
    forward_inputs: np.ndarray
    forward_targets: np.ndarray
    backward_inputs: np.ndarray
    backward_targets: np.ndarray

    @property
    def batch_size(self) -> int:
        return self.forward_inputs.shape[0]

    @property
    def length(self) -> int:
        """Positions per row."""
        return self.forward_inputs.shape[1]


def encode_sentences(sentences: Sequence[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """The distinct words (`<S>` = 0, `</S>` = 1, then in order of appearance) and each sentence as their indices."""
    index = {BOS_TOKEN: 0, EOS_TOKEN: 1}
    encoded = [np.array([index.setdefault(w, len(index)) for w in words], dtype=np.int64) for words in sentences]
    return list(index), encoded


def _direction_stream(sentences: Sequence[np.ndarray], reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets (word indices) of one direction reading `sentences` one after another."""
    first, last = (np.array([1]), np.array([0])) if reverse else (np.array([0]), np.array([1]))
    pieces = [np.concatenate([first, s[::-1] if reverse else s, last]) for s in sentences]
    if not pieces:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # A sentence is read up to its last token, which is only the target of the one before.
    return np.concatenate([p[:-1] for p in pieces]), np.concatenate([p[1:] for p in pieces])


def build_streams(
    sentences: Sequence[list[str]],
    tokenizer: ElmoTokenizer,
    batch_size: int,
    num_steps: int,
    contiguous: bool = False,
    encoded: tuple[list[str], list[np.ndarray]] | None = None,
) -> BiLMStreams:
    """Lay `sentences` out into `batch_size` continuous rows of `num_steps`-position batches.

    By default exactly as bilm-tf (`assign_rows`). With `contiguous`, the sentences read as one stream are cut into
    `batch_size` equal parts instead, each row reading its part (every complete batch of it): a layout whose length
    does not depend on the order of the sentences, for training epochs of a fixed number of steps. `encoded` is
    `encode_sentences(sentences)` when already computed.
    """
    if batch_size < 1 or num_steps < 1:
        raise ValueError(f"batch size and steps per batch must be >= 1, got {batch_size} and {num_steps}.")
    words, encoded = encoded if encoded is not None else encode_sentences(sentences)
    word_ids = tokenizer.word_targets(words)
    if contiguous:
        streams = [_direction_stream(encoded, reverse) for reverse in (False, True)]
        per_row = len(streams[0][0]) // batch_size
        length = per_row // num_steps * num_steps
        arrays = [a[: batch_size * per_row].reshape(batch_size, per_row)[:, :length] for pair in streams for a in pair]
    else:
        rows, batches = assign_rows([len(s) + 1 for s in encoded], batch_size, num_steps)
        length = batches * num_steps
        arrays = []
        for reverse in (False, True):
            pairs = [_direction_stream([encoded[k] for k in row], reverse) for row in rows]
            arrays += [np.stack([pair[i][:length] for pair in pairs]) for i in range(2)]
    forward_inputs, forward_targets, backward_inputs, backward_targets = arrays
    return BiLMStreams(words, forward_inputs, word_ids[forward_targets], backward_inputs, word_ids[backward_targets])


def stream_input_ids(streams: BiLMStreams, char_ids: np.ndarray, start: int, end: int) -> torch.Tensor:
    """Positions `start..end-1` of every row as the `(2B, end - start, C)` input of one model call: rows `0..B-1`
    the forward streams, rows `B..2B-1` the backward streams reversed in time (the model's backward LSTM walks from
    the last position to the first). `char_ids` `(len(streams.words), C)` are the rows of `streams.words`
    (`tokenizer.characters.rows(streams.words)`)."""
    forward = streams.forward_inputs[:, start:end]
    backward = streams.backward_inputs[:, start:end][:, ::-1]
    return torch.from_numpy(char_ids[np.concatenate([forward, backward])])


class StreamWindowDataset(torch.utils.data.Dataset):
    """Training data as continuous streams: item `i` is the `window` positions of stream `i % rows` at step
    `i // rows`, so that a sequential sampler in batches of `rows / processes` gives every process the same rows at
    every step (accelerate deals batch `j` to process `j % processes`).

    Every epoch reshuffles the sentences (seeded by `seed` and the epoch) and cuts them, read as one stream, into
    `rows` contiguous parts (`build_streams(..., contiguous=True)`); the epochs follow one another in the one pass of
    `steps` steps the dataset holds, so a run is one deterministic sequence that resumes by skipping batches.
    Items are `{"forward_ids" (window, 50), "forward_labels" (window,), "backward_ids", "backward_labels"}`, the
    backward ones reversed in time (see `stream_input_ids`); `DataCollatorForBiLMStreams` makes them a batch.
    """

    def __init__(
        self,
        sentences: Sequence[list[str]],
        tokenizer: ElmoTokenizer,
        rows: int,
        window: int,
        seed: int,
        epochs: float | None = None,
        steps: int | None = None,
    ):
        self.encoded = encode_sentences(sentences)
        self.char_ids = tokenizer.characters.rows(self.encoded[0]).astype(np.int16)
        self.tokenizer, self.rows, self.window, self.seed = tokenizer, rows, window, seed
        inputs = sum(len(s) + 1 for s in self.encoded[1])
        self.steps_per_epoch = inputs // rows // window
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"The training text has {inputs:,} positions per direction, too few for {rows} streams of windows of "
                f"{window}: use a smaller batch size or window, or more text."
            )
        self.steps = steps if steps is not None else max(1, round(epochs * self.steps_per_epoch))
        self._epoch, self._streams = None, None

    def __len__(self) -> int:
        return self.steps * self.rows

    def streams(self, epoch: int) -> BiLMStreams:
        if epoch != self._epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.encoded[1]))
            words, encoded = self.encoded
            shuffled = [encoded[k] for k in order]
            self._streams = build_streams(
                None, self.tokenizer, self.rows, self.window, contiguous=True, encoded=(words, shuffled)
            )
            self._epoch = epoch
        return self._streams

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        step, row = divmod(index, self.rows)
        epoch, step = divmod(step, self.steps_per_epoch)
        streams = self.streams(epoch)
        positions = slice(step * self.window, (step + 1) * self.window)
        return {
            "forward_ids": self.char_ids[streams.forward_inputs[row, positions]],
            "forward_labels": streams.forward_targets[row, positions],
            "backward_ids": self.char_ids[streams.backward_inputs[row, positions][::-1]],
            "backward_labels": streams.backward_targets[row, positions][::-1],
        }


class DataCollatorForBiLMStreams:
    """Stream windows -> an `ElmoForBiLM` batch of `2B` rows: the forward streams with forward labels, then the
    backward streams (reversed in time) with backward labels; every position is real."""

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids = np.concatenate([np.stack([e[f"{d}_ids"] for e in examples]) for d in ("forward", "backward")])
        labels = np.full((*input_ids.shape[:2], 2), IGNORE_INDEX, dtype=np.int64)
        rows = len(examples)
        labels[:rows, :, 0] = np.stack([e["forward_labels"] for e in examples])
        labels[rows:, :, 1] = np.stack([e["backward_labels"] for e in examples])
        return {
            "input_ids": torch.from_numpy(input_ids.astype(np.int64)),
            "attention_mask": torch.ones(input_ids.shape[:2], dtype=torch.long),
            "labels": torch.from_numpy(labels),
        }


__all__ = [
    "BiLMStreams",
    "DataCollatorForBiLMStreams",
    "StreamWindowDataset",
    "assign_rows",
    "build_streams",
    "encode_sentences",
    "stream_input_ids",
]
