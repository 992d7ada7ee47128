"""Character-id tokenizer for ELMo.

ELMo reads words as rows of 50 character ids, so its `input_ids` are 3-D: `(batch, positions, 50)`.
The ids follow AllenNLP's `ELMoCharacterMapper` / bilm-tf's `UnicodeCharsVocabulary` exactly:

* a word is encoded to UTF-8 with errors ignored (lone surrogates vanish) and cut to its first
  48 **bytes** (a cut may split a multi-byte character; the partial bytes are kept);
* its row is `[begin-of-word, byte_1 ... byte_n, end-of-word, padding-char, ...]`;
* every id is the raw id + 1 (byte `b` -> `b + 1`), which keeps 0 free for padding positions;
* the sentence boundaries `<S>` and `</S>` are whole rows holding the begin/end-of-sentence
  characters; a user word that is literally `<S>` or `</S>` gets those rows;
* padding positions are rows of 50 zeros.

With a character vocabulary (`CharacterVocabulary`, ELMoForManyLangs models) the ids come from that vocabulary
of Unicode characters instead, and a word vocabulary can add `input_word_ids`.

This file is also saved verbatim as remote code, so it must not import other package modules.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tokenizers import Regex
from tokenizers import pre_tokenizers as _pre_tokenizers
from transformers import BatchEncoding, PreTrainedTokenizer
from transformers.tokenization_utils_base import TokenSpan, TruncationStrategy
from transformers.utils import PaddingStrategy, TensorType


__all__ = [
    "CharacterVocabulary",
    "ElmoBatchEncoding",
    "ElmoTokenizer",
    "WORD_VOCABULARY_SPECIALS",
    "build_pre_tokenizer",
    "read_word_vocabulary",
    "words_to_char_ids",
    "write_word_vocabulary",
]

# --- character ids --------------------------------------------------------------------------------

MAX_WORD_LENGTH = 50
"""Slots per word row (hard-coded in AllenNLP's mapper and bilm-tf)."""
MAX_WORD_BYTES = MAX_WORD_LENGTH - 2
"""UTF-8 bytes kept per word: the row also holds begin-of-word and end-of-word."""

# Raw ids as in AllenNLP / bilm-tf, before the +1 shift.
RAW_BEGINNING_OF_SENTENCE_CHARACTER = 256
RAW_END_OF_SENTENCE_CHARACTER = 257
RAW_BEGINNING_OF_WORD_CHARACTER = 258
RAW_END_OF_WORD_CHARACTER = 259
RAW_PADDING_CHARACTER = 260
CHARACTER_ID_OFFSET = 1
"""Added to every raw id so that 0 can mean "no word here"."""

# Ids as they appear in `input_ids` (after the shift).
PADDING_WORD_ID = 0
BEGINNING_OF_SENTENCE_CHARACTER = RAW_BEGINNING_OF_SENTENCE_CHARACTER + CHARACTER_ID_OFFSET  # 257
END_OF_SENTENCE_CHARACTER = RAW_END_OF_SENTENCE_CHARACTER + CHARACTER_ID_OFFSET  # 258
BEGINNING_OF_WORD_CHARACTER = RAW_BEGINNING_OF_WORD_CHARACTER + CHARACTER_ID_OFFSET  # 259
END_OF_WORD_CHARACTER = RAW_END_OF_WORD_CHARACTER + CHARACTER_ID_OFFSET  # 260
PADDING_CHARACTER = RAW_PADDING_CHARACTER + CHARACTER_ID_OFFSET  # 261
NUM_CHARACTER_IDS = PADDING_CHARACTER + 1  # 262 rows in the character embedding

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
PAD_TOKEN = "<pad>"


def _boundary_row(character: int) -> np.ndarray:
    row = np.full(MAX_WORD_LENGTH, PADDING_CHARACTER, dtype=np.int64)
    row[:3] = (BEGINNING_OF_WORD_CHARACTER, character, END_OF_WORD_CHARACTER)
    row.setflags(write=False)
    return row


BOS_WORD_IDS = _boundary_row(BEGINNING_OF_SENTENCE_CHARACTER)
"""Row of the `<S>` position: `[259, 257, 260, 261, ..., 261]`."""
EOS_WORD_IDS = _boundary_row(END_OF_SENTENCE_CHARACTER)
"""Row of the `</S>` position: `[259, 258, 260, 261, ..., 261]`."""
PADDING_WORD_IDS = np.zeros(MAX_WORD_LENGTH, dtype=np.int64)
PADDING_WORD_IDS.setflags(write=False)

# Shifted byte ids of the literal strings, to spot them after the vectorised byte scatter.
_BOS_LITERAL = np.frombuffer(BOS_TOKEN.encode("ascii"), dtype=np.uint8).astype(np.int64) + CHARACTER_ID_OFFSET
_EOS_LITERAL = np.frombuffer(EOS_TOKEN.encode("ascii"), dtype=np.uint8).astype(np.int64) + CHARACTER_ID_OFFSET


def _encode_words(words: Sequence[str]) -> list[bytes]:
    try:
        # `str.encode` (not `word.encode`) so that e.g. a bytes object fails instead of passing through.
        return [str.encode(word, "utf-8", "ignore")[:MAX_WORD_BYTES] for word in words]
    except TypeError as error:
        for index, word in enumerate(words):
            if not isinstance(word, str):
                raise TypeError(
                    f"Every word must be a str, but word {index} is {type(word).__name__}: {word!r:.60}"
                ) from None
        raise error


def words_to_char_ids(words: Sequence[str]) -> np.ndarray:
    """Map words to ELMo character-id rows.

    Args:
        words: sequence of `n` strings (any unicode, including the empty string).

    Returns:
        `np.ndarray` of shape `(n, 50)` and dtype int64, values in `[1, 261]`: one row per word laid
        out as `[259, byte_1 + 1, ..., byte_k + 1, 260, 261, ...]` with `k = min(48, len(utf8))`,
        or the `<S>` / `</S>` boundary rows for the literal words `"<S>"` / `"</S>"`.
    """
    if isinstance(words, (str, bytes)):
        raise TypeError(f"words_to_char_ids expects a sequence of words, not a single {type(words).__name__}")
    encoded = _encode_words(words)
    n_words = len(encoded)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n_words)
    ids = np.full((n_words, MAX_WORD_LENGTH), PADDING_CHARACTER, dtype=np.int64)
    ids[:, 0] = BEGINNING_OF_WORD_CHARACTER
    if n_words == 0:
        return ids

    # One scatter for all bytes of all words: byte j of word i goes to slot 1 + j of row i.
    flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    if flat.size:
        rows = np.repeat(np.arange(n_words), lengths)
        starts = np.cumsum(lengths) - lengths
        slots = np.arange(flat.size) - np.repeat(starts, lengths) + 1
        ids[rows, slots] = flat.astype(np.int64) + CHARACTER_ID_OFFSET
    ids[np.arange(n_words), lengths + 1] = END_OF_WORD_CHARACTER

    # Literal "<S>"/"</S>" words become the boundary rows (AllenNLP does the same).
    is_bos = (lengths == 3) & np.all(ids[:, 1:4] == _BOS_LITERAL, axis=1)
    is_eos = (lengths == 4) & np.all(ids[:, 1:5] == _EOS_LITERAL, axis=1)
    ids[is_bos] = BOS_WORD_IDS
    ids[is_eos] = EOS_WORD_IDS
    return ids


def char_ids_to_word(row: Sequence[int] | np.ndarray) -> str:
    """Recover the text of one word row (`(50,)` ids); invalid UTF-8 is replaced by U+FFFD.

    The boundary rows give `"<S>"` / `"</S>"` and an all-zero padding row gives `""`.
    """
    row = np.asarray(row, dtype=np.int64).reshape(-1)
    if row.size == MAX_WORD_LENGTH and np.array_equal(row, BOS_WORD_IDS):
        return BOS_TOKEN
    if row.size == MAX_WORD_LENGTH and np.array_equal(row, EOS_WORD_IDS):
        return EOS_TOKEN
    end = np.flatnonzero(row == END_OF_WORD_CHARACTER)
    content = row[: end[0] if end.size else row.size]
    content = content[(content >= 1) & (content <= 256)] - CHARACTER_ID_OFFSET
    return content.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


# --- character vocabulary (ELMoForManyLangs) -------------------------------------------------------

VOCAB_BEGINNING_OF_WORD = "<bow>"
VOCAB_END_OF_WORD = "<eow>"
VOCAB_PADDING = "<pad>"
VOCAB_UNKNOWN = "<oov>"
VOCAB_BOS_TOKEN = "<bos>"
VOCAB_EOS_TOKEN = "<eos>"


def _check_ids(vocabulary: Any, what: str, required: Sequence[str], lowest: int) -> dict[str, int]:
    if not isinstance(vocabulary, Mapping):
        raise ValueError(f"{what} must map strings to ids, got {type(vocabulary).__name__}")
    missing = [token for token in required if token not in vocabulary]
    if missing:
        raise ValueError(f"{what} lacks the special entries {missing}")
    for token, index in vocabulary.items():
        if not isinstance(token, str) or isinstance(index, bool) or not isinstance(index, int) or index < lowest:
            raise ValueError(f"{what}: entry {token!r} -> {index!r}; expected a str -> an int >= {lowest}")
    return dict(vocabulary)


class CharacterVocabulary:
    """Words to character ids through a vocabulary of Unicode characters, as ELMoForManyLangs models read them.

    * a word is cut to its first 48 characters (code points, not bytes); the word vocabulary looks up the cut
      word too;
    * its row is `[<bow>, char_1, ..., char_n, <eow>, <pad>, ...]`, a character missing from the vocabulary
      being `<oov>`; the sentence-boundary words (`<bos>`, `<eos>` by default) are `[<bow>, <bos>, <eow>, <pad>,
      ...]` and `[<bow>, <eos>, <eow>, <pad>, ...]`;
    * `chars` ids are the ids of `input_ids`: all >= 1, since 0 stays the padding word;
    * with `words`, `word_ids` gives each word's id (`<oov>`'s if absent); padding positions get `<pad>`'s.
    """

    def __init__(
        self,
        chars: Mapping[str, int],
        words: Mapping[str, int] | None = None,
        bos_token: str = VOCAB_BOS_TOKEN,
        eos_token: str = VOCAB_EOS_TOKEN,
    ):
        required = (VOCAB_BEGINNING_OF_WORD, VOCAB_END_OF_WORD, VOCAB_PADDING, VOCAB_UNKNOWN, bos_token, eos_token)
        self.chars = _check_ids(chars, "the character vocabulary", required, lowest=1)
        self.words = None
        if words is not None:
            required = (VOCAB_PADDING, VOCAB_UNKNOWN, bos_token, eos_token)
            self.words = _check_ids(words, "the word vocabulary", required, lowest=0)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.size = max(self.chars.values()) + 1
        self._unknown = self.chars[VOCAB_UNKNOWN]
        self._template = np.full(MAX_WORD_LENGTH, self.chars[VOCAB_PADDING], dtype=np.int64)
        self._template[0] = self.chars[VOCAB_BEGINNING_OF_WORD]
        self._characters = {index: char for char, index in self.chars.items() if len(char) == 1}
        self.boundary_rows = tuple(self.rows([bos_token, eos_token]))

    def rows(self, words: Sequence[str]) -> np.ndarray:
        """`(n, 50)` int64 character ids of `n` words."""
        rows = np.tile(self._template, (len(words), 1))
        end_of_word = self.chars[VOCAB_END_OF_WORD]
        for row, word in zip(rows, words):
            if not isinstance(word, str):
                raise TypeError(f"Every word must be a str, got {type(word).__name__}: {word!r:.60}")
            if word in (self.bos_token, self.eos_token):
                ids = [self.chars[word]]
            else:
                ids = [self.chars.get(char, self._unknown) for char in word[:MAX_WORD_BYTES]]
            row[1 : len(ids) + 1] = ids
            row[len(ids) + 1] = end_of_word
        return rows

    def word_ids(self, words: Sequence[str]) -> np.ndarray:
        """`(n,)` int64 word ids."""
        unknown = self.words[VOCAB_UNKNOWN]
        return np.array([self.words.get(word[:MAX_WORD_BYTES], unknown) for word in words], dtype=np.int64)

    def decode(self, row: np.ndarray) -> str:
        """The word of one row; characters outside the vocabulary read as U+FFFD."""
        for word, boundary in zip((self.bos_token, self.eos_token), self.boundary_rows):
            if np.array_equal(row, boundary):
                return word
        end = np.flatnonzero(row == self.chars[VOCAB_END_OF_WORD])
        content = row[1 : end[0] if end.size else len(row)]
        return "".join(self._characters.get(int(index), "\ufffd") for index in content)


# --- word splitting -------------------------------------------------------------------------------

_WORD_CHARS = r"\p{L}\p{M}\p{N}_"
_CLITICS = r"(?:s|m|d|ll|re|ve)"
_APOSTROPHE = r"['’]"

PRE_TOKENIZER_PATTERN = "|".join(
    [
        # sentence-boundary literals stay whole (they map to the boundary rows)
        r"</?S>",
        # dotted abbreviations: U.S., e.g., U.S.A.
        r"(?:\p{L}\.){2,}",
        # numbers with inner separators: 3.14, 1,000, 10:30, 1/2
        r"\p{N}+(?:[.,:/]\p{N}+)+",
        # the stem before n't: do|n't, ca|n't, wo|n't
        rf"[{_WORD_CHARS}]+?(?=(?i:n{_APOSTROPHE}t)(?![{_WORD_CHARS}]))",
        rf"(?i:n{_APOSTROPHE}t)(?![{_WORD_CHARS}])",
        # clitics split off their word: 's 'm 'd 'll 're 've
        rf"{_APOSTROPHE}(?i:{_CLITICS})(?![{_WORD_CHARS}])",
        # words, keeping inner hyphens and non-clitic apostrophes: well-known, O'Neill, rock'n'roll
        rf"[{_WORD_CHARS}]+(?:(?:{_APOSTROPHE}(?!(?i:{_CLITICS})(?![{_WORD_CHARS}]))|-)[{_WORD_CHARS}]+)*",
        # ellipses and dashes
        r"\.{2,}|-{2,}",
        # any other character (punctuation, symbols, emoji) on its own
        rf"[^{_WORD_CHARS}\s]",
    ]
)
"""Regex of one word for the `Split` pre-tokenizer (Oniguruma syntax, alternatives tried in order).

It approximates the Penn-Treebank tokenisation of the 1B Word Benchmark that ELMo was trained on:
`don't -> do n't`, `can't -> ca n't`, `It's -> It 's`, `we're -> we 're`, `I'll / I've / I'd / I'm`
split before the apostrophe, punctuation and symbols split off one character at a time (except
`...` and `--`), while dotted abbreviations (`U.S.`, `e.g.`), numbers such as `3.14` / `1,000` /
`10:30`, hyphenated words and non-clitic apostrophes (`O'Neill`) stay whole. Not handled: a period
after a non-dotted abbreviation (`Mr.` -> `Mr .`), `cannot`/`gonna` splitting and PTB quote
rewriting (`"` stays `"`, not `` `` `` / `''`).
"""


def build_pre_tokenizer() -> _pre_tokenizers.PreTokenizer:
    """Whitespace split followed by the PTB-style `Split` on `PRE_TOKENIZER_PATTERN`."""
    return _pre_tokenizers.Sequence(
        [
            _pre_tokenizers.WhitespaceSplit(),
            # "isolated": every match is its own word and nothing is dropped, because the last
            # alternative matches any single non-space character the others leave.
            _pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        ]
    )


# --- outputs --------------------------------------------------------------------------------------


def _is_tensor_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "ndim") and not isinstance(value, (list, tuple))


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor without importing torch
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _infer_word_ids(rows: np.ndarray, boundary_rows=(BOS_WORD_IDS, EOS_WORD_IDS)) -> list[int | None]:
    """Word index per position of a `(T, 50)` id array, from its content alone."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, MAX_WORD_LENGTH)
    bos, eos = boundary_rows
    special = ~np.any(rows > 0, axis=1) | np.all(rows == bos, axis=1) | np.all(rows == eos, axis=1)
    counter = np.cumsum(~special) - 1
    return [None if is_special else int(index) for is_special, index in zip(special.tolist(), counter.tolist())]


class ElmoBatchEncoding(BatchEncoding):
    """`BatchEncoding` that knows which word sits at each position.

    `BatchEncoding.word_ids` needs the Rust encodings of fast tokenizers; ELMo's positions are
    words, so the mapping is fully described by, per sequence, the index of the first kept word,
    the number of kept words and whether a `<S>` row comes first. Without that information (e.g.
    after `ElmoTokenizer.pad`), the mapping is read off the ids: all-zero rows and the boundary
    rows are `None`, every other row is the next word (so a literal `"<S>"` word counts as a
    boundary there).
    """

    def __init__(
        self,
        data: dict[str, Any] | None = None,
        tensor_type: str | TensorType | None = None,
        word_spans: list[tuple[int, int, int]] | None = None,
        batched: bool = True,
        boundary_rows: tuple[np.ndarray, np.ndarray] = (BOS_WORD_IDS, EOS_WORD_IDS),
    ):
        super().__init__(data, encoding=None, tensor_type=tensor_type, n_sequences=1)
        # (first original word index, number of kept words, position of the first word)
        self._word_spans = word_spans
        self._batched = batched
        self._boundary_rows = boundary_rows

    def __getstate__(self):
        state = super().__getstate__()
        state["word_spans"] = self._word_spans
        state["batched"] = self._batched
        state["boundary_rows"] = self._boundary_rows
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._word_spans = state.get("word_spans")
        self._batched = state.get("batched", True)
        self._boundary_rows = state.get("boundary_rows", (BOS_WORD_IDS, EOS_WORD_IDS))

    def _sequence_ids_array(self, batch_index: int) -> Any:
        ids = self.data["input_ids"]
        if self._batched:
            return ids[batch_index]
        if batch_index not in (0, -1):
            raise IndexError(f"This encoding holds a single sequence; batch_index {batch_index} is out of range")
        return ids

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Word index of each position of sequence `batch_index`; `None` for `<S>`, `</S>`, padding.

        Example: `["the", "cat", "sat"]` padded to 6 positions gives `[None, 0, 1, 2, None, None]`.
        """
        sequence = self._sequence_ids_array(batch_index)
        if self._word_spans is None:
            return _infer_word_ids(_to_numpy(sequence), self._boundary_rows)
        first_word, n_words, first_position = self._word_spans[batch_index]
        n_positions = len(sequence)
        words = list(range(first_word, first_word + n_words))
        return [None] * first_position + words + [None] * (n_positions - first_position - n_words)

    def token_to_word(self, batch_or_token_index: int, token_index: int | None = None) -> int | None:
        """Word index at a position (`None` for boundaries and padding)."""
        batch_index, token_index = (
            (0, batch_or_token_index) if token_index is None else (batch_or_token_index, token_index)
        )
        return self.word_ids(batch_index)[token_index]

    def word_to_tokens(
        self, batch_or_word_index: int, word_index: int | None = None, sequence_index: int = 0
    ) -> TokenSpan | None:
        """Position span `(start, end)` of a word (always one position), or `None` if it was truncated."""
        batch_index, word_index = (0, batch_or_word_index) if word_index is None else (batch_or_word_index, word_index)
        try:
            position = self.word_ids(batch_index).index(word_index)
        except ValueError:
            return None
        return TokenSpan(position, position + 1)


# --- word vocabulary (targets of the language-model softmax) ---------------------------------------

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
    path = os.fspath(path)
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write("".join(word + "\n" for word in words))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return path


# --- tokenizer ------------------------------------------------------------------------------------


def _pseudo_vocabulary() -> dict[str, int]:
    # One entry per character id, so that len(tokenizer) == vocab_size == 262 == the number of
    # character-embedding rows; words themselves have no single id.
    vocab = {PAD_TOKEN: PADDING_WORD_ID}
    vocab.update({f"<0x{byte:02X}>": byte + CHARACTER_ID_OFFSET for byte in range(256)})
    vocab.update(
        {
            BOS_TOKEN: BEGINNING_OF_SENTENCE_CHARACTER,
            EOS_TOKEN: END_OF_SENTENCE_CHARACTER,
            "<bow>": BEGINNING_OF_WORD_CHARACTER,
            "<eow>": END_OF_WORD_CHARACTER,
            "<char_pad>": PADDING_CHARACTER,
        }
    )
    return vocab


_VOCAB = _pseudo_vocabulary()
_IDS_TO_TOKENS = {index: token for token, index in _VOCAB.items()}


def _nesting_depth(value: Any) -> int:
    """Depth of a nested list / array (0 for a scalar); looks at first elements only."""
    depth = 0
    while True:
        if _is_tensor_like(value):
            return depth + value.ndim
        if isinstance(value, (list, tuple)):
            depth += 1
            # Skip empty entries (e.g. an example with no positions) to see the real depth.
            filled = next((v for v in value if not (isinstance(v, (list, tuple)) and len(v) == 0)), None)
            if filled is None:
                return depth + (1 if value else 0)
            value = filled
            continue
        return depth


class ElmoTokenizer(PreTrainedTokenizer):
    """Tokenizer producing ELMo character ids.

    Call it like any tokenizer; the outputs are:

    * `input_ids`: `(B, T + 2, 50)` int64 (`T` = most words in a sentence of the batch) with the
      `<S>` row first and the `</S>` row after the last word (`add_special_tokens=False`: `(B, T,
      50)` and no boundaries); padding positions are rows of zeros.
    * `attention_mask`: `(B, T + 2)`, 1 for words and boundaries, 0 for padding.

    Pre-split input: `tok([["The", "cat"], ["Hi"]], is_split_into_words=True)`; raw strings are
    split into words by `split_words` (see `PRE_TOKENIZER_PATTERN`). A single sequence gives
    unbatched lists (`(T + 2, 50)`), or `(1, T + 2, 50)` tensors when `return_tensors` is set.
    `max_length` counts positions including the two boundaries; truncation keeps `</S>`. Only
    right padding exists (the model finds sentence ends from the mask).

    `get_vocab()` is a pseudo-vocabulary of the 262 character ids (`<pad>` = 0, bytes `<0x00>`..
    `<0xFF>` = 1..256, `<S>` = 257, `</S>` = 258, `<bow>`, `<eow>`, `<char_pad>` = 259..261); it
    exists so that the generic special-token machinery works (`pad_token_id == 0`).

    Character-vocabulary mode (ELMoForManyLangs models): `ElmoTokenizer(char_vocab={...}, input_word_vocab={...})`
    (or the `char_vocab.json` / `input_word_vocab.json` files it saves) maps characters through the vocabulary as
    `CharacterVocabulary` describes; the boundary words are then `<bos>` / `<eos>`, and with a word vocabulary
    the output also has `input_word_ids` `(B, T + 2)`.
    """

    vocab_files_names: dict[str, str] = {
        "char_vocab_file": "char_vocab.json",
        "input_word_vocab_file": "input_word_vocab.json",
        "word_vocab_file": WORD_VOCABULARY_FILE,
    }
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str = PAD_TOKEN,
        char_vocab_file: str | None = None,
        input_word_vocab_file: str | None = None,
        char_vocab: Mapping[str, int] | None = None,
        input_word_vocab: Mapping[str, int] | None = None,
        word_vocab_file: str | None = None,
        **kwargs,
    ):
        if kwargs.get("padding_side", "right") != "right":
            raise ValueError(self._padding_side_error(kwargs["padding_side"]))
        self.pre_tokenizer = build_pre_tokenizer()
        char_vocab = self._read_vocabulary(char_vocab_file) if char_vocab_file else char_vocab
        input_word_vocab = self._read_vocabulary(input_word_vocab_file) if input_word_vocab_file else input_word_vocab
        if input_word_vocab is not None and char_vocab is None:
            raise ValueError("input_word_vocab needs a char_vocab: word ids go with the ELMoForManyLangs character ids")
        self.char_vocabulary = None
        self._vocab, self._ids_to_tokens = _VOCAB, _IDS_TO_TOKENS
        if char_vocab is not None:  # str(): a reloaded tokenizer gets AddedToken objects
            bos_token, eos_token = str(bos_token or VOCAB_BOS_TOKEN), str(eos_token or VOCAB_EOS_TOKEN)
            self.char_vocabulary = CharacterVocabulary(char_vocab, input_word_vocab, bos_token, eos_token)
            self._vocab = {token: index for token, index in self.char_vocabulary.chars.items() if token != pad_token}
            self._vocab[pad_token] = PADDING_WORD_ID
            self._ids_to_tokens = {index: token for token, index in self._vocab.items()}
            if input_word_vocab is not None:
                self.model_input_names = [*self.model_input_names, "input_word_ids"]
        bos_token, eos_token = bos_token or BOS_TOKEN, eos_token or EOS_TOKEN
        self._word_index: dict[str, int] | None = None
        if word_vocab_file is not None:
            self.set_word_vocabulary(read_word_vocabulary(word_vocab_file))
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, **kwargs)
        if self.pad_token_id != PADDING_WORD_ID:
            raise ValueError(f"ElmoTokenizer needs a pad token with id 0, got {self.pad_token!r}")

    # The base class assigns `padding_side` in __init__ and users may set it later; left padding
    # would break the model's "length = number of real positions" assumption.
    @property
    def padding_side(self) -> str:
        return "right"

    @padding_side.setter
    def padding_side(self, value: str) -> None:
        if value != "right":
            raise ValueError(self._padding_side_error(value))

    @staticmethod
    def _padding_side_error(value: Any) -> str:
        return (
            f"ElmoTokenizer only supports padding_side='right' (got {value!r}): ELMo's biLM reads the "
            "sentence length from the number of leading real positions."
        )

    # --- pickling: the Rust pre-tokenizer is rebuilt instead of serialised --------------------------

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("pre_tokenizer", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__["pre_tokenizer"] = build_pre_tokenizer()

    def __deepcopy__(self, memo):
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        clone.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return clone

    # --- vocabulary ---------------------------------------------------------------------------------

    @staticmethod
    def _read_vocabulary(path: str) -> dict[str, int]:
        try:
            with open(path, encoding="utf-8") as file:
                return json.load(file)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: cannot read the vocabulary ({error})") from None

    @property
    def vocab_size(self) -> int:
        """Number of character ids (rows of the character embedding): 262, or the vocabulary's size + 1."""
        return self.char_vocabulary.size if self.char_vocabulary else NUM_CHARACTER_IDS

    def get_vocab(self) -> dict[str, int]:
        vocab = dict(self._vocab)
        vocab.update(getattr(self, "_added_tokens_encoder", {}))
        return vocab

    def _convert_token_to_id(self, token: str) -> int | None:
        # Words have no single id (they are rows of character ids); like fast tokenizers without
        # an unk token, unknown tokens give None.
        return self._vocab.get(token)

    def _convert_id_to_token(self, index: int) -> str:
        token = self._ids_to_tokens.get(int(index))
        if token is None:
            raise ValueError(f"Id {index} is outside ElmoTokenizer's pseudo-vocabulary [0, {self.vocab_size - 1}]")
        return token

    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """Ids to pseudo-vocabulary tokens; a `(T, 50)` id array gives its T words instead.

        An int (or a 1-D list of ints) is looked up in the pseudo-vocabulary. Rows of 50 ids are
        decoded to their word strings, with `<S>`, `</S>` and `<pad>` for boundary and padding
        rows (dropped when `skip_special_tokens`).
        """
        if isinstance(ids, (int, np.integer)) or (_is_tensor_like(ids) and ids.ndim == 0):
            return super().convert_ids_to_tokens(int(ids))
        depth = _nesting_depth(ids)
        if depth <= 1:
            flat = [int(i) for i in _to_numpy(ids).reshape(-1).tolist()]
            return super().convert_ids_to_tokens(flat, skip_special_tokens=skip_special_tokens)
        if depth != 2:
            raise ValueError(f"convert_ids_to_tokens expects ids of one sequence, got {depth}-D input")
        return self._rows_to_words(self._as_rows(ids), skip_special_tokens=skip_special_tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        # UTF-8 byte ids are fixed by the algorithm; only the vocabularies a tokenizer has need files.
        paths = []
        if self._word_index is not None:
            name = f"{filename_prefix}-{WORD_VOCABULARY_FILE}" if filename_prefix else WORD_VOCABULARY_FILE
            paths.append(write_word_vocabulary(self.word_vocabulary, os.path.join(save_directory, name)))
        if self.char_vocabulary is None:
            return tuple(paths)
        vocabularies = {
            "char_vocab_file": self.char_vocabulary.chars,
            "input_word_vocab_file": self.char_vocabulary.words,
        }
        for key, vocabulary in vocabularies.items():
            if vocabulary is not None:
                name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names[key]
                path = os.path.join(save_directory, name)
                with open(path, "w", encoding="utf-8") as file:
                    json.dump(vocabulary, file, ensure_ascii=False, indent=0)
                paths.append(path)
        return tuple(paths)

    @property
    def _boundary_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The `<S>` and `</S>` rows (`<bos>` / `<eos>` with a character vocabulary)."""
        return self.char_vocabulary.boundary_rows if self.char_vocabulary else (BOS_WORD_IDS, EOS_WORD_IDS)

    def _words_to_rows(self, words: Sequence[str]) -> np.ndarray:
        return self.char_vocabulary.rows(words) if self.char_vocabulary else words_to_char_ids(words)

    # --- word vocabulary: targets of the language-model softmax -------------------------------------

    @property
    def word_vocabulary(self) -> list[str] | None:
        """The words of the LM softmax in id order (`<S>`, `</S>`, `<UNK>` first), or `None` if there is none.

        Only `ElmoForBiLM` needs it: the model's input is always the characters of each word.
        """
        return None if self._word_index is None else list(self._word_index)

    def set_word_vocabulary(self, words: Sequence[str] | None) -> None:
        """Attach a word vocabulary (validated by `check_word_vocabulary`); `None` removes it."""
        self._word_index = None if words is None else {w: i for i, w in enumerate(check_word_vocabulary(words))}

    def word_targets(self, words: Sequence[str]) -> np.ndarray:
        """Word ids `(n,)` int64 of `n` words for the LM targets; words outside the vocabulary get `<UNK>`'s id 2.

        The literal words `<S>` and `</S>` get ids 0 and 1.
        """
        if self._word_index is None:
            raise ValueError(
                "This ElmoTokenizer has no word vocabulary: load one with ElmoTokenizer(word_vocab_file=...) or "
                "set_word_vocabulary(words) (see build_word_vocabulary)."
            )
        index = self._word_index
        return np.fromiter((index.get(w, UNK_WORD_INDEX) for w in words), dtype=np.int64, count=len(words))

    # --- word splitting -----------------------------------------------------------------------------

    def split_words(self, text: str) -> list[str]:
        """Split raw text into Penn-Treebank-style words (see `PRE_TOKENIZER_PATTERN`).

        `"I don't think it's raining, is it?"` -> `["I", "do", "n't", "think", "it", "'s",
        "raining", ",", "is", "it", "?"]`. Lone surrogates are dropped first: they cannot reach the
        Rust pre-tokenizer and would vanish from the character ids anyway.
        """
        if not isinstance(text, str):
            raise TypeError(f"split_words expects a str, got {type(text).__name__}")
        try:
            pieces = self.pre_tokenizer.pre_tokenize_str(text)
        except UnicodeEncodeError:
            pieces = self.pre_tokenizer.pre_tokenize_str(text.encode("utf-8", "ignore").decode("utf-8"))
        return [piece for piece, _ in pieces]

    def tokenize(self, text: str, **kwargs) -> list[str]:
        """The words of `text` (`split_words`); added-token splitting does not apply to ELMo."""
        return self.split_words(text)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return self.split_words(text)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    # --- special tokens (row-level versions of the base helpers) -----------------------------------

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        if pair:
            raise ValueError("ElmoTokenizer does not support sequence pairs")
        return 2

    def build_inputs_with_special_tokens(self, token_ids_0: list, token_ids_1: list | None = None) -> list:
        """`[<S> row] + rows + [</S> row]` for a list of 50-id rows."""
        if token_ids_1 is not None:
            raise ValueError("ElmoTokenizer does not support sequence pairs")
        bos, eos = self._boundary_rows
        return [bos.tolist()] + [list(row) for row in token_ids_0] + [eos.tolist()]

    def get_special_tokens_mask(
        self, token_ids_0: list, token_ids_1: list | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        if token_ids_1 is not None:
            raise ValueError("ElmoTokenizer does not support sequence pairs")
        if already_has_special_tokens:
            word_ids = _infer_word_ids(self._as_rows(token_ids_0), self._boundary_rows)
            return [0 if word is not None else 1 for word in word_ids]
        return [1] + [0] * len(token_ids_0) + [1]

    def create_token_type_ids_from_sequences(self, token_ids_0: list, token_ids_1: list | None = None) -> list[int]:
        if token_ids_1 is not None:
            raise ValueError("ElmoTokenizer does not support sequence pairs")
        return [0] * (len(token_ids_0) + 2)

    # --- encoding -----------------------------------------------------------------------------------

    def _collect_sentences(self, text: Any, is_split_into_words: bool) -> tuple[list[list[str]], bool]:
        """Normalise the user's input to a list of word lists and say whether it was a batch."""

        def check_words(words: Any, where: str) -> list[str]:
            for index, word in enumerate(words):
                if not isinstance(word, str):
                    kind = "a nested list" if isinstance(word, (list, tuple)) else type(word).__name__
                    raise TypeError(
                        f"{where}: word {index} is {kind} ({word!r:.60}), expected str. With "
                        "is_split_into_words=True pass a list of words or a list of lists of words."
                    )
            return list(words)

        if is_split_into_words:
            if isinstance(text, str):
                raise ValueError(
                    "is_split_into_words=True expects a list of words (or a list of such lists), got a str; "
                    "pass raw text with is_split_into_words=False"
                )
            if not isinstance(text, (list, tuple)):
                raise TypeError(f"Expected a list of words or a list of word lists, got {type(text).__name__}")
            if text and all(isinstance(sentence, (list, tuple)) for sentence in text):
                return [check_words(sentence, f"sentence {i}") for i, sentence in enumerate(text)], True
            return [check_words(text, "input")], False

        if isinstance(text, str):
            return [self.split_words(text)], False
        if not isinstance(text, (list, tuple)):
            raise TypeError(f"Expected a str or a list of str, got {type(text).__name__}")
        for index, item in enumerate(text):
            if isinstance(item, (list, tuple)):
                raise ValueError(
                    f"Item {index} of the batch is a list: for pre-split words pass is_split_into_words=True "
                    "(ElmoTokenizer does not support sequence pairs)"
                )
            if not isinstance(item, str):
                raise TypeError(f"Item {index} of the batch is {type(item).__name__}, expected str")
        return [self.split_words(item) for item in text], True

    def _encode_plus(
        self,
        text: Any,
        text_pair: Any = None,
        add_special_tokens: bool = True,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        truncation_strategy: TruncationStrategy = TruncationStrategy.DO_NOT_TRUNCATE,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | TensorType | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        verbose: bool = True,
        split_special_tokens: bool = False,
        **kwargs,
    ) -> ElmoBatchEncoding:
        """Encode one sentence or a batch; see the class docstring for the output shapes."""
        if text_pair is not None:
            raise ValueError("ElmoTokenizer does not support sequence pairs (text_pair)")
        if return_overflowing_tokens:
            raise ValueError("ElmoTokenizer does not support return_overflowing_tokens")
        if return_offsets_mapping:
            raise NotImplementedError("ElmoTokenizer does not return offsets; use word_ids() for alignment")
        self._check_padding_side(padding_side)
        sentences, batched = self._collect_sentences(text, is_split_into_words)

        n_special = 2 if add_special_tokens else 0
        first_words = [0] * len(sentences)
        if truncation_strategy != TruncationStrategy.DO_NOT_TRUNCATE and max_length is not None:
            if truncation_strategy == TruncationStrategy.ONLY_SECOND:
                raise ValueError("truncation='only_second' needs sequence pairs, which ElmoTokenizer does not support")
            budget = max_length - n_special
            if budget < 0:
                raise ValueError(
                    f"max_length={max_length} leaves no room for the {n_special} sentence-boundary positions"
                )
            for index, words in enumerate(sentences):
                if len(words) > budget:
                    if self.truncation_side == "left":
                        first_words[index] = len(words) - budget
                        sentences[index] = words[len(words) - budget :]
                    else:
                        sentences[index] = words[:budget]

        word_counts = np.array([len(words) for words in sentences], dtype=np.int64)
        flat_words = [word for words in sentences for word in words]
        lengths = word_counts + n_special
        flat_rows = self._words_to_rows(flat_words)
        input_ids, attention_mask = self._assemble(
            flat_rows, word_counts, add_special_tokens, padding_strategy, max_length, pad_to_multiple_of
        )
        positions = input_ids.shape[1]

        data: dict[str, np.ndarray] = {"input_ids": input_ids}
        if self.char_vocabulary is not None and self.char_vocabulary.words is not None:
            vocabulary = self.char_vocabulary
            data["input_word_ids"] = self._place(
                vocabulary.word_ids(flat_words),
                word_counts,
                positions,
                add_special_tokens,
                vocabulary.words[VOCAB_PADDING],
                vocabulary.word_ids([vocabulary.bos_token, vocabulary.eos_token]),
            )
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        if return_attention_mask:
            data["attention_mask"] = attention_mask
        if return_token_type_ids:
            data["token_type_ids"] = np.zeros_like(attention_mask)
        if return_special_tokens_mask:
            is_word = (np.arange(positions)[None, :] >= (1 if add_special_tokens else 0)) & (
                np.arange(positions)[None, :] < (word_counts + (1 if add_special_tokens else 0))[:, None]
            )
            data["special_tokens_mask"] = (~is_word).astype(np.int64)
        if return_length:
            data["length"] = lengths

        spans = [(first, int(count), 1 if add_special_tokens else 0) for first, count in zip(first_words, word_counts)]
        # Only unpadded output can have rows of different lengths.
        ragged = padding_strategy == PaddingStrategy.DO_NOT_PAD and bool(np.any(lengths != positions))
        return self._finish(data, lengths, ragged, batched, return_tensors, spans)

    def _assemble(
        self,
        flat_rows: np.ndarray,
        word_counts: np.ndarray,
        add_special_tokens: bool,
        padding_strategy: PaddingStrategy,
        max_length: int | None,
        pad_to_multiple_of: int | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scatter the words' rows into a zero `(B, L, 50)` array; returns it and the `(B, L)` mask."""
        n_special = 2 if add_special_tokens else 0
        lengths = word_counts + n_special
        positions = self._target_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        input_ids = self._place(flat_rows, word_counts, positions, add_special_tokens, 0, self._boundary_rows)
        attention_mask = (np.arange(positions)[None, :] < lengths[:, None]).astype(np.int64)
        return input_ids, attention_mask

    @staticmethod
    def _place(
        flat: np.ndarray, word_counts: np.ndarray, positions: int, add_special_tokens: bool, fill: int, boundaries
    ) -> np.ndarray:
        """Scatter per-word values `(n_words, ...)` into `(B, positions, ...)` filled with `fill`, after a first
        boundary value and followed by the second when `add_special_tokens`."""
        batch_size = len(word_counts)
        placed = np.full((batch_size, positions, *flat.shape[1:]), fill, dtype=np.int64)
        if flat.shape[0]:
            sentence_of_word = np.repeat(np.arange(batch_size), word_counts)
            starts = np.cumsum(word_counts) - word_counts
            position_of_word = np.arange(flat.shape[0]) - np.repeat(starts, word_counts)
            placed[sentence_of_word, position_of_word + (1 if add_special_tokens else 0)] = flat
        if add_special_tokens and batch_size:
            placed[:, 0] = boundaries[0]
            placed[np.arange(batch_size), word_counts + 1] = boundaries[1]
        return placed

    def _target_length(
        self,
        lengths: np.ndarray,
        padding_strategy: PaddingStrategy | str | bool,
        max_length: int | None,
        pad_to_multiple_of: int | None,
    ) -> int:
        """Number of positions of the padded batch (for DO_NOT_PAD: the longest, trimmed later)."""
        longest = int(lengths.max()) if len(lengths) else 0
        strategy = PaddingStrategy(padding_strategy)
        if strategy == PaddingStrategy.DO_NOT_PAD:
            return longest
        target = longest
        if strategy == PaddingStrategy.MAX_LENGTH:
            if max_length is None:
                raise ValueError("padding='max_length' needs max_length")
            # Without truncation a longer sequence cannot be shortened; it sets the length instead.
            target = max(max_length, longest)
        if pad_to_multiple_of is not None and target % pad_to_multiple_of:
            target += pad_to_multiple_of - target % pad_to_multiple_of
        return target

    def _finish(
        self,
        data: dict[str, np.ndarray],
        lengths: np.ndarray,
        ragged: bool,
        batched: bool,
        return_tensors: str | TensorType | None,
        spans: list[tuple[int, int, int]] | None,
    ) -> ElmoBatchEncoding:
        """Convert `(B, L, ...)` arrays to the requested output type."""
        sequence_keys = {"input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "input_word_ids"}
        if return_tensors is not None:
            if ragged:
                raise ValueError(
                    "Sequences have different numbers of positions; pass padding=True (or 'max_length') to "
                    "return tensors"
                )
            tensor_type = TensorType(return_tensors)
            if tensor_type == TensorType.PYTORCH:
                import torch

                data = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in data.items()}
            elif tensor_type != TensorType.NUMPY:
                raise ValueError(f"ElmoTokenizer supports return_tensors='pt' or 'np', got {return_tensors!r}")
            return ElmoBatchEncoding(data, word_spans=spans, batched=True, boundary_rows=self._boundary_rows)

        lists: dict[str, Any] = {}
        for key, value in data.items():
            if key in sequence_keys and ragged:
                lists[key] = [row[:length].tolist() for row, length in zip(value, lengths.tolist())]
            else:
                lists[key] = value.tolist()
        if not batched:
            lists = {key: value[0] for key, value in lists.items()}
        return ElmoBatchEncoding(lists, word_spans=spans, batched=batched, boundary_rows=self._boundary_rows)

    def _check_padding_side(self, padding_side: str | None) -> None:
        if padding_side is not None and padding_side != "right":
            raise ValueError(self._padding_side_error(padding_side))

    # --- padding of already encoded examples --------------------------------------------------------

    @staticmethod
    def _as_rows(example: Any, key: str = "input_ids") -> np.ndarray:
        """One example's ids as a `(T, 50)` int64 array."""
        if isinstance(example, (list, tuple)) and len(example) == 0:
            return np.zeros((0, MAX_WORD_LENGTH), dtype=np.int64)
        try:
            rows = _to_numpy(example)
            if rows.dtype == object:
                raise ValueError("ragged rows")
            rows = rows.astype(np.int64, casting="unsafe")
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"`{key}` of an example must be a (positions, {MAX_WORD_LENGTH}) array of character ids: {error}"
            ) from None
        if rows.ndim != 2 or rows.shape[1] != MAX_WORD_LENGTH:
            raise ValueError(
                f"`{key}` of an example must have shape (positions, {MAX_WORD_LENGTH}), got {tuple(rows.shape)}"
            )
        return rows

    def pad(
        self,
        encoded_inputs: Any,
        padding: bool | str | PaddingStrategy = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | TensorType | None = None,
        verbose: bool = True,
    ) -> ElmoBatchEncoding:
        """Pad encoded examples with 3-D `input_ids` (usable as a collate function).

        Accepts a list of per-example dicts (each `input_ids` of shape `(T_i, 50)`, list / numpy /
        torch, with or without `attention_mask`), a dict of such lists, a dict holding one example
        (`(T, 50)`, padded and returned without a batch axis), or an already batched `(B, T, 50)`
        dict. Missing attention masks are derived from the ids (a position is real iff some id is
        > 0). `token_type_ids` and `special_tokens_mask` are padded with 0 and 1; other keys are
        passed through (converted to the tensor type when they are rectangular, else left as lists
        for the caller, e.g. ragged `labels` that `DataCollatorForTokenClassification` pads itself).

        Returns:
            `ElmoBatchEncoding` with `input_ids` `(B, L, 50)` and `attention_mask` `(B, L)` where `L`
            follows `padding` (longest / `max_length`, rounded up to `pad_to_multiple_of`).
        """
        self._check_padding_side(padding_side)
        # A list of per-example dicts is a batch whatever its content looks like.
        from_example_list = isinstance(encoded_inputs, (list, tuple))
        if from_example_list:
            if len(encoded_inputs) == 0:
                raise ValueError("pad() got an empty list of examples")
            if not all(isinstance(example, Mapping) for example in encoded_inputs):
                raise TypeError("pad() expects a list of dicts (one per example) or a dict of features")
            keys = list(encoded_inputs[0].keys())
            encoded_inputs = {key: [example[key] for example in encoded_inputs] for key in keys}
        if not isinstance(encoded_inputs, Mapping):
            raise TypeError(f"pad() expects a dict or a list of dicts, got {type(encoded_inputs).__name__}")
        if "input_ids" not in encoded_inputs:
            raise ValueError(f"pad() needs `input_ids`, got keys {list(encoded_inputs.keys())}")

        input_ids = encoded_inputs["input_ids"]
        depth = _nesting_depth(input_ids)
        if return_tensors is None:
            # Like the base class: tensors in, same kind of tensors out.
            probe = input_ids[0] if isinstance(input_ids, (list, tuple)) and len(input_ids) else input_ids
            if hasattr(probe, "detach"):
                return_tensors = "pt"
            elif isinstance(probe, np.ndarray):
                return_tensors = "np"
        if from_example_list or depth == 3:
            batched = True
            examples = dict(encoded_inputs)
        elif depth == 2:
            batched = False
            examples = {key: [value] for key, value in encoded_inputs.items()}
        else:
            raise ValueError(
                f"`input_ids` must be one example of shape (positions, {MAX_WORD_LENGTH}) or a batch of them, "
                f"got a {depth}-D value"
            )

        padding_strategy, _, max_length, _ = self._get_padding_truncation_strategies(
            padding=padding, max_length=max_length, verbose=verbose
        )
        rows = [self._as_rows(example) for example in examples["input_ids"]]
        batch_size = len(rows)
        for key, value in examples.items():
            per_position = ("attention_mask", "token_type_ids", "special_tokens_mask", "input_word_ids")
            if key in per_position and len(value) != batch_size:
                raise ValueError(f"Feature `{key}` has {len(value)} entries but there are {batch_size} examples")
        lengths = np.array([r.shape[0] for r in rows], dtype=np.int64)
        positions = self._target_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        ragged = padding_strategy == PaddingStrategy.DO_NOT_PAD and bool(np.any(lengths != positions))

        data: dict[str, Any] = {}
        ids = np.zeros((batch_size, positions, MAX_WORD_LENGTH), dtype=np.int64)
        for index, r in enumerate(rows):
            ids[index, : r.shape[0]] = r
        data["input_ids"] = ids

        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        padded_with = {"attention_mask": 0, "token_type_ids": self.pad_token_type_id, "special_tokens_mask": 1}
        if self.char_vocabulary is not None and self.char_vocabulary.words is not None:
            padded_with["input_word_ids"] = self.char_vocabulary.words[VOCAB_PADDING]
        for key, fill in padded_with.items():
            if key == "attention_mask" and not return_attention_mask:
                continue
            if key not in examples:
                if key == "attention_mask":
                    data[key] = np.any(ids > 0, axis=2).astype(np.int64)
                continue
            values = np.full((batch_size, positions), fill, dtype=np.int64)
            for index, value in enumerate(examples[key]):
                value = _to_numpy(value).astype(np.int64).reshape(-1)
                if value.shape[0] != lengths[index]:
                    raise ValueError(
                        f"`{key}` of example {index} has {value.shape[0]} entries but its input_ids have "
                        f"{lengths[index]} positions"
                    )
                values[index, : value.shape[0]] = value
            data[key] = values

        extra = {key: value for key, value in examples.items() if key not in data and key not in padded_with}
        encoding = self._finish(data, lengths, ragged, batched, return_tensors, spans=None)
        for key, value in extra.items():
            encoding[key] = self._convert_extra(value if batched else value[0], return_tensors)
        return encoding

    @staticmethod
    def _convert_extra(value: Any, return_tensors: str | TensorType | None) -> Any:
        if return_tensors is None:
            return value
        try:
            if _is_tensor_like(value):
                array = _to_numpy(value)
            elif isinstance(value, (list, tuple)) and value and all(_is_tensor_like(v) for v in value):
                array = np.stack([_to_numpy(v) for v in value])
            else:
                array = np.asarray(value)
            if array.dtype == object:
                return value
        except (ValueError, TypeError):
            return value
        if TensorType(return_tensors) == TensorType.PYTORCH:
            import torch

            return torch.from_numpy(np.ascontiguousarray(array))
        return array

    def _pad(
        self,
        encoded_inputs: dict[str, Any],
        max_length: int | None = None,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """Pad one example (`input_ids` `(T, 50)`) with zero rows; returns python lists."""
        encoding = self.pad(
            dict(encoded_inputs),
            padding=padding_strategy,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_attention_mask=return_attention_mask,
        )
        return {
            key: (_to_numpy(value).tolist() if _is_tensor_like(value) else value) for key, value in encoding.items()
        }

    # --- decoding -----------------------------------------------------------------------------------

    def _rows_to_words(self, rows: np.ndarray, skip_special_tokens: bool) -> list[str]:
        words = []
        for row in rows:
            if not row.any():
                if not skip_special_tokens:
                    words.append(self.pad_token)
                continue
            word = self.char_vocabulary.decode(row) if self.char_vocabulary else char_ids_to_word(row)
            if skip_special_tokens and any(np.array_equal(row, boundary) for boundary in self._boundary_rows):
                continue
            words.append(word)
        return words

    def decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs,
    ) -> str | list[str]:
        """Character ids back to space-joined words.

        Args:
            token_ids: `(T, 50)` ids of one sentence (list, numpy or torch) -> `str`; `(B, T, 50)`
                (or a list of `(T_i, 50)`) -> `list[str]`; a single `(50,)` row -> that word; an int
                -> its pseudo-vocabulary token.
            skip_special_tokens: drop `<S>`, `</S>` and padding rows (otherwise written as `<S>`,
                `</S>`, `<pad>`).
            clean_up_tokenization_spaces: undo the PTB spacing (`do n't` -> `don't`, `it .` -> `it.`).
        """
        if isinstance(token_ids, (int, np.integer)) or (_is_tensor_like(token_ids) and token_ids.ndim == 0):
            return self.convert_ids_to_tokens(int(token_ids))
        depth = _nesting_depth(token_ids)
        if depth == 3:
            return [
                self.decode(sentence, skip_special_tokens, clean_up_tokenization_spaces, **kwargs)
                for sentence in token_ids
            ]
        if depth == 1:
            if len(token_ids) == 0:
                return ""
            token_ids = _to_numpy(token_ids).reshape(1, -1)
        elif depth != 2:
            raise ValueError(f"decode expects (positions, {MAX_WORD_LENGTH}) character ids, got {depth}-D input")
        return self._decode(token_ids, skip_special_tokens, clean_up_tokenization_spaces)

    def _decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs,
    ) -> str:
        rows = self._as_rows(token_ids)
        text = " ".join(self._rows_to_words(rows, skip_special_tokens))
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def batch_decode(
        self,
        sequences: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs,
    ) -> list[str]:
        """Decode `(B, T, 50)` ids (or a list of `(T_i, 50)`) to `B` strings."""
        if _nesting_depth(sequences) == 2:
            sequences = [sequences]
        return [self.decode(seq, skip_special_tokens, clean_up_tokenization_spaces, **kwargs) for seq in sequences]
