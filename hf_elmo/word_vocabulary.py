"""The language model's word vocabulary (the targets of its softmax) in the original format, and its builder.

A vocabulary file holds one word per line: `<S>`, `</S>`, `<UNK>` first (ids 0, 1, 2), then the words by
descending frequency, which the log-uniform sampler of the sampled softmax assumes. Only `ElmoForBiLM` needs one:
the model's input is always the characters of each word.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from .character_rows import BOS_TOKEN, EOS_TOKEN
from .folder_files import write_atomically

UNK_TOKEN = "<UNK>"
WORD_VOCABULARY_SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""First three entries of every word vocabulary, so `<S>` = 0, `</S>` = 1, `<UNK>` = 2."""
BOS_WORD_INDEX, EOS_WORD_INDEX, UNK_WORD_INDEX = range(3)
WORD_VOCABULARY_FILE = "vocab.txt"


def check_word_vocabulary(words: Sequence[str], source: str = "Word vocabulary", unit: str = "entry") -> list[str]:
    """Validate a word list in the original format; returns it as a list.

    `<S>`, `</S>`, `<UNK>` must come first, in that order; every entry must be a non-empty string without
    whitespace (one token per line), and no entry may repeat.
    """
    words = list(words)
    for index, (expected, got) in enumerate(zip(WORD_VOCABULARY_SPECIALS, words + [None] * 3)):
        if got != expected:
            raise ValueError(
                f"{source}: {unit} {index + 1} must be {expected!r} (a vocabulary starts with "
                f"{', '.join(WORD_VOCABULARY_SPECIALS)}), got {got!r}."
            )
    first_seen: dict[str, int] = {}
    for index, word in enumerate(words):
        if not isinstance(word, str) or not word or word.split() != [word]:
            raise ValueError(f"{source}: {unit} {index + 1} must be one token without whitespace, got {word!r}.")
        if word in first_seen:
            raise ValueError(f"{source}: {word!r} appears twice ({unit} {first_seen[word] + 1} and {index + 1}).")
        first_seen[word] = index
    return words


def read_word_vocabulary(path: str | os.PathLike) -> list[str]:
    """Read a vocabulary file in the original format: one token per line, `<S>`, `</S>`, `<UNK>` first."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"Word vocabulary file {os.fspath(path)!r} does not exist.") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"Word vocabulary file {os.fspath(path)!r} is not UTF-8 text: {error}.") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return check_word_vocabulary(lines, source=f"Word vocabulary {os.fspath(path)!r}", unit="line")


def write_word_vocabulary(words: Sequence[str], path: str | os.PathLike) -> str:
    """Write a vocabulary file (validated first); written to a temporary name and renamed, never half-written."""
    words = check_word_vocabulary(words)
    return write_atomically(path, "".join(word + "\n" for word in words))


class WordVocabulary:
    """A checked word list and its lookup: word -> id, `<UNK>`'s id 2 for words outside it."""

    def __init__(self, words: Sequence[str]):
        self.index = {word: i for i, word in enumerate(check_word_vocabulary(words))}

    @property
    def words(self) -> list[str]:
        return list(self.index)

    def ids(self, words: Sequence[str]) -> np.ndarray:
        """`(n,)` int64 ids of `n` words; the literal words `<S>` and `</S>` get ids 0 and 1."""
        index = self.index
        return np.fromiter((index.get(w, UNK_WORD_INDEX) for w in words), dtype=np.int64, count=len(words))


def count_word_vocabulary(
    sentences: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None
) -> list[str]:
    """The vocabulary of a corpus given as word lists.

    Returns:
        `["<S>", "</S>", "<UNK>"]` followed by the words seen at least `min_count` times, most frequent first
        (ties in alphabetical order), cut to `max_size` entries in all.
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}.")
    if max_size is not None and max_size <= len(WORD_VOCABULARY_SPECIALS):
        raise ValueError(f"max_size must leave room for words after {WORD_VOCABULARY_SPECIALS}, got {max_size}.")
    counts = Counter()
    for words in sentences:
        counts.update(words)
    for special in WORD_VOCABULARY_SPECIALS:
        counts.pop(special, None)
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if max_size is not None:
        words = words[: max_size - len(WORD_VOCABULARY_SPECIALS)]
    return [*WORD_VOCABULARY_SPECIALS, *words]


__all__ = [
    "WORD_VOCABULARY_SPECIALS",
    "WordVocabulary",
    "check_word_vocabulary",
    "count_word_vocabulary",
    "read_word_vocabulary",
    "write_word_vocabulary",
]
