"""Continuous streams per batch row, the way the original (bilm-tf) batches a corpus for training and evaluation.

bilm-tf's `_get_batch` gives every batch row its own stream of sentences and carries each row's LSTM state from
batch to batch. A sentence `w_1 .. w_n` is `<S> w_1 .. w_n </S>`: the forward LM reads `<S> w_1 .. w_n` and
predicts `w_1 .. w_n </S>`; the backward LM reads the reversed sentence `</S> w_n .. w_1` and predicts
`w_n .. w_1 <S>`. `</S>` (forward) and `<S>` (backward) are never read: after the last word the row reads the next
sentence's first token with the state carried over. Each batch, rows 0..B-1 in turn fill their `num_steps`
positions, a row whose sentence is used up taking the next unread sentence. Evaluation (`build_streams`, in memory)
reads the text once: the first batch in which some row finds no sentence left is dropped, and the streams end there.
Training (`StreamWindowDataset`) reads the corpus shard by shard, epoch after epoch, each process its own part, and
the streams go on.

The two directions read different token sequences (the backward one is each sentence reversed, sentences in the same
order), so a batch holds both: the forward streams go in rows `0..B-1`
and the backward streams, each piece reversed in time, in rows `B..2B-1` (`stream_input_ids`, `StreamWindowDataset`);
the model runs each LSTM stack on its half of the rows only (`split_directions=True`) and scores the forward LM on
the first rows and the backward LM on the others. The final state of such a batch is the initial state of the next,
the directions never mixing.
"""

import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..character_rows import BOS_TOKEN, EOS_TOKEN
from ..folder_files import length_and_digest
from ..io.files import ElmoInputError, json_field, read_json_object, read_lines
from ..tokenization_elmo import ElmoTokenizer
from .collator import DataCollatorForBiLM
from .corpus import _check_split, expand_shards, iter_sentences, split_line
from .windows import IGNORE_INDEX


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
    sentences: Sequence[list[str]], tokenizer: ElmoTokenizer, batch_size: int, num_steps: int
) -> BiLMStreams:
    """Lay `sentences` out into `batch_size` continuous rows of `num_steps`-position batches, exactly as bilm-tf
    (`assign_rows`), all in memory."""
    if batch_size < 1 or num_steps < 1:
        raise ValueError(f"batch size and steps per batch must be >= 1, got {batch_size} and {num_steps}.")
    words, encoded = encode_sentences(sentences)
    word_ids = tokenizer.word_targets(words)
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


STREAM_POSITION = "stream_position"
"""The key of a `--stream` batch's position in the streams after it (`StreamWindowDataset.resume_at`)."""
STREAM_CORPUS_FILE = "stream_corpus.json"
"""In every checkpoint of a `--stream` run: the shards the streams read (name, size, SHA-256), which `--resume` finds
unchanged before it regenerates the streams."""


class WordRows:
    """The character row and the target of every word the streams have read (`char_ids[slot]`, `targets[slot]`),
    each word encoded once: a corpus repeats most of its words, so that a step encodes only those it has not met yet.
    A word's row and target are those the tokenizer gave when the table took it. Between steps the table holds at
    most `capacity` words (more only while one step's sentences hold more): a step whose new sentences might not fit
    starts it over, which bounds its memory on a corpus whose rare words never stop coming."""

    def __init__(self, tokenizer: ElmoTokenizer, capacity: int):
        self.tokenizer, self.capacity = tokenizer, capacity
        # A quarter of the tokenizer's int64, wide enough for bytes; a character vocabulary may number past 2**15.
        self.dtype = np.int16 if tokenizer.characters.size <= np.iinfo(np.int16).max + 1 else np.int32
        self.clear()

    def clear(self):
        self.slots = {}
        self.char_ids = np.empty((0, self.tokenizer.characters.width), self.dtype)
        self.targets = np.empty(0, np.int64)
        self._add([BOS_TOKEN, EOS_TOKEN])  # slots 0 and 1

    def fits(self, count: int) -> bool:
        """Whether `count` more words surely fit."""
        return len(self.slots) + count <= self.capacity

    def encode(self, sentences: Sequence[list[str]]) -> np.ndarray:
        """The slots of `sentences` one after another, each as `<S>`, its words, `</S>`."""
        words = list(itertools.chain.from_iterable(sentences))
        slots = np.fromiter(map(self.slots.get, words, itertools.repeat(-1)), np.int64, len(words))
        missing = np.flatnonzero(slots < 0)
        if missing.size:
            self._add(list(dict.fromkeys(words[k] for k in missing)))
            slots[missing] = [self.slots[words[k]] for k in missing]
        lengths = np.fromiter(map(len, sentences), np.int64, len(sentences)) + 2
        ends = np.cumsum(lengths)
        encoded = np.ones(len(words) + 2 * len(sentences), np.int64)  # </S> where nothing else goes
        encoded[ends - lengths] = 0
        inside = np.ones(len(encoded), bool)
        inside[ends - lengths] = inside[ends - 1] = False
        encoded[inside] = slots
        return encoded

    def _add(self, words: list[str]):
        first, end = len(self.slots), len(self.slots) + len(words)
        if end > len(self.targets):  # room for up to twice as many, so that the table is copied rarely
            room = max(end, min(2 * end, self.capacity))
            char_ids, targets = np.empty((room, self.char_ids.shape[1]), self.dtype), np.empty(room, np.int64)
            char_ids[:first], targets[:first] = self.char_ids[:first], self.targets[:first]
            self.char_ids, self.targets = char_ids, targets
        self.slots.update(zip(words, range(first, end)))
        self.char_ids[first:end] = self.tokenizer.characters.rows(words)
        self.targets[first:end] = self.tokenizer.word_targets(words)


class StreamWindowDataset(torch.utils.data.Dataset):
    """Training data as continuous streams, read from the corpus shard by shard: item `i` is the `window` positions of
    row `i % rows` of process `(i // rows) % processes` at step `i // (rows * processes)`, so that a sequential
    sampler in batches of `rows`, dealt to the processes in turn (accelerate gives batch `j` to process
    `j % processes`), gives every process its own rows at every step.

    Each process reads its own part of the corpus (`files`, as `expand_shards` names them): shards `rank`,
    `rank + processes`, ... of the sorted list, or, with fewer shards than processes, every shard but only its lines
    `rank`, `rank + processes`, ... (counted after the shuffle, which is the same in every process). Its rows share one
    sequence of sentences, as bilm-tf's `_get_batch`: each step, rows `0..rows-1` in turn fill their `window`
    positions, a row whose sentence is used up taking the next one (`assign_rows`'s rule, applied step by step).
    Every epoch the process reads its shards in an order drawn from `seed` and the epoch, one shard in memory at a
    time, its lines shuffled on loading (bilm-tf's `shuffle_on_load`); the epochs follow one another without a break,
    the rows reading on. Without `shuffle` the shards and their lines keep their order: on one file and one process
    the items are those of `build_streams(sentences, tokenizer, rows, window)`, which lays out all sentences in
    memory. Memory holds one shard's lines, the rows' current sentences and the character rows and targets of up to
    `words_kept` words (`WordRows`), whatever the corpus's size.

    The dataset is one pass of `steps` steps, a deterministic sequence: asked for a step it did not just make, it lays
    the streams out again from the start (without building their batches), or from the position given to `resume_at`
    for the steps after it, which is how a resumed run skips the steps it already trained. With `steps` left out it
    holds `epochs` epochs of the whole corpus's positions (counted in one pass over it). Items are `{"forward_ids"
    (window, C), "forward_labels" (window,), "backward_ids", "backward_labels", "stream_position"}`, the backward ones
    reversed in time (see `stream_input_ids`), the position where the streams are after the item's step (`_layout`);
    `DataCollatorForBiLMStreams` makes them a batch.
    """

    words_kept = 1 << 17
    """The most words whose rows and targets a process keeps between steps (`WordRows`)."""

    def __init__(
        self,
        files: Sequence[str | os.PathLike] | str | os.PathLike,
        tokenizer: ElmoTokenizer,
        rows: int,
        window: int,
        seed: int,
        split: str = "whitespace",
        epochs: float | None = None,
        steps: int | None = None,
        rank: int = 0,
        processes: int = 1,
        shuffle: bool = True,
    ):
        if rows < 1 or window < 1 or not 0 <= rank < processes:
            raise ValueError(f"rows and window must be >= 1, rank in [0, {processes}), got {rows}, {window}, {rank}.")
        _check_split(split, tokenizer)
        self.files = expand_shards(files, "training")
        self.tokenizer, self.split, self.rows, self.window, self.seed = tokenizer, split, rows, window, seed
        self.rank, self.processes, self.shuffle = rank, processes, shuffle
        self.steps_per_epoch = None
        if steps is None:
            inputs = sum(len(words) + 1 for words in iter_sentences(self.files, split, tokenizer))
            self.steps_per_epoch = inputs // (rows * processes) // window
            if self.steps_per_epoch == 0:
                raise ValueError(
                    f"The training text has {inputs:,} positions per direction, too few for {rows * processes} "
                    f"streams of windows of {window}: use a smaller batch size or window, or more text."
                )
            steps = max(1, round(epochs * self.steps_per_epoch))
        self.steps = steps
        self._layouts, self._step, self._batch, self._record, self._resume = None, None, None, None, None
        self._resume_shards = None
        self._word_rows, self._row_sentences = None, None

    def __len__(self) -> int:
        return self.steps * self.rows * self.processes

    def __getstate__(self) -> dict:  # a data loader's worker process starts its own layout
        return {
            **self.__dict__,
            "_layouts": None,
            "_step": None,
            "_batch": None,
            "_word_rows": None,
            "_row_sentences": None,
            "_resume_shards": None,
        }

    def epoch_sentences(self, epoch: int) -> Iterator[list[str]]:
        """The sentences this process reads in `epoch`, in order."""
        return (words for _, words in self._read(epoch))

    def _own_shards(self) -> range:
        """The shards this process reads (indices into `files`)."""
        own = range(len(self.files))
        return own[self.rank :: self.processes] if len(self.files) >= self.processes else own

    def _shard_lines(self, epoch: int, shard_position: int) -> tuple[str, list[tuple[int, str]]]:
        """The path and the non-blank `(line number, line)` of the shard this process reads `shard_position`-th in
        `epoch`, in reading order (shuffled on loading)."""
        own = self._own_shards()
        order = np.random.default_rng([self.seed, epoch]).permutation(len(own)) if self.shuffle else range(len(own))
        shard = own[order[shard_position]]
        path = self.files[shard]
        lines = [(number, line) for number, line in enumerate(read_lines(path), start=1) if line.strip()]
        if not lines:
            raise ElmoInputError(f"Training file {path!r} is empty: it has no words.")
        if self.shuffle:
            lines = [lines[k] for k in np.random.default_rng([self.seed, epoch, shard]).permutation(len(lines))]
        return path, lines

    def _read(self, epoch: int, shard_position: int = 0, line_position: int = 0, lines_before: int = 0):
        """This process's sentences of `epoch` from a point on, each as `(where, words)`: `where`, `(epoch, shard
        position, line position, lines before)`, is the sentence's line (`_shard_lines`) and the lines of the epoch
        before it (every process's, which decide whose a line is with fewer shards than processes);
        `_read(*where)` starts with that sentence."""
        lines_taken = lines_before
        for position in range(shard_position, len(self._own_shards())):
            path, lines = self._shard_lines(epoch, position)
            for line_at in range(line_position if position == shard_position else 0, len(lines)):
                number, line = lines[line_at]
                lines_taken += 1
                if len(self.files) < self.processes and (lines_taken - 1) % self.processes != self.rank:
                    continue
                words = split_line(line, self.split, self.tokenizer, f"{path}, line {number}")
                if words:
                    yield (epoch, position, line_at, lines_taken - 1), words

    def _sentences(self, start: tuple[int, int, int, int] | None = None) -> Iterator[tuple[tuple, list[str]]]:
        """`_read` epoch after epoch, from the beginning or from `start` (a sentence's `where`) on."""
        first, *within = start or (0, 0, 0, 0)
        for epoch in itertools.count(first):
            read = None
            for read in self._read(epoch, *within):
                yield read
            if read is None and start is None:
                raise ValueError(
                    f"Process {self.rank} of {self.processes} has no sentence of the training text to read: use fewer "
                    "processes or more text."
                )
            within, start = (0, 0, 0), None

    def _layout(self, resume: np.ndarray | None = None) -> Iterator[tuple[list, list[int], list[int], tuple]]:
        """Each step's pieces, row after row, as `assign_rows` lays them out: the sentence a piece reads (its words),
        where the piece starts in the sentence's positions (a sentence of `n` words offers `n + 1`) and how many it
        reads; the pieces of a row read `window` positions. Then what `_position` makes the streams' position after
        the step of (kept as tuples: the steps only skipped need no array). From such a `resume` position the layout
        goes on as it would have from the start."""
        current, used, where = [[] for _ in range(self.rows)], [1] * self.rows, [None] * self.rows  # nothing to read
        if resume is None:
            sentences, last = self._sentences(), None
        else:
            last = tuple(resume[1].tolist())
            sentences = self._sentences(last)
            next(sentences)  # the last sentence taken, read again
            shards, self._resume_shards = self._resume_shards or {}, None
            for row, (epoch, shard, line, read) in enumerate(resume[2:].tolist()):
                if (epoch, shard) not in shards:
                    shards[epoch, shard] = self._shard_lines(epoch, shard)
                path, lines = shards[epoch, shard]
                number, text = lines[line]
                current[row] = split_line(text, self.split, self.tokenizer, f"{path}, line {number}")
                used[row], where[row] = read, (epoch, shard, line)
        while True:
            pieces, starts, counts = [], [], []
            for row in range(self.rows):
                words, start, needed = current[row], used[row], self.window
                while needed:
                    if start == len(words) + 1:
                        last, words = next(sentences)
                        where[row], start = last[:3], 0
                    taken = min(len(words) + 1 - start, needed)
                    pieces.append(words)
                    starts.append(start)
                    counts.append(taken)
                    start += taken
                    needed -= taken
                current[row], used[row] = words, start
            yield pieces, starts, counts, (last, tuple(where), tuple(used))

    @staticmethod
    def _position(step: int, after: tuple) -> np.ndarray:
        """The streams' position after `step`, `(rows + 2, 4)`, from `_layout`'s tuples: row 0 the step, row 1 where
        the last sentence taken is (`_read`), then each row's sentence and how many of its positions it has read."""
        last, where, used = after
        return np.array([(step, 0, 0, 0), last, *((*at, read) for at, read in zip(where, used))], dtype=np.int64)

    def _make_batch(
        self, pieces: list[list[str]], starts: list[int], counts: list[int], position: np.ndarray
    ) -> list[dict[str, np.ndarray]]:
        """The items of a step (`_layout`'s pieces and position). A sentence is encoded once, when a row takes it,
        and kept while the row reads it; the step's positions are then gathered from the encoded sentences in one
        go."""
        if self._word_rows is None:
            self._word_rows, self._row_sentences = WordRows(self.tokenizer, self.words_kept), [(None, None)] * self.rows
        starts, counts = np.array(starts), np.array(counts)
        read = np.cumsum(counts)  # positions of the step up to the end of each piece
        lasts = np.flatnonzero(read % self.window == 0)  # each row's last piece
        firsts = [0, *(lasts[:-1] + 1).tolist()]
        is_new = [True] * len(pieces)
        for row, first in enumerate(firsts):
            is_new[first] = pieces[first] is not self._row_sentences[row][0]
        new = [words for words, fresh in zip(pieces, is_new) if fresh]
        if not self._word_rows.fits(sum(map(len, new))):
            self._word_rows.clear()
            is_new, new = [True] * len(pieces), pieces
        kept = [self._row_sentences[row][1] for row, first in enumerate(firsts) if not is_new[first]]
        tape = np.concatenate([*kept, self._word_rows.encode(new)])
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces)) + 2
        on_tape = np.argsort(is_new, kind="stable")  # the kept sentences first, then the new ones, each in order
        bases = np.empty_like(lengths)
        bases[on_tape] = np.cumsum(lengths[on_tape]) - lengths[on_tape]
        # Position p of the step reads position k of its piece's sentence: forward, the k-th token on the tape;
        # backward, the (length - 1 - k)-th; the targets are the tokens after them in each direction.
        before = read - counts
        positions = np.arange(self.rows * self.window)
        forward = np.repeat(bases + starts - before, counts) + positions
        backward = np.repeat(bases + lengths - 1 - starts + before, counts) - positions
        char_ids, targets, shape = self._word_rows.char_ids, self._word_rows.targets, (self.rows, self.window)
        forward_ids = char_ids[tape[forward].reshape(shape)]
        forward_labels = targets[tape[forward + 1].reshape(shape)]
        backward_ids = char_ids[tape[backward].reshape(shape)[:, ::-1]]
        backward_labels = targets[tape[backward - 1].reshape(shape)[:, ::-1]]
        rows_ends = zip(lasts.tolist(), bases[lasts].tolist(), (bases + lengths)[lasts].tolist())
        self._row_sentences = [(pieces[k], tape[base:end]) for k, base, end in rows_ends]
        return [
            {
                "forward_ids": forward_ids[row],
                "forward_labels": forward_labels[row],
                "backward_ids": backward_ids[row],
                "backward_labels": backward_labels[row],
                STREAM_POSITION: position,
            }
            for row in range(self.rows)
        ]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"item {index} of a dataset of {len(self)}")
        step, row = divmod(index, self.rows * self.processes)
        part, row = divmod(row, self.rows)
        if part != self.rank:
            raise IndexError(f"item {index} belongs to the rows of process {part}, this is process {self.rank}")
        if step != self._step:
            if self._layouts is None or step < self._step:
                resumed = self._resume is not None and step > self._resume[0, 0]
                self._layouts = self._layout(self._resume) if resumed else self._layout()
                self._step = int(self._resume[0, 0]) if resumed else -1
            try:
                for _ in range(step - self._step - 1):
                    next(self._layouts)
                pieces, starts, counts, after = next(self._layouts)
                position = self._position(step, after)
                self._batch, self._step = self._make_batch(pieces, starts, counts, position), step
            except BaseException:  # a shard that cannot be read: asked again, the layout starts over
                self._layouts, self._step = None, None
                raise
        return self._batch[row]

    def resume_at(self, position: np.ndarray, where: str = "the stream position"):
        """Lays the streams out from `position` (the `stream_position` of a step's batch) for the steps after its
        step, without reading the text before it; a step asked for at or before it is laid out from the start."""
        position = np.asarray(position)
        shape = (self.rows + 2, 4)
        if position.shape != shape or position.dtype.kind not in "iu" or position.min() < 0:
            raise ElmoInputError(
                f"{where}: expected {shape} non-negative integers (the streams of {self.rows} rows), got "
                f"{position.shape} {position.dtype}"
            )
        shards = {}
        for row, (epoch, shard, line, read) in enumerate(position[1:].tolist(), start=-1):
            if (epoch, shard) not in shards and shard < len(self._own_shards()):
                shards[epoch, shard] = self._shard_lines(epoch, shard)
            path, lines = shards.get((epoch, shard), ("", ()))
            if line >= len(lines):
                raise ElmoInputError(f"{where}: names a line that the training files do not have")
            if row < 0:  # the last sentence taken: its lines before, not positions read
                continue
            # A row has read 1 to n + 1 positions of its sentence of n words; past that the layout would read on
            # through the corpus to make up the difference.
            number, text = lines[line]
            offered = len(split_line(text, self.split, self.tokenizer, f"{path}, line {number}")) + 1
            if not 1 <= read <= offered:
                raise ElmoInputError(
                    f"{where}: row {row} has read {read} positions of a sentence that offers 1 to {offered} ({path}, "
                    f"line {number})"
                )
        self._resume, self._layouts, self._step = position.astype(np.int64), None, None
        self._resume_shards = shards  # for the layout, which reads them once more in a loader worker

    def corpus_record(self) -> dict:
        """What `STREAM_CORPUS_FILE` holds: the shards the streams read (all processes'), their sizes and digests."""
        if self._record is None:
            shards = []
            for path in self.files:
                shards.append({"file": path, **length_and_digest(Path(path))})
            self._record = {"shards": shards}
        return self._record

    def check_same_corpus(self, checkpoint: str | os.PathLike):
        """A one-line error unless the shards are those, unchanged, that the run of `checkpoint` read."""
        path = Path(checkpoint) / STREAM_CORPUS_FILE
        if not path.is_file():
            raise ElmoInputError(
                f"--resume: {checkpoint}: no {STREAM_CORPUS_FILE}: written by an earlier version of --stream, which "
                "laid the streams out otherwise; start a new run (--init-from the checkpoint to keep its weights)"
            )
        shards = json_field(read_json_object(path, "stream corpus record"), "shards", str(path))
        fields = ("file", "bytes", "sha256")
        if not isinstance(shards, list) or not all(isinstance(s, dict) and set(fields) <= set(s) for s in shards):
            raise ElmoInputError(f"{path}: field 'shards' must be a list of {{'file', 'bytes', 'sha256'}} objects")
        recorded = {shard["file"]: shard for shard in shards}
        for name in self.files:
            if name not in recorded:
                raise ElmoInputError(
                    f"--resume: the training files now include {name!r}, which the run did not read "
                    f"({STREAM_CORPUS_FILE} in {checkpoint}): resume with the run's shards"
                )
        for name in recorded:
            if name not in self.files:
                raise ElmoInputError(
                    f"--resume: {name!r}, a shard the run read ({STREAM_CORPUS_FILE} in {checkpoint}), is no longer "
                    "among the training files: resume with the run's shards"
                )
        now = {shard["file"]: shard for shard in self.corpus_record()["shards"]}
        for name, shard in recorded.items():
            if (now[name]["bytes"], now[name]["sha256"]) != (shard["bytes"], shard["sha256"]):
                raise ElmoInputError(
                    f"--resume: training file {name!r} changed since the run read it ({shard['bytes']:,} bytes then, "
                    f"{now[name]['bytes']:,} now; {STREAM_CORPUS_FILE} in {checkpoint}): resume with the run's shards"
                )


@dataclass
class DataCollatorForBiLMStreams:
    """Stream windows -> an `ElmoForBiLM` batch of `2B` rows: the forward streams with forward labels, then the
    backward streams (reversed in time) with backward labels; every position is real. The held-out windows of
    `--eval-files` (sentences from the start state, as `load_bilm_dataset` makes them) are padded by
    `DataCollatorForBiLM`: `Trainer` gives the evaluation batches to the training's collator. With `positions`, a
    batch also holds `stream_position`, where the streams are after it, which `StreamTrainer` saves in its checkpoints
    for `--resume` (`StreamWindowDataset.resume_at`)."""

    positions: bool = False

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        if examples and "forward_ids" not in examples[0]:
            return DataCollatorForBiLM()(examples)
        rows = len(examples)
        input_ids = np.empty((2 * rows, *examples[0]["forward_ids"].shape), np.int64)
        np.stack([e["forward_ids"] for e in examples], out=input_ids[:rows])
        np.stack([e["backward_ids"] for e in examples], out=input_ids[rows:])
        labels = np.full((*input_ids.shape[:2], 2), IGNORE_INDEX, dtype=np.int64)
        labels[:rows, :, 0] = np.stack([e["forward_labels"] for e in examples])
        labels[rows:, :, 1] = np.stack([e["backward_labels"] for e in examples])
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.ones(input_ids.shape[:2], dtype=torch.long),
            "labels": torch.from_numpy(labels),
        }
        if self.positions:
            batch[STREAM_POSITION] = torch.from_numpy(examples[0][STREAM_POSITION])
        return batch


__all__ = [
    "BiLMStreams",
    "STREAM_CORPUS_FILE",
    "STREAM_POSITION",
    "DataCollatorForBiLMStreams",
    "StreamWindowDataset",
    "assign_rows",
    "build_streams",
    "encode_sentences",
    "stream_input_ids",
]
