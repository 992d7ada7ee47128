"""Continuous streams per batch row, the way the original (bilm-tf) batches a corpus for training and evaluation.

bilm-tf's `_get_batch` gives every batch row its own stream of sentences and carries each row's LSTM state from
batch to batch. A sentence `w_1 .. w_n` is `<S> w_1 .. w_n </S>`: the forward LM reads `<S> w_1 .. w_n` and
predicts `w_1 .. w_n </S>`; the backward LM reads the reversed sentence `</S> w_n .. w_1` and predicts
`w_n .. w_1 <S>`. `</S>` (forward) and `<S>` (backward) are never read: after the last word the row reads the next
sentence's first token with the state carried over. Each batch, rows 0..B-1 in turn fill their `num_steps`
positions, a row whose sentence is used up taking the next unread sentence; the first batch in which some row finds
no sentence left is dropped, and the streams end there.

The two directions read different token sequences (the backward one is each sentence reversed, sentences in the same
order), so a model that runs both directions on one input runs them on two: `StreamBatch` puts the forward streams
in rows `0..B-1` and the backward streams, each piece reversed in time, in rows `B..2B-1`, and scores only the forward
half of the first rows and the backward half of the others. The final state of such a batch is the initial state of
the next, the directions never mixing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .data_bilm import IGNORE_INDEX, split_line
from .tokenization_elmo import BOS_TOKEN, EOS_TOKEN, ElmoTokenizer, words_to_char_ids


def read_lines_as_sentences(files: Sequence[str], split: str = "whitespace", tokenizer=None) -> list[list[str]]:
    """The word lists of every line of `files`, in order; a blank line is an empty sentence (as bilm-tf reads them)."""
    sentences = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            sentences += [split_line(line, split, tokenizer) for line in f]
    return sentences


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


def build_streams(
    sentences: Sequence[list[str]], tokenizer: ElmoTokenizer, batch_size: int, num_steps: int
) -> BiLMStreams:
    """Lay `sentences` out into `batch_size` continuous rows of `num_steps`-position batches (`assign_rows`)."""
    if batch_size < 1 or num_steps < 1:
        raise ValueError(f"batch size and steps per batch must be >= 1, got {batch_size} and {num_steps}.")
    index = {BOS_TOKEN: 0, EOS_TOKEN: 1}
    encoded = [np.array([index.setdefault(w, len(index)) for w in words], dtype=np.int64) for words in sentences]
    words = list(index)
    word_ids = tokenizer.word_targets(words)
    rows, batches = assign_rows([len(s) + 1 for s in encoded], batch_size, num_steps)
    length = batches * num_steps
    bos, eos = np.array([0]), np.array([1])

    def row_stream(row, first, last, reverse):
        pieces = [np.concatenate([first, encoded[k][::-1] if reverse else encoded[k], last]) for k in row]
        pieces = pieces or [np.zeros(1, dtype=np.int64)]
        # A sentence is read up to its last token, which is only the target of the one before.
        inputs = np.concatenate([p[:-1] for p in pieces])[:length]
        targets = np.concatenate([p[1:] for p in pieces])[:length]
        return inputs, word_ids[targets]

    forward = [row_stream(row, bos, eos, False) for row in rows]
    backward = [row_stream(row, eos, bos, True) for row in rows]
    return BiLMStreams(
        words,
        np.stack([i for i, _ in forward]).reshape(batch_size, length),
        np.stack([t for _, t in forward]).reshape(batch_size, length),
        np.stack([i for i, _ in backward]).reshape(batch_size, length),
        np.stack([t for _, t in backward]).reshape(batch_size, length),
    )


def stream_batch(streams: BiLMStreams, char_ids: np.ndarray, start: int, end: int) -> dict[str, torch.Tensor]:
    """Positions `start..end-1` of every row as one `ElmoForBiLM` batch of `2B` rows.

    Rows `0..B-1` hold the forward streams with forward targets only; rows `B..2B-1` the backward streams reversed
    in time (the model's backward LSTM walks from the last position to the first) with backward targets only.
    `char_ids` `(len(streams.words), C)` are the character rows of `streams.words`.
    """
    forward = streams.forward_inputs[:, start:end]
    backward = streams.backward_inputs[:, start:end][:, ::-1]
    input_ids = torch.from_numpy(char_ids[np.concatenate([forward, backward])])
    labels = np.full((*input_ids.shape[:2], 2), IGNORE_INDEX, dtype=np.int64)
    rows = streams.batch_size
    labels[:rows, :, 0] = streams.forward_targets[:, start:end]
    labels[rows:, :, 1] = streams.backward_targets[:, start:end][:, ::-1]
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(input_ids.shape[:2], dtype=torch.long),
        "labels": torch.from_numpy(labels),
    }


def stream_char_ids(streams: BiLMStreams) -> np.ndarray:
    """Character rows `(len(streams.words), 50)` of the streams' words (`<S>` and `</S>` the boundary rows)."""
    return words_to_char_ids(streams.words)


__all__ = ["BiLMStreams", "assign_rows", "build_streams", "read_lines_as_sentences", "stream_batch"]
