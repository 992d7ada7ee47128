"""Training data of the biLM: plain-text corpora -> packed windows of character ids and LM targets.

A corpus is one or more UTF-8 text files with one sentence per line; blank lines are skipped. Words are
either the whitespace-separated tokens of the line (`split="whitespace"`, the original's format: text already
tokenised, e.g. the 1B Word Benchmark) or the words of `ElmoTokenizer.split_words` (`split="pretokenizer"`,
for raw text).

Each example is a **window**: consecutive whole sentences, each as `<S> w_1 ... w_n </S>`, packed into at
most `window` positions (20 in the original recipe). Every window starts from a zero LSTM state. The
original (bilm-tf) instead cut one continuous stream of sentences into 20-token pieces and carried each
row's LSTM state from batch to batch, so a sentence could be split between batches and the model saw
context from earlier batches (`hf-elmo train --stream` does that, see `streams_bilm`). Windows of whole sentences
make every example independent: they can be shuffled, sharded over processes and resumed exactly, and they match how
`ElmoModel` is used (stateless, sentence by sentence), at the cost of no context beyond the window. A sentence longer
than the window is cut into consecutive windows, as bilm-tf's stream was, each starting from a zero state.

Targets, per sentence of `n` words: the forward LM predicts `w_1 ... w_n, </S>` from the positions of
`<S>, w_1 ... w_n`; the backward LM predicts `<S>, w_1 ... w_n` from the positions of `w_1 ... w_n, </S>`.
Nothing is predicted across sentences (the original also predicted the next sentence's `<S>` from `</S>`,
a certainty), so both directions have `n + 1` targets per sentence and perplexities do not depend on how
sentences were packed together.
"""

import codecs
import contextlib
import glob
import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .character_rows import BOS_TOKEN, EOS_TOKEN, pad_rows
from .file_io import (
    ElmoInputError,
    json_field,
    read_json_object,
    read_lines,
)
from .tokenization_elmo import ElmoTokenizer
from .word_vocabulary import BOS_WORD_INDEX, EOS_WORD_INDEX, count_word_vocabulary

SPLITS = ("whitespace", "pretokenizer")
SPLIT_HELP = (
    "pretokenizer: raw text, split as the tokenizer splits text given to the model; whitespace: text tokenised already "
    "(the original's 1B Word Benchmark)"
)
MODEL_SPLIT_HELP = (
    f"{SPLIT_HELP} (default: the split the model was trained with, recorded in its folder by hf-elmo train, else "
    "whitespace)"
)
IGNORE_INDEX = -100
TRAINING_OPTIONS_FILE = "bilm_training_options.json"
"""What `hf-elmo train` writes into its output folder: the run's options, the text split among them."""


def split_line(line: str, split: str, tokenizer: ElmoTokenizer | None = None, where: str | None = None) -> list[str]:
    """The words of one line: `line.split()` or `tokenizer.split_words(line)`; `where` (e.g. `"file, line 12"`)
    names the line in the splitter's errors."""
    if split == "whitespace":
        return line.split()
    if split == "pretokenizer":
        try:
            return tokenizer.split_words(line)
        except ValueError as error:
            raise ValueError(f"{where or 'a line'}: {error}") from None
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")


def model_split(model_dir: str | os.PathLike, split: str | None = None) -> str:
    """`split` if given, else the split the model in `model_dir` was trained with (recorded by `hf-elmo train` in
    the folder's `TRAINING_OPTIONS_FILE`), else `"whitespace"`: a model reads text as it was trained to."""
    if split is not None:
        return split
    path = Path(model_dir) / TRAINING_OPTIONS_FILE
    if not path.is_file():
        return "whitespace"
    recorded = json_field(read_json_object(path, "training options"), "split", str(path), "whitespace")
    if recorded not in SPLITS:
        raise ElmoInputError(f"{path}: field 'split' must be one of {', '.join(SPLITS)}, got {recorded!r}")
    return recorded


def _check_split(split: str, tokenizer: ElmoTokenizer | None):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    if split == "pretokenizer" and tokenizer is None:
        raise ValueError("split='pretokenizer' needs the tokenizer whose split_words cuts the lines.")


def _check_targets(tokenizer: ElmoTokenizer):
    if tokenizer.word_vocabulary is None:
        raise ValueError(
            "The tokenizer has no word vocabulary for the LM targets: build one (build_word_vocabulary) and attach "
            "it with tokenizer.set_word_vocabulary(words)."
        )


def expand_shards(files: Sequence[str | os.PathLike] | str | os.PathLike, role: str = "data") -> list[str]:
    """The text files a corpus names: a folder stands for its files (hidden ones aside) and a pattern (`*`, `?`, `[`)
    naming no file itself for the files it matches, each in sorted order, as the 1B Word Benchmark's shards."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    expanded = []
    for name in map(os.fspath, files):
        if os.path.isdir(name):
            shards = sorted(str(p) for p in Path(name).iterdir() if p.is_file() and not p.name.startswith("."))
            if not shards:
                raise ValueError(f"{role.capitalize()} folder {name!r} holds no file.")
        elif not os.path.exists(name) and set("*?[") & set(name):
            shards = sorted(glob.glob(name))
            if not shards:
                raise ValueError(f"{role.capitalize()} files {name!r}: no file matches the pattern.")
        else:
            shards = [name]
        expanded += shards
    return expanded


def check_text_files(files: Sequence[str | os.PathLike], role: str = "data") -> list[str]:
    """Paths as strings (folders and patterns as `expand_shards` gives them); raises if one is missing, not a file, not
    UTF-8 text (naming the line), or has no word at all. Reads every file once, in blocks."""
    files = expand_shards(files, role)
    if not files:
        raise ValueError(f"No {role} files given.")
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{role.capitalize()} file {path!r} does not exist or is not a file.")
        decoder, has_words = codecs.getincrementaldecoder("utf-8-sig")(), False
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    text = decoder.decode(block)
                    has_words = has_words or not (text.isspace() or not text)
                decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"{role.capitalize()} file {path!r}: {_first_invalid_line(path)}.") from None
        if not has_words:
            raise ValueError(f"{role.capitalize()} file {path!r} is empty: it has no words.")
    return files


def _first_invalid_line(path) -> str:
    """Where the first invalid UTF-8 of a file is, counting lines as text mode does (LF, CRLF and CR end a line)."""
    number = 0
    with open(path, "rb") as f:
        for chunk in f:
            for line in chunk.splitlines():
                number += 1
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    return f"line {number} is not valid UTF-8 (byte {error.start + 1}: {error.reason})"
    return "not valid UTF-8"  # a multi-byte character cut by the end of the file: the last line


def iter_sentences(
    files: Sequence[str | os.PathLike],
    split: str = "whitespace",
    tokenizer: ElmoTokenizer | None = None,
    locations: bool = False,
    blank_lines: bool = False,
) -> Iterator[list[str]] | Iterator[tuple[str, list[str]]]:
    """The word lists of the non-blank lines of `files` (with `blank_lines`, of every line, a blank one as an empty
    sentence, as bilm-tf reads them), in order; with `locations`, `("file, line N", words)` pairs. The lines are
    those of `file_io.read_lines`."""
    _check_split(split, tokenizer)
    for path in expand_shards(files):
        for number, line in enumerate(read_lines(path), start=1):
            where = f"{path}, line {number}"
            words = split_line(line, split, tokenizer, where)
            if words or blank_lines:
                yield (where, words) if locations else words


def build_word_vocabulary(
    files: Sequence[str | os.PathLike],
    split: str = "whitespace",
    tokenizer: ElmoTokenizer | None = None,
    min_count: int = 1,
    max_size: int | None = None,
) -> list[str]:
    """The vocabulary of the corpus in `files` (`word_vocabulary.count_word_vocabulary`): `<S>`, `</S>`, `<UNK>`,
    then the words seen at least `min_count` times, most frequent first, at most `max_size` entries in all. Save it
    with `word_vocabulary.write_word_vocabulary`."""
    files = check_text_files(files, "corpus")
    return count_word_vocabulary(iter_sentences(files, split, tokenizer), min_count, max_size)


def pack_sentences(sentences: Iterable[list[str]], window: int) -> Iterator[list[list[str]]]:
    """Group consecutive sentences greedily into windows of at most `window` positions (`n + 2` per sentence).

    A sentence longer than that is a group of its own, which `encode_windows(..., window)` cuts into windows.
    """
    current, used = [], 0
    for words in sentences:
        needed = len(words) + 2
        if current and used + needed > window:
            yield current
            current, used = [], 0
        current.append(words)
        used += needed
    if current:
        yield current


def encode_windows(
    windows: Sequence[Sequence[list[str]]], tokenizer: ElmoTokenizer, window: int | None = None
) -> dict[str, list[np.ndarray]]:
    """Character ids and LM targets of packed windows.

    With `window`, a group longer than `window` positions (a sentence longer than the window, alone in its group:
    `pack_sentences`) is cut into consecutive windows of `window` positions, as bilm-tf cut its stream into pieces:
    each of its words is still a target once in each direction, predicted from the context of its own window only.

    Returns:
        `{"input_ids": [(T_i, C) int16], "labels": [(T_i, 2) int32]}` with `T_i` the positions of window `i` and `C`
        the tokenizer's `max_characters_per_token`;
        `labels[t] = [id of the word after t, id of the word before t]` within t's sentence, -100 where none.
    """
    flat, sentence_lengths, window_lengths = [], [], []
    for group in windows:
        window_lengths.append(0)
        for words in group:
            flat += [BOS_TOKEN, *words, EOS_TOKEN]
            sentence_lengths.append(len(words) + 2)
            window_lengths[-1] += len(words) + 2
    char_ids = tokenizer.characters.rows(flat).astype(np.int16)
    word_ids = tokenizer.word_targets(flat).astype(np.int32)
    # Positions of each sentence's </S> and <S>, from the layout (a literal "<S>" word is just a word here).
    ends = np.cumsum(sentence_lengths) - 1
    starts = ends - np.asarray(sentence_lengths) + 1
    labels = np.full((len(flat), 2), IGNORE_INDEX, dtype=np.int32)
    labels[:-1, 0] = word_ids[1:]
    labels[ends, 0] = IGNORE_INDEX
    labels[1:, 1] = word_ids[:-1]
    labels[starts, 1] = IGNORE_INDEX
    if window is not None:
        window_lengths = [
            min(window, length - start) for length in window_lengths for start in range(0, length, window)
        ]
    splits = np.cumsum(window_lengths)[:-1]
    return {"input_ids": np.split(char_ids, splits), "labels": np.split(labels, splits)}


def _encode_lines(batch, indices, tokenizer, window, split, source):
    words = [split_line(line, split, tokenizer, f"{source}, line {i + 1}") for line, i in zip(batch["text"], indices)]
    windows = list(pack_sentences((w for w in words if w), window))
    if not windows:
        return {"input_ids": [], "labels": []}
    # Stored flat: Arrow reads a batch of flat lists much faster than of `Array2D` rows (which it converts one by
    # one), and that read is the host's work per training step.
    encoded = encode_windows(windows, tokenizer, window)
    return {name: [array.reshape(-1) for array in arrays] for name, arrays in encoded.items()}


def load_bilm_dataset(
    files: Sequence[str | os.PathLike],
    tokenizer: ElmoTokenizer,
    window: int = 20,
    split: str = "whitespace",
    streaming: bool = False,
    cache_dir: str | os.PathLike | None = None,
    role: str = "data",
):
    """Plain-text files -> a `datasets` dataset of packed windows, one row each, as `DataCollatorForBiLM` takes them.

    A row holds the window's `T` positions flattened: `input_ids` `(T * C,)` int16 (the `(T, C)` character rows of
    `encode_windows`, `C` = `tokenizer.characters.width`) and `labels` `(2 * T,)` int32 (its `(T, 2)` targets);
    `window_arrays(row)` gives them back as `(T, C)` and `(T, 2)`.

    Args:
        files: text files, one sentence per line.
        tokenizer: an `ElmoTokenizer` with a word vocabulary (the targets; out-of-vocabulary words -> `<UNK>`).
        window: positions per example, boundaries included; a sentence longer than `window - 2` words is cut into
            consecutive windows (`encode_windows`).
        split: `"whitespace"` (tokenised text) or `"pretokenizer"` (raw text through `tokenizer.split_words`).
        streaming: read the files lazily (`datasets.IterableDataset`) for corpora larger than memory or disk
            cache.
        cache_dir: where `datasets` keeps its Arrow files (default: its own cache).
        role: word used in error messages (`"training"`, `"evaluation"`).

    Returns:
        `datasets.Dataset` (or `IterableDataset` when streaming) in numpy format, one row per window, files in order.
    """
    import datasets

    _check_targets(tokenizer)
    if window < 3:
        raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {window}.")
    _check_split(split, tokenizer)
    files = check_text_files(files, role)
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int16")),
            "labels": datasets.Sequence(datasets.Value("int32")),
        }
    )
    parts = []
    for path in files:
        # The lines of `read_lines`, the one reader of every command; the file's size and modification time are
        # part of the cache key, as `load_dataset` makes them for its data files.
        info = os.stat(path)
        source = {"path": path, "stamp": (info.st_size, info.st_mtime_ns)}
        if streaming:
            part = datasets.IterableDataset.from_generator(_text_rows, gen_kwargs=source)
        else:
            cache = None if cache_dir is None else os.fspath(cache_dir)
            part = datasets.Dataset.from_generator(_text_rows, gen_kwargs=source, cache_dir=cache)
        options = {} if streaming else {"desc": f"Packing {os.path.basename(path)} into windows of {window}"}
        part = part.map(
            _encode_lines,
            batched=True,
            batch_size=1000,
            with_indices=True,
            remove_columns=["text"],
            features=features,
            fn_kwargs={"tokenizer": tokenizer, "window": window, "split": split, "source": path},
            **options,
        )
        parts.append(part)
    dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if not streaming and len(dataset) == 0:
        raise ValueError(f"The {role} files {files} hold no sentence.")
    return dataset.with_format("numpy")


def _text_rows(path: str, stamp: tuple[int, int]) -> Iterator[dict]:
    """`{"text": line}` for each line of `path` (`stamp` keys the cache only)."""
    for line in read_lines(path):
        yield {"text": line}


def window_arrays(example: dict, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One window's `(input_ids (T, C), labels (T, 2))` as int64, from a row of `load_bilm_dataset` (flat) or of
    `encode_windows` (2-D); lists, NumPy or torch. `index` names the example in the error raised for bad shapes."""
    if "input_ids" not in example or "labels" not in example:
        hint = ": stored windows need DataCollatorForBiLM(words=<their WordTable>)" if "positions" in example else ""
        raise ValueError(
            f"Example {index}: expected input_ids and labels (a row of load_bilm_dataset), got {sorted(example)}{hint}."
        )
    ids = np.asarray(example["input_ids"], dtype=np.int64)
    labels = np.asarray(example["labels"], dtype=np.int64)
    if labels.ndim == 1 and labels.size % 2 == 0:
        labels = labels.reshape(-1, 2)
    if ids.ndim == 1 and labels.ndim == 2 and len(labels) and ids.size % len(labels) == 0:
        ids = ids.reshape(len(labels), -1)
    if ids.ndim != 2 or labels.ndim != 2 or labels.shape != (len(ids), 2):
        raise ValueError(
            f"Example {index}: expected input_ids (T, C) and labels (T, 2) (or flattened), got "
            f"{np.shape(example['input_ids'])} and {np.shape(example['labels'])}."
        )
    return ids, labels


@dataclass
class DataCollatorForBiLM:
    """Pads windows to a batch: `input_ids` `(B, T, C)`, `attention_mask` `(B, T)`, `labels` `(B, T, 2)`.

    Padding positions are all-zero character rows with mask 0 and labels -100. Examples are dicts with
    `input_ids` `(T_i, C)` and `labels` `(T_i, 2)`, or both flattened as `load_bilm_dataset` stores them (lists,
    numpy or torch); `C` is the model's `max_characters_per_token`, 50 unless it says otherwise. With `words`, the
    examples are the compact rows of `load_compact_bilm_dataset` (`positions`), made into rows and targets here; with
    `words` and `stored_only`, the batch is `{"stored_windows": (B, T + 2) int32}` (`WordTable.stored`), a hundredth of
    the bytes, which `ElmoTrainer` makes into the batch above where the model runs (`WordTable.expand`).
    """

    pad_to_multiple_of: int | None = None
    words: "WordTable | None" = None
    stored_only: bool = False

    def __call__(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("DataCollatorForBiLM got no examples.")
        if self.words is not None:
            from .window_dataset import WORD_TABLE

            # The rows of a batch come from one dataset: the first names the table of all (None: a table not named).
            if examples[0].get(WORD_TABLE) not in (None, self.words.digest):
                raise ValueError(
                    f"Example 0: the window was prepared with another word table than the collator's (of "
                    f"{len(self.words.words):,} words): give DataCollatorForBiLM the WordTable given to "
                    "load_compact_bilm_dataset."
                )
            try:
                positions = max(len(example["positions"]) - 2 for example in examples)
            except KeyError:
                index, example = next((i, e) for i, e in enumerate(examples) if "positions" not in e)
                raise ValueError(
                    f"Example {index}: DataCollatorForBiLM(words=...) takes stored windows (positions, the rows of "
                    f"load_compact_bilm_dataset), got {sorted(example)}: rows of load_bilm_dataset need "
                    "DataCollatorForBiLM() without words."
                ) from None
            if self.pad_to_multiple_of:
                positions = -(-positions // self.pad_to_multiple_of) * self.pad_to_multiple_of
            stored = self.words.stored([example["positions"] for example in examples], positions)
            return {STORED_WINDOWS: stored} if self.stored_only else self.words.expand(stored)
        ids, labels = zip(*(window_arrays(example, index) for index, example in enumerate(examples)))
        width = ids[0].shape[1]
        for index, rows in enumerate(ids):
            if rows.shape[1] != width:
                raise ValueError(f"Example {index}: {rows.shape[1]} characters per position, example 0 has {width}.")
        positions = max(i.shape[0] for i in ids)
        if self.pad_to_multiple_of:
            positions = -(-positions // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch_ids = pad_rows(ids, positions)
        batch_labels = pad_rows(labels, positions, fill=IGNORE_INDEX)
        mask = (np.arange(positions)[None, :] < np.array([len(i) for i in ids])[:, None]).astype(np.int64)
        return {
            "input_ids": torch.from_numpy(batch_ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(batch_labels),
        }


# Compact prepared windows: a position is stored as one int32, an index into the corpus's table of distinct words
# (`WordTable`), and the collator makes the character rows and targets of each batch from the table.

WINDOWS_FORMAT = "hf-elmo compact windows 1"
"""Part of every cache key: a change of the stored layout must not read files written in the old one."""
NO_NEIGHBOUR = -1
STORED_PADDING = -2
"""Fills a row of `WordTable.stored` after its window."""
STORED_WINDOWS = "stored_windows"
"""The key of the batches of `DataCollatorForBiLM(words=..., stored_only=True)`."""
LINES_PER_PACK = 1000
"""Windows are packed within blocks of this many lines of a file, as `load_bilm_dataset` packs each batch of its map:
both preparations give the same windows."""


class WordTable:
    """The distinct words of a corpus: the vocabulary's words first (so a word's index is its word id), then, sorted,
    the corpus's other words and its literal `<S>` and `</S>` words (indices 0 and 1 are the sentence boundaries
    only, which the targets tell apart from the same words written in the text). `rows` are their character rows and
    `targets` their word ids."""

    def __init__(self, tokenizer: ElmoTokenizer, words_seen: Iterable[str]):
        _check_targets(tokenizer)
        vocabulary = tokenizer.word_vocabulary
        known = set(vocabulary)
        extra = sorted(word for word in set(words_seen) if word not in known or word in (BOS_TOKEN, EOS_TOKEN))
        self.words = (*vocabulary, *extra)
        # A literal <S> or </S> of the text maps to its own entry, after the vocabulary.
        self.index = {word: i for i, word in enumerate(self.words)}
        self.rows = tokenizer.characters.rows(self.words).astype(np.int16)
        self.targets = tokenizer.word_targets(self.words).astype(np.int64)
        self.digest = hashlib.sha256("\n".join(self.words).encode("utf-8", "surrogatepass")).hexdigest()
        self._tensors = {}
        self.split = None  # how the text of its words was split, where known (`of_files`)

    @classmethod
    def of_files(cls, files, tokenizer: ElmoTokenizer, split: str = "whitespace") -> "WordTable":
        """The table of the words of `files` (read once, line by line)."""
        seen = set()
        for words in iter_sentences(check_text_files(files), split, tokenizer):
            seen.update(words)
        table = cls(tokenizer, seen)
        table.split = split
        return table

    def window_arrays(self, positions, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """A stored window `[before, p_1 ... p_T, after]` (table indices; `before`/`after` the neighbours of a window
        cut out of a longer sentence, else -1) as `(input_ids (T, C), labels (T, 2))` int64, as `encode_windows`
        gives them."""
        batch = self.expand(self.stored([positions], first_index=index))
        return batch["input_ids"][0].numpy(), batch["labels"][0].numpy()

    def stored(self, windows: Sequence, positions: int | None = None, first_index: int = 0) -> torch.Tensor:
        """Stored windows side by side: `(B, P + 2)` int32, each `[before, p_1 ... p_T, after]` followed by
        `STORED_PADDING`, with `P` the longest window's `T` (or `positions`). `first_index` numbers the windows in
        errors."""
        windows = [np.asarray(window) for window in windows]
        for index, window in enumerate(windows, start=first_index):
            if window.ndim != 1 or window.size < 3:
                raise ValueError(f"Example {index}: expected a stored window of 3 entries or more, got {window.shape}.")
        values = np.concatenate(windows)
        if values.dtype.kind not in "iu":
            bad, window = next((i, w) for i, w in enumerate(windows, start=first_index) if w.dtype.kind not in "iu")
            raise ValueError(f"Example {bad}: stored word indices must be integers, got {window.dtype}.")
        if values.min() < NO_NEIGHBOUR or values.max() >= len(self.words):
            bad = next(i for i, w in enumerate(windows) if w.min() < NO_NEIGHBOUR or w.max() >= len(self.words))
            raise ValueError(
                f"Example {first_index + bad}: stored word indices must be in [-1, {len(self.words) - 1}], got "
                f"[{windows[bad].min()}, {windows[bad].max()}]: the window was prepared with another word table."
            )
        sizes = np.array([window.size for window in windows])
        starts = np.cumsum(sizes) - sizes
        ends = starts + sizes - 1
        # Every -1 must be a window's neighbour, its first or last entry (the range is checked: no value is below -1).
        neighbours = np.count_nonzero(values[starts] == NO_NEIGHBOUR) + np.count_nonzero(values[ends] == NO_NEIGHBOUR)
        if np.count_nonzero(values == NO_NEIGHBOUR) > neighbours:
            bad = next(i for i, w in enumerate(windows) if w[1:-1].min() < 0)
            raise ValueError(
                f"Example {first_index + bad}: the positions of a stored window must be word indices in [0, "
                f"{len(self.words) - 1}], got {windows[bad][1:-1].min()} (-1 is only the neighbour before or after "
                "them)."
            )
        width = int(sizes.max()) if positions is None else positions + 2
        stored = torch.full((len(windows), width), STORED_PADDING, dtype=torch.int32)
        stored.numpy()[np.repeat(np.arange(len(windows)), sizes), np.arange(sizes.sum()) - np.repeat(starts, sizes)] = (
            values
        )
        return stored

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tensors": {}}  # a loader worker started with spawn gets no device tensors

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The table's character rows `(N, C)` int16 and targets `(N,)` int64 on `device` (kept once made)."""
        device = torch.device(device)
        if device not in self._tensors:
            rows, targets = torch.from_numpy(self.rows), torch.from_numpy(self.targets)
            self._tensors[device] = rows.to(device), targets.to(device)
        return self._tensors[device]

    def expand(self, stored: torch.Tensor) -> dict[str, torch.Tensor]:
        """`stored` windows `(B, P + 2)` (`stored`) as the batch the model takes: `input_ids` `(B, P, C)`,
        `attention_mask` `(B, P)` and `labels` `(B, P, 2)`, int64, on the device of `stored`, made there (a few
        gathers: on a GPU the host sends `P + 2` integers a window instead of `53 P`)."""
        rows, targets = self.tensors(stored.device)
        stored = stored.long()
        positions = stored.shape[1] - 2
        lengths = stored.ne(STORED_PADDING).sum(dim=1) - 2
        mask = torch.arange(positions, device=stored.device) < lengths[:, None]
        words = stored[:, 1:-1]
        input_ids = rows[words.clamp(min=0)].long().mul_(mask[..., None])
        neighbours = torch.where(stored >= 0, targets[stored.clamp(min=0)], IGNORE_INDEX)
        forward = torch.where(mask & words.ne(EOS_WORD_INDEX), neighbours[:, 2:], IGNORE_INDEX)
        backward = torch.where(mask & words.ne(BOS_WORD_INDEX), neighbours[:, :-2], IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": mask.long(), "labels": torch.stack([forward, backward], -1)}


def _pack_block(lines, first_number, table: WordTable, window, split, tokenizer, source) -> tuple[np.ndarray, ...]:
    """The stored windows of one block of lines: `(offsets, values)` of the list column."""
    lookup, flat, lengths = table.index.__getitem__, [], []
    sentences = (
        split_line(line, split, tokenizer, f"{source}, line {first_number + i}") for i, line in enumerate(lines)
    )
    try:
        for group in pack_sentences((words for words in sentences if words), window):
            length = 0
            for words in group:
                flat.append(BOS_WORD_INDEX)
                flat.extend(map(lookup, words))
                flat.append(EOS_WORD_INDEX)
                length += len(words) + 2
            lengths += [min(window, length - start) for start in range(0, length, window)]
    except KeyError as error:  # a word the table's pass did not see
        raise ElmoInputError(
            f"{source}: the word {error.args[0]!r} is not in the word table: the file changed after the table was "
            "made from it, or the table was made from other files"
        ) from None
    flat = np.asarray(flat, dtype=np.int32)
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    values = np.empty(flat.size + 2 * lengths.size, dtype=np.int32)
    shift = 2 * np.arange(lengths.size)
    values[np.arange(flat.size) + np.repeat(shift, lengths) + 1] = flat
    cut_before = flat[starts] != BOS_WORD_INDEX
    cut_after = flat[ends - 1] != EOS_WORD_INDEX
    values[starts + shift] = np.where(cut_before, flat[np.maximum(starts - 1, 0)], NO_NEIGHBOUR)
    values[ends + shift + 1] = np.where(cut_after, flat[np.minimum(ends, flat.size - 1)], NO_NEIGHBOUR)
    offsets = np.concatenate([[0], ends + shift + 2]).astype(np.int32)
    return offsets, values


def _compact_schema():
    import pyarrow as pa

    return pa.schema([("positions", pa.list_(pa.int32()))])


@contextlib.contextmanager
def _written_aside(target: Path):
    """A path to write `target` at, renamed to it when the block ends without error: `target` is complete or absent,
    and a failed write leaves no empty cache folder behind."""
    created = [folder for folder in (target.parent, *target.parent.parents) if not folder.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}.partial")
    written = False
    try:
        yield aside
        os.replace(aside, target)
        written = True
    finally:
        aside.unlink(missing_ok=True)
        for folder in [] if written else created:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _write_blocks(path: str, target: Path, table: WordTable, window, split, tokenizer, part=(0, 1)):
    """The windows of the blocks of `LINES_PER_PACK` lines of `path` whose number is `part[0]` modulo `part[1]`, one
    record batch per block (empty ones too when there are several parts, so that the parts interleave), into the
    Arrow stream file `target`."""
    import pyarrow as pa

    rank, parts = part
    schema = _compact_schema()
    with pa.OSFile(str(target), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        lines = read_lines(path)
        for number in itertools.count():
            block = list(itertools.islice(lines, LINES_PER_PACK))
            if not block:
                break
            if number % parts != rank:
                continue
            offsets, values = _pack_block(block, number * LINES_PER_PACK + 1, table, window, split, tokenizer, path)
            if len(offsets) > 1 or parts > 1:
                column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))
                writer.write_batch(pa.record_batch([column], schema=schema))


def _write_compact_file(path: str, target: Path, table: WordTable, window, split, tokenizer, processes: int = 1):
    """The windows of one text file into the Arrow file `target`; with several `processes`, each packs one block of
    lines in `processes` (reading the whole file, packing only its blocks), and the parts are interleaved."""
    import pyarrow as pa

    with _written_aside(target) as aside:
        if processes == 1:
            _write_blocks(path, aside, table, window, split, tokenizer)
            return
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        pieces = [aside.with_name(f"{aside.name}.{rank}") for rank in range(processes)]
        try:
            with ProcessPoolExecutor(processes, mp_context=get_context("fork")) as pool:
                jobs = [
                    pool.submit(_write_blocks, path, piece, table, window, split, tokenizer, (rank, processes))
                    for rank, piece in enumerate(pieces)
                ]
                for job in jobs:
                    job.result()
            with contextlib.ExitStack() as stack, pa.OSFile(str(aside), "wb") as sink:
                readers = [stack.enter_context(pa.ipc.open_stream(pa.memory_map(str(piece)))) for piece in pieces]
                with pa.ipc.new_stream(sink, _compact_schema()) as writer:
                    for reader in itertools.cycle(readers):  # block n is in piece n modulo processes
                        try:
                            batch = reader.read_next_batch()
                        except StopIteration:
                            break
                        if batch.num_rows:
                            writer.write_batch(batch)
        finally:
            for piece in pieces:
                piece.unlink(missing_ok=True)


def window_positions(dataset) -> int:
    """The positions of all windows of a `load_compact_bilm_dataset` dataset, from its stored offsets."""
    import pyarrow.compute as pc

    column = dataset.data.column("positions")
    return int(pc.sum(pc.list_value_length(column)).as_py()) - 2 * len(column)


def load_compact_bilm_dataset(
    files: Sequence[str | os.PathLike],
    table: WordTable,
    tokenizer: ElmoTokenizer,
    window: int = 20,
    split: str = "whitespace",
    cache_dir: str | os.PathLike | None = None,
    role: str = "data",
    processes: int | None = None,
):
    """The windows of `load_bilm_dataset`, stored compactly: one row per window, `positions` `(T + 2,)` int32
    (`WordTable.window_arrays`); `DataCollatorForBiLM(words=table)` makes batches of them, the same batches.

    Each text file is prepared once into an Arrow file of the cache (`cache_dir`, default the `datasets` cache), keyed
    by the file's path, size and modification time, the window, the split and the table; the files are then
    memory-mapped, so preparing and training take memory independent of the corpus's size. Files not prepared yet
    are prepared by `processes` processes (default: one per core): one file each when there are as many files, else
    sharing each file's blocks of lines.
    """
    import datasets
    from datasets.fingerprint import Hasher

    if window < 3:
        raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {window}.")
    _check_split(split, tokenizer)
    if table.split not in (None, split):
        raise ValueError(
            f"The word table was made of the words of split={table.split!r}, the windows would be split with "
            f"split={split!r}: give both the same split."
        )
    files = check_text_files(files, role)
    folder = Path(cache_dir if cache_dir is not None else datasets.config.HF_DATASETS_CACHE) / "hf_elmo_windows"
    splitter = tokenizer if split == "pretokenizer" else None
    targets = []
    for path in files:
        info = os.stat(path)
        source = (os.path.abspath(path), info.st_size, info.st_mtime_ns)
        key = Hasher.hash((WINDOWS_FORMAT, source, window, split, splitter, table.digest))
        targets.append(folder / f"{key}.arrow")
    missing = [(path, target) for path, target in zip(files, targets) if not target.is_file()]
    processes = (os.cpu_count() or 1) if processes is None else processes
    write = partial(_write_compact_file, table=table, window=window, split=split, tokenizer=tokenizer)
    if 1 < processes <= len(missing):
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        # Forked, the workers share the table instead of each receiving a copy.
        with ProcessPoolExecutor(processes, mp_context=get_context("fork")) as pool:
            for done in [pool.submit(write, path, target) for path, target in missing]:
                done.result()
    else:  # fewer files than processes: the processes share each file's blocks
        for path, target in missing:
            write(path, target, processes=processes)
    parts = [datasets.Dataset.from_file(str(target)) for target in targets]
    dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(dataset) == 0:
        raise ValueError(f"The {role} files {files} hold no sentence.")
    from .window_dataset import WindowDataset

    windows = WindowDataset(dataset.data, info=dataset.info, split=dataset.split, fingerprint=dataset._fingerprint)
    windows.word_table = table.digest
    return windows.with_format("numpy")


__all__ = [
    "DataCollatorForBiLM",
    "WordTable",
    "build_word_vocabulary",
    "check_text_files",
    "encode_windows",
    "expand_shards",
    "iter_sentences",
    "load_bilm_dataset",
    "load_compact_bilm_dataset",
    "model_split",
    "pack_sentences",
    "split_line",
    "window_arrays",
    "window_positions",
]
