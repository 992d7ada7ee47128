"""`ElmoTokenizer`: words -> rows of 50 character ids, so ELMo's `input_ids` are 3-D: `(batch, positions, 50)`.

The layout of a row and both ways of filling it (UTF-8 bytes, a character vocabulary) belong to `character_rows`;
raw text is cut into words by `pre_tokenizer`; the language model's word vocabulary (its softmax targets) is
`word_vocabulary`. The base class assumes one id per token: this class overrides what it cannot do for 2-D rows
(encoding a whole batch at once, padding, decoding, the special-token helpers) and nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizer
from transformers.tokenization_utils_base import TruncationStrategy
from transformers.utils import CONFIG_NAME, PaddingStrategy, TensorType, cached_file

from . import character_rows, pre_tokenizer, word_vocabulary
from .batch_encoding_elmo import ElmoBatchEncoding
from .character_rows import (
    BOS_TOKEN,
    CHARACTER_TOKENS,
    EOS_TOKEN,
    MAX_WORD_LENGTH,
    PAD_TOKEN,
    PADDING_WORD_ID,
    UTF8_BYTES,
    Utf8Bytes,
    VOCAB_BOS_TOKEN,
    VOCAB_EOS_TOKEN,
    VOCAB_PADDING,
    CharacterVocabulary,
    as_rows,
    pad_rows,
    to_numpy,
    word_ids_from_rows,
)
from .file_io import write_atomically
from .pre_tokenizer import build_pre_tokenizer, split_words
from .word_vocabulary import (
    UNK_WORD_INDEX,
    WORD_VOCABULARY_FILE,
    check_word_vocabulary,
    read_word_vocabulary,
    write_word_vocabulary,
)


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


def __getattr__(name: str):
    # Names earlier versions defined here: the layout, the splitter and the word vocabulary now have modules of their own.
    for module in (character_rows, pre_tokenizer, word_vocabulary):
        if not name.startswith("_") and hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_tensor_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "ndim") and not isinstance(value, (list, tuple))


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


_IDS_TO_TOKENS = {index: token for token, index in CHARACTER_TOKENS.items()}
_HUB_KEYS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
_PER_POSITION = ("attention_mask", "token_type_ids", "special_tokens_mask", "input_word_ids")


class ElmoTokenizer(PreTrainedTokenizer):
    """Tokenizer producing ELMo character ids.

    Call it like any tokenizer; the outputs are:

    * `input_ids`: `(B, T + 2, 50)` int64 (`T` = most words in a sentence of the batch) with the
      `<S>` row first and the `</S>` row after the last word (`add_special_tokens=False`: `(B, T,
      50)` and no boundaries); padding positions are rows of zeros.
    * `attention_mask`: `(B, T + 2)`, 1 for words and boundaries, 0 for padding.

    Pre-split input: `tok([["The", "cat"], ["Hi"]], is_split_into_words=True)`; raw strings are
    split into words by `split_words` (see `pre_tokenizer.PRE_TOKENIZER_PATTERN`). A single sequence gives
    unbatched lists (`(T + 2, 50)`), or `(1, T + 2, 50)` tensors when `return_tensors` is set.
    `max_length` counts positions including the two boundaries; truncation keeps `</S>`. Only
    right padding exists (the model finds sentence ends from the mask).

    `get_vocab()` is a pseudo-vocabulary of the 262 character ids (`<pad>` = 0, bytes `<0x00>`..
    `<0xFF>` = 1..256, `<S>` = 257, `</S>` = 258, `<bow>`, `<eow>`, `<char_pad>` = 259..261); it
    exists so that the generic special-token machinery works (`pad_token_id == 0`).

    `max_characters_per_token` (default 50, the released models' width) sets the slots of every row: a word keeps
    its first `max_characters_per_token - 2` UTF-8 bytes (bilm-tf's own tests train with 10).

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
        max_characters_per_token: int = MAX_WORD_LENGTH,
        **kwargs,
    ):
        if kwargs.get("padding_side", "right") != "right":
            raise ValueError(self._padding_side_error(kwargs["padding_side"]))
        if not isinstance(max_characters_per_token, int) or max_characters_per_token < 3:
            raise ValueError(
                f"max_characters_per_token must be an int >= 3 (begin of word, a character, end of word), got "
                f"{max_characters_per_token!r}"
            )
        if max_characters_per_token != MAX_WORD_LENGTH and (char_vocab or char_vocab_file):
            raise ValueError(
                f"max_characters_per_token={max_characters_per_token}: a character vocabulary (ELMoForManyLangs) has "
                f"rows of {MAX_WORD_LENGTH}"
            )
        self._utf8_bytes = UTF8_BYTES
        if max_characters_per_token != MAX_WORD_LENGTH:
            self._utf8_bytes = Utf8Bytes(max_characters_per_token)
        self.pre_tokenizer = build_pre_tokenizer()
        char_vocab = self._read_vocabulary(char_vocab_file) if char_vocab_file else char_vocab
        input_word_vocab = self._read_vocabulary(input_word_vocab_file) if input_word_vocab_file else input_word_vocab
        if input_word_vocab is not None and char_vocab is None:
            raise ValueError("input_word_vocab needs a char_vocab: word ids go with the ELMoForManyLangs character ids")
        self.char_vocabulary = None
        self._vocab, self._ids_to_tokens = CHARACTER_TOKENS, _IDS_TO_TOKENS
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
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            pad_token=pad_token,
            max_characters_per_token=max_characters_per_token,
            **kwargs,
        )
        if self.pad_token_id != PADDING_WORD_ID:
            raise ValueError(f"ElmoTokenizer needs a pad token with id 0, got {self.pad_token!r}")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedTokenizer.from_pretrained`, with a file that is not valid JSON named, and refusing a tokenizer
        that reads characters otherwise than the model of the same folder: a `char_vocab.json` dropped into a folder
        of a model that reads UTF-8 bytes (it would switch the tokenizer to it), or one missing where the model reads
        a character vocabulary (config.json's `char_vocabulary`)."""
        hub = {key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
        locate = partial(cached_file, pretrained_model_name_or_path, _raise_exceptions_for_missing_entries=False, **hub)
        try:
            tokenizer = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except json.JSONDecodeError as error:
            for name in ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
                path = locate(name)
                try:
                    if path is not None:
                        json.loads(Path(path).read_text(encoding="utf-8"))
                except (ValueError, OSError):
                    break
            else:
                name = "a JSON file"
            where = f"line {error.lineno}, column {error.colno}"
            message = f"{pretrained_model_name_or_path}: {name} is not valid JSON ({where}: {error.msg})"
            raise ValueError(message) from None
        config_file = locate(CONFIG_NAME)
        if config_file is not None:
            try:
                model_config = json.loads(Path(config_file).read_text(encoding="utf-8"))
                model_reads_vocabulary = model_config.get("char_vocabulary")
            except (ValueError, OSError, AttributeError):
                model_reads_vocabulary = None  # the model's loading reports a damaged config.json
            tokenizer_reads_vocabulary = tokenizer.char_vocabulary is not None
            if model_reads_vocabulary is not None and bool(model_reads_vocabulary) != tokenizer_reads_vocabulary:
                held = "hold" if tokenizer_reads_vocabulary else "lack"
                reads = "a character vocabulary" if model_reads_vocabulary else "UTF-8 bytes"
                raise ValueError(
                    f"{pretrained_model_name_or_path}: the tokenizer files {held} char_vocab.json but the model reads "
                    f"{reads} (config.json char_vocabulary: {str(bool(model_reads_vocabulary)).lower()}): tokenizer "
                    "and model do not belong together"
                )
        return tokenizer

    @property
    def characters(self) -> CharacterVocabulary | Any:
        """The mapping from words to rows: the character vocabulary if there is one, else UTF-8 bytes."""
        return self.char_vocabulary if self.char_vocabulary is not None else self._utf8_bytes

    @property
    def max_characters_per_token(self) -> int:
        """Slots per row (the last axis of `input_ids`)."""
        return self.characters.width

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

    def _check_padding_side(self, padding_side: str | None) -> None:
        if padding_side is not None and padding_side != "right":
            raise ValueError(self._padding_side_error(padding_side))

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
        return self.characters.size

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
            flat = [int(i) for i in to_numpy(ids).reshape(-1).tolist()]
            return super().convert_ids_to_tokens(flat, skip_special_tokens=skip_special_tokens)
        if depth != 2:
            raise ValueError(f"convert_ids_to_tokens expects ids of one sequence, got {depth}-D input")
        return self._rows_to_words(as_rows(ids, width=self.characters.width), skip_special_tokens=skip_special_tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        # UTF-8 byte ids are fixed by the algorithm; only the vocabularies a tokenizer has need files.
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        if self._word_index is not None:
            path = os.path.join(save_directory, prefix + WORD_VOCABULARY_FILE)
            paths.append(write_word_vocabulary(self.word_vocabulary, path))
        if self.char_vocabulary is not None:
            for key, vocabulary in (
                ("char_vocab_file", self.char_vocabulary.chars),
                ("input_word_vocab_file", self.char_vocabulary.words),
            ):
                if vocabulary is not None:
                    path = os.path.join(save_directory, prefix + self.vocab_files_names[key])
                    paths.append(write_atomically(path, json.dumps(vocabulary, ensure_ascii=False, indent=0)))
        return tuple(paths)

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
        """Split raw text into Penn-Treebank-style words (see `pre_tokenizer.PRE_TOKENIZER_PATTERN`).

        `"I don't think it's raining, is it?"` -> `["I", "do", "n't", "think", "it", "'s",
        "raining", ",", "is", "it", "?"]`.
        """
        return split_words(self.pre_tokenizer, text)

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
        bos, eos = self.characters.boundary_rows
        return [bos.tolist()] + [list(row) for row in token_ids_0] + [eos.tolist()]

    def get_special_tokens_mask(
        self, token_ids_0: list, token_ids_1: list | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        if token_ids_1 is not None:
            raise ValueError("ElmoTokenizer does not support sequence pairs")
        if already_has_special_tokens:
            rows = as_rows(token_ids_0, width=self.characters.width)
            word_ids = word_ids_from_rows(rows, self.characters.boundary_rows)
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
        """Encode one sentence or a batch, all words of the batch at once; see the class docstring for the shapes."""
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
        lengths = word_counts + n_special
        positions = self._target_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        flat_words = [word for words in sentences for word in words]
        characters = self.characters
        frame = characters.boundary_rows if add_special_tokens else None
        data = {"input_ids": pad_rows(characters.rows(flat_words), positions, frame=frame, lengths=word_counts)}
        if characters.words is not None:
            boundaries = characters.word_ids([characters.bos_token, characters.eos_token])
            data["input_word_ids"] = pad_rows(
                characters.word_ids(flat_words),
                positions,
                fill=characters.words[VOCAB_PADDING],
                frame=tuple(boundaries) if add_special_tokens else None,
                lengths=word_counts,
            )
        attention_mask = (np.arange(positions)[None, :] < lengths[:, None]).astype(np.int64)
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        if return_attention_mask:
            data["attention_mask"] = attention_mask
        if return_token_type_ids:
            data["token_type_ids"] = np.zeros_like(attention_mask)
        if return_special_tokens_mask:
            first = 1 if add_special_tokens else 0
            is_word = (np.arange(positions)[None, :] >= first) & (
                np.arange(positions)[None, :] < (word_counts + first)[:, None]
            )
            data["special_tokens_mask"] = (~is_word).astype(np.int64)
        if return_length:
            data["length"] = lengths

        spans = [(first, int(count), 1 if add_special_tokens else 0) for first, count in zip(first_words, word_counts)]
        # Only unpadded output can have rows of different lengths.
        ragged = padding_strategy == PaddingStrategy.DO_NOT_PAD and bool(np.any(lengths != positions))
        return self._finish(data, lengths, ragged, batched, return_tensors, spans)

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
        sequence_keys = {"input_ids", *_PER_POSITION}
        boundary_rows = self.characters.boundary_rows
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
            return ElmoBatchEncoding(data, word_spans=spans, batched=True, boundary_rows=boundary_rows)

        lists: dict[str, Any] = {}
        for key, value in data.items():
            if key in sequence_keys and ragged:
                lists[key] = [row[:length].tolist() for row, length in zip(value, lengths.tolist())]
            else:
                lists[key] = value.tolist()
        if not batched:
            lists = {key: value[0] for key, value in lists.items()}
        return ElmoBatchEncoding(lists, word_spans=spans, batched=batched, boundary_rows=boundary_rows)

    # --- padding of already encoded examples --------------------------------------------------------

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

        Accepts a list of per-example dicts (each `input_ids` of shape `(T, 50)`, list / numpy /
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
                f"`input_ids` must be one example of shape (positions, {self.characters.width}) or a batch of them, "
                f"got a {depth}-D value"
            )

        padding_strategy, _, max_length, _ = self._get_padding_truncation_strategies(
            padding=padding, max_length=max_length, verbose=verbose
        )
        rows = [as_rows(example, width=self.characters.width) for example in examples["input_ids"]]
        batch_size = len(rows)
        for key, value in examples.items():
            if key in _PER_POSITION and len(value) != batch_size:
                raise ValueError(f"Feature `{key}` has {len(value)} entries but there are {batch_size} examples")
        lengths = np.array([r.shape[0] for r in rows], dtype=np.int64)
        positions = self._target_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        ragged = padding_strategy == PaddingStrategy.DO_NOT_PAD and bool(np.any(lengths != positions))
        data: dict[str, Any] = {"input_ids": pad_rows(rows, positions)}

        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        padded_with = {"attention_mask": 0, "token_type_ids": self.pad_token_type_id, "special_tokens_mask": 1}
        if self.characters.words is not None:
            padded_with["input_word_ids"] = self.characters.words[VOCAB_PADDING]
        for key, fill in padded_with.items():
            if key == "attention_mask" and not return_attention_mask:
                continue
            if key not in examples:
                if key == "attention_mask":
                    data[key] = np.any(data["input_ids"] > 0, axis=2).astype(np.int64)
                continue
            values = [to_numpy(value).astype(np.int64).reshape(-1) for value in examples[key]]
            for index, value in enumerate(values):
                if value.shape[0] != lengths[index]:
                    raise ValueError(
                        f"`{key}` of example {index} has {value.shape[0]} entries but its input_ids have "
                        f"{lengths[index]} positions"
                    )
            data[key] = pad_rows(values, positions, fill)

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
                array = to_numpy(value)
            elif isinstance(value, (list, tuple)) and value and all(_is_tensor_like(v) for v in value):
                array = np.stack([to_numpy(v) for v in value])
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

    # --- decoding -----------------------------------------------------------------------------------

    def _rows_to_words(self, rows: np.ndarray, skip_special_tokens: bool) -> list[str]:
        boundary_rows = self.characters.boundary_rows
        words = []
        for row in rows:
            if not row.any():
                if not skip_special_tokens:
                    words.append(self.pad_token)
                continue
            if skip_special_tokens and any(np.array_equal(row, boundary) for boundary in boundary_rows):
                continue
            words.append(self.characters.decode(row))
        return words

    def decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs,
    ) -> str | list[str]:
        """Character ids back to space-joined words (`batch_decode` comes from the base class).

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
            token_ids = to_numpy(token_ids).reshape(1, -1)
        elif depth != 2:
            raise ValueError(f"decode expects (positions, {self.characters.width}) character ids, got {depth}-D input")
        return self._decode(token_ids, skip_special_tokens, clean_up_tokenization_spaces)

    def _decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs,
    ) -> str:
        text = " ".join(self._rows_to_words(as_rows(token_ids, width=self.characters.width), skip_special_tokens))
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text
