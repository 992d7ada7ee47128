"""ELMo's input layout: every position of a sentence is a row of 50 character ids.

Two mappings turn a word into a row; both give `[begin-of-word, char_1, ..., char_n, end-of-word, padding-char, ...]`
and keep id 0 free, so that an all-zero row is a padding position:

* **UTF-8 bytes** (bilm-tf / AllenNLP, `words_to_char_ids`): the word's UTF-8 bytes with errors ignored (lone
  surrogates vanish), cut to the first 48 bytes (a cut may split a multi-byte character; the partial bytes are
  kept), each byte `b` -> `b + 1`; the specials are 257 (`<S>` character), 258 (`</S>`), 259 (begin of word), 260
  (end of word), 261 (padding character). The sentence boundaries are whole rows (`BOS_WORD_IDS`, `EOS_WORD_IDS`),
  which a word that is literally `<S>` or `</S>` also gets.
* **A character vocabulary** (ELMoForManyLangs models, `CharacterVocabulary`): ids of Unicode characters from the
  model's `char.dic`, the first 48 characters of a word.

Both have the same interface (`rows`, `decode`, `boundary_rows`, `size`, `bos_token`, `eos_token`, `words`).
`pad_rows` is the one padding function of the package: the tokenizer, the collators and the layer cache use it.
This module depends on NumPy only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MAX_WORD_LENGTH = 50
"""Slots per word row (hard-coded in AllenNLP's mapper and bilm-tf)."""
MAX_CHARACTERS_PER_TOKEN = 1000
"""Stated limit on the slots per row a tokenizer or a configuration may ask for, checked before any row is laid out
(twenty times the released models' width)."""
MAX_WORD_BYTES = MAX_WORD_LENGTH - 2
"""Characters (UTF-8 bytes or code points) kept per word: the row also holds begin-of-word and end-of-word."""

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


CHARACTER_TOKENS = {
    PAD_TOKEN: PADDING_WORD_ID,
    **{f"<0x{byte:02X}>": byte + CHARACTER_ID_OFFSET for byte in range(256)},
    BOS_TOKEN: BEGINNING_OF_SENTENCE_CHARACTER,
    EOS_TOKEN: END_OF_SENTENCE_CHARACTER,
    "<bow>": BEGINNING_OF_WORD_CHARACTER,
    "<eow>": END_OF_WORD_CHARACTER,
    "<char_pad>": PADDING_CHARACTER,
}
"""A name for each of the 262 ids: the tokenizer's pseudo-vocabulary (words have no single id)."""


def byte_id(byte: int) -> int:
    """The id of a UTF-8 byte in a row."""
    return byte + CHARACTER_ID_OFFSET


def boundary_rows(width: int = MAX_WORD_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """The `<S>` and `</S>` rows of `width` slots: `[259, 257 or 258, 260, 261, ..., 261]`."""
    rows = np.full((2, width), PADDING_CHARACTER, dtype=np.int64)
    rows[:, :3] = [
        (BEGINNING_OF_WORD_CHARACTER, character, END_OF_WORD_CHARACTER)
        for character in (BEGINNING_OF_SENTENCE_CHARACTER, END_OF_SENTENCE_CHARACTER)
    ]
    rows.setflags(write=False)
    return rows[0], rows[1]


BOS_WORD_IDS, EOS_WORD_IDS = boundary_rows()
"""Rows of the `<S>` and `</S>` positions: `[259, 257, 260, 261, ..., 261]` and `[259, 258, 260, 261, ..., 261]`."""
PADDING_WORD_IDS = np.zeros(MAX_WORD_LENGTH, dtype=np.int64)
PADDING_WORD_IDS.setflags(write=False)


def _encode_words(words: Sequence[str], max_bytes: int = MAX_WORD_BYTES) -> list[bytes]:
    try:
        # `str.encode` (not `word.encode`) so that e.g. a bytes object fails instead of passing through.
        return [str.encode(word, "utf-8", "ignore")[:max_bytes] for word in words]
    except TypeError as error:
        for index, word in enumerate(words):
            if not isinstance(word, str):
                raise TypeError(
                    f"Every word must be a str, but word {index} is {type(word).__name__}: {word!r:.60}"
                ) from None
        raise error


@functools.cache
def _key_weights(width: int) -> tuple[int, ...]:
    """Powers of an odd 64-bit constant modulo 2^64, as signed int64 values."""
    powers = [pow(0x9E3779B97F4A7C15, k + 1, 1 << 64) for k in range(width)]
    return tuple(p - (1 << 64) if p >= 1 << 63 else p for p in powers)


def word_keys(rows, lowercase: bool = False):
    """`(..., C)` character ids (a torch tensor) -> `(...)` int64 keys of the words they spell, a polynomial hash
    modulo 2^64 (int64 products and sums wrap). Equal rows get equal keys; different rows rarely share one, so a
    caller that must be exact checks. `lowercase`: ASCII capitals count as their lowercase letters."""
    ids = rows.long()
    if lowercase:
        upper = (ids >= byte_id(ord("A"))) & (ids <= byte_id(ord("Z")))
        ids = ids + 32 * upper
    return (ids * ids.new_tensor(_key_weights(ids.shape[-1]))).sum(dim=-1)


def words_to_char_ids(words: Sequence[str], width: int = MAX_WORD_LENGTH) -> np.ndarray:
    """Map words to ELMo character-id rows.

    Args:
        words: sequence of `n` strings (any unicode, including the empty string).
        width: slots per row (`max_characters_per_token`; 50 for every released model, bilm-tf's own tests train
            with 10): a word keeps its first `width - 2` bytes.

    Returns:
        `np.ndarray` of shape `(n, width)` and dtype int64, values in `[1, 261]`: one row per word laid
        out as `[259, byte_1 + 1, ..., byte_k + 1, 260, 261, ...]` with `k = min(width - 2, len(utf8))`,
        or the `<S>` / `</S>` boundary rows for the literal words `"<S>"` / `"</S>"`.
    """
    if isinstance(words, (str, bytes)):
        raise TypeError(f"words_to_char_ids expects a sequence of words, not a single {type(words).__name__}")
    encoded = _encode_words(words, width - 2)
    n_words = len(encoded)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n_words)
    ids = np.full((n_words, width), PADDING_CHARACTER, dtype=np.int64)
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

    # Literal "<S>"/"</S>" words become the boundary rows (AllenNLP and bilm-tf do the same).
    bos, eos = boundary_rows(width)
    ids[[word == BOS_TOKEN for word in words]] = bos
    ids[[word == EOS_TOKEN for word in words]] = eos
    return ids


def char_ids_to_word(row: Sequence[int] | np.ndarray) -> str:
    """Recover the text of one word row (`(50,)` ids); invalid UTF-8 is replaced by U+FFFD.

    The boundary rows give `"<S>"` / `"</S>"` and an all-zero padding row gives `""`.
    """
    row = np.asarray(row, dtype=np.int64).reshape(-1)
    bos, eos = boundary_rows(row.size) if row.size >= 3 else (None, None)
    if np.array_equal(row, bos):
        return BOS_TOKEN
    if np.array_equal(row, eos):
        return EOS_TOKEN
    end = np.flatnonzero(row == END_OF_WORD_CHARACTER)
    content = row[: end[0] if end.size else row.size]
    content = content[(content >= 1) & (content <= 256)] - CHARACTER_ID_OFFSET
    return content.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class Utf8Bytes:
    """The UTF-8 byte mapping behind the interface both mappings share (see the module docstring), with rows of
    `width` slots."""

    bos_token, eos_token = BOS_TOKEN, EOS_TOKEN
    size = NUM_CHARACTER_IDS
    words = None  # no word ids
    decode = staticmethod(char_ids_to_word)

    def __init__(self, width: int = MAX_WORD_LENGTH):
        if not isinstance(width, int) or width < 3:
            raise ValueError(
                f"max_characters_per_token must be an int >= 3 (begin of word, a character, end of word), got {width!r}"
            )
        if width > MAX_CHARACTERS_PER_TOKEN:
            raise ValueError(
                f"max_characters_per_token is {width:,}, more than the limit of {MAX_CHARACTERS_PER_TOKEN:,} slots per "
                "word"
            )
        self.width = width
        self.boundary_rows = boundary_rows(width)

    def rows(self, words: Sequence[str]) -> np.ndarray:
        """`(n, width)` int64 character ids of `n` words (`words_to_char_ids`)."""
        return words_to_char_ids(words, self.width)


UTF8_BYTES = Utf8Bytes()


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
    * with `words`, `word_ids` gives each word's id (`<oov>`'s if absent); the boundary positions get
      `boundary_word_ids` and padding positions `padding_word_id` (`<pad>`'s).
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
        self.width = MAX_WORD_LENGTH
        self.size = max(self.chars.values()) + 1
        self._unknown = self.chars[VOCAB_UNKNOWN]
        self._template = np.full(MAX_WORD_LENGTH, self.chars[VOCAB_PADDING], dtype=np.int64)
        self._template[0] = self.chars[VOCAB_BEGINNING_OF_WORD]
        self._characters = {index: char for char, index in self.chars.items() if len(char) == 1}
        self.boundary_rows = tuple(self.rows([bos_token, eos_token]))
        if self.words is not None:
            self.boundary_word_ids = tuple(self.word_ids([bos_token, eos_token]))
            self.padding_word_id = self.words[VOCAB_PADDING]

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


# --- batches of rows -------------------------------------------------------------------------------


def to_numpy(value: Any) -> np.ndarray:
    """A list, NumPy array or torch tensor (without importing torch) as a NumPy array."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def is_tensor_like(value: Any) -> bool:
    """Whether `value` is a NumPy array or a tensor (of any library)."""
    return hasattr(value, "shape") and hasattr(value, "ndim") and not isinstance(value, (list, tuple))


def is_scalar_id(value: Any) -> bool:
    """Whether `value` is one id (an int, or a 0-d array / tensor) rather than a sequence of them."""
    return isinstance(value, (int, np.integer)) or (is_tensor_like(value) and value.ndim == 0)


def nesting_depth(value: Any) -> int:
    """Depth of nested lists / arrays / tensors, read from first elements only: 0 for an id, 1 for a row, 2 for a
    sentence `(T, 50)`, 3 for a batch `(B, T, 50)`. Empty entries (a sentence without positions) are skipped."""
    depth = 0
    while True:
        if is_tensor_like(value):
            return depth + value.ndim
        if not isinstance(value, (list, tuple)):
            return depth
        depth += 1
        filled = next((v for v in value if not (isinstance(v, (list, tuple)) and len(v) == 0)), None)
        if filled is None:
            return depth + (1 if value else 0)
        value = filled


def as_rows(example: Any, key: str = "input_ids", width: int = MAX_WORD_LENGTH) -> np.ndarray:
    """One sentence's character ids (list / NumPy / torch) as a `(T, width)` int64 array, or a one-line
    `ValueError`."""
    if isinstance(example, (list, tuple)) and len(example) == 0:
        return np.zeros((0, width), dtype=np.int64)
    try:
        rows = to_numpy(example)
        if rows.dtype == object:
            raise ValueError("ragged rows")
        rows = rows.astype(np.int64, casting="unsafe")
    except (ValueError, TypeError) as error:
        message = f"`{key}` of an example must be a (positions, {width}) array of character ids: {error}"
        raise ValueError(message) from None
    if rows.ndim != 2 or rows.shape[1] != width:
        raise ValueError(f"`{key}` of an example must have shape (positions, {width}), got {tuple(rows.shape)}")
    return rows


def pad_rows(
    sequences: Any,
    positions: int | None = None,
    fill: int | float = 0,
    frame: tuple[Any, Any] | None = None,
    dtype: Any = np.int64,
    lengths: Sequence[int] | None = None,
) -> np.ndarray:
    """Right-pads `B` sequences into one array: the padding function of every batch of ELMo inputs.

    Args:
        sequences: `B` arrays (list / NumPy / torch) `(T_i, ...)` with the same trailing shape: `(T_i, 50)` character
            rows, `(T_i,)` word ids or labels, `(T_i, 2)` LM targets, `(T_i, L + 1, 2P)` cached layers. With
            `lengths`: one array holding the `B` sequences end to end, `lengths[b]` entries each.
        positions: length of the padded axis, at least the longest (framed) sequence; default that longest.
        fill: value of the padding positions (0: the padding row of character ids).
        frame: `(first, last)` entries placed before and after each sequence (e.g. the `<S>` and `</S>` rows).
        dtype: of the result.

    Returns:
        `(B, positions, ...)`: sequence `b` (framed: `first, sequence, last`) at the start of row `b`, `fill` after.
    """
    if lengths is None:
        arrays = [to_numpy(sequence) for sequence in sequences]
        trailing_shape = next((array.shape[1:] for array in arrays if array.ndim > 1), ())
    else:
        flat = to_numpy(sequences)
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        arrays = [flat[end - length : end] for length, end in zip(lengths, ends)]
        trailing_shape = flat.shape[1:]
    first = 1 if frame is not None else 0
    longest = max((len(array) for array in arrays), default=-2 * first) + 2 * first
    if positions is None:
        positions = longest
    elif positions < longest:
        raise ValueError(f"pad_rows: a sequence of {longest} positions does not fit in {positions}")
    padded = np.full((len(arrays), positions, *trailing_shape), fill, dtype=dtype)
    for row, array in zip(padded, arrays):
        row[first : first + len(array)] = array
        if frame is not None:
            row[0], row[len(array) + 1] = frame
    return padded


def word_ids_from_rows(rows: np.ndarray, boundary_rows=(BOS_WORD_IDS, EOS_WORD_IDS)) -> list[int | None]:
    """Word index per position of a `(T, C)` id array, read from its content alone: all-zero rows and the
    boundary rows `(C,)` are `None`, every other row is the next word."""
    bos, eos = boundary_rows
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, len(bos))
    special = ~np.any(rows > 0, axis=1) | np.all(rows == bos, axis=1) | np.all(rows == eos, axis=1)
    counter = np.cumsum(~special) - 1
    return [None if is_special else int(index) for is_special, index in zip(special.tolist(), counter.tolist())]


def rows_to_words(
    characters: Utf8Bytes | CharacterVocabulary,
    rows: np.ndarray,
    pad_token: str = PAD_TOKEN,
    skip_special_tokens: bool = False,
) -> list[str]:
    """The word of each row of `rows` `(T, C)` read by `characters` (either mapping): all-zero rows are `pad_token`,
    boundary rows the boundary words; `skip_special_tokens` drops both."""
    words = []
    for row in rows:
        if not row.any():
            if not skip_special_tokens:
                words.append(pad_token)
            continue
        if skip_special_tokens and any(np.array_equal(row, boundary) for boundary in characters.boundary_rows):
            continue
        words.append(characters.decode(row))
    return words


__all__ = [
    "BOS_WORD_IDS",
    "CharacterVocabulary",
    "EOS_WORD_IDS",
    "MAX_WORD_LENGTH",
    "UTF8_BYTES",
    "Utf8Bytes",
    "boundary_rows",
    "char_ids_to_word",
    "pad_rows",
    "rows_to_words",
    "word_keys",
    "words_to_char_ids",
]
