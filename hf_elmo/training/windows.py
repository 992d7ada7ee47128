"""The biLM's training examples: sentences packed into windows of character ids and LM targets.

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

import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ..character_rows import BOS_TOKEN, EOS_TOKEN
from ..folder_files import cache_file_damage, cache_record_path, record_cache_file
from ..io.files import read_lines
from ..tokenization_elmo import ElmoTokenizer
from .corpus import _check_split, _check_targets, check_text_files, split_line

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


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
            folder = _checked_generator_cache(source, cache)
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
        if not streaming:  # what this call wrote: complete, renamed into place by `datasets`
            for file in folder.glob("*.arrow"):
                if not cache_record_path(file).exists():
                    record_cache_file(file)
        parts.append(part)
    dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if not streaming and len(dataset) == 0:
        raise ValueError(f"The {role} files {files} hold no sentence.")
    return dataset.with_format("numpy")


def _checked_generator_cache(source: dict, cache_dir: str | None) -> Path:
    """The folder where `datasets` keeps the lines of `source` and the windows made of them (`Dataset.from_generator`
    and `map`), removed when one of its Arrow files does not match its record (`cache_file_damage`: cut short, also at
    a record batch's end, which `datasets` reads without complaint, changed, or never recorded), with a one-line
    warning: `datasets` then prepares them again."""
    from datasets.io.generator import GeneratorDatasetInputStream

    folder = Path(GeneratorDatasetInputStream(_text_rows, cache_dir=cache_dir, gen_kwargs=source).builder.cache_dir)
    for file in sorted(folder.glob("*.arrow")):
        if (damage := cache_file_damage(file)) is not None:
            logger.warning(f"{file}: a damaged windows cache ({damage}): prepared again from {source['path']}")
            shutil.rmtree(folder)
            break
    return folder


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
