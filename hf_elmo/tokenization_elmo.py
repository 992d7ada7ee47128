"""`ElmoTokenizer`: words -> rows of 50 character ids, so ELMo's `input_ids` are 3-D: `(batch, positions, 50)`.

The layout of a row, both ways of filling it (UTF-8 bytes, a character vocabulary) and reading it back belong to
`character_rows`; raw text is cut into words by `pre_tokenizer`; the language model's word vocabulary (its softmax
targets) is `word_vocabulary`; what `pad` is given and the output types are `batch_encoding_elmo`'s; the checks of a
folder the tokenizer is loaded from are `model_io`'s. The base class assumes one id per token: this class overrides
what it cannot do for 2-D rows (encoding a whole batch at once, padding, decoding, the special-token helpers) and
nothing else.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizer
from transformers.tokenization_utils_base import TruncationStrategy
from transformers.utils import PaddingStrategy, TensorType

from .batch_encoding_elmo import (
    PAIR_PREFIX,
    PER_POSITION_FEATURES,
    ElmoBatchEncoding,
    collect_examples,
    padded_length,
    per_position_values,
    split_pairs,
)
from .character_rows import (
    BOS_TOKEN,
    CHARACTER_TOKENS,
    EOS_TOKEN,
    MAX_WORD_LENGTH,
    PAD_TOKEN,
    PADDING_WORD_ID,
    VOCAB_BOS_TOKEN,
    VOCAB_EOS_TOKEN,
    CharacterVocabulary,
    Utf8Bytes,
    as_rows,
    is_scalar_id,
    nesting_depth,
    pad_rows,
    rows_to_words,
    to_numpy,
    word_ids_from_rows,
)
from .folder_files import write_atomically
from .pre_tokenizer import build_pre_tokenizer, collect_sentences, split_batch_of_pairs, split_words
from .pretrained_elmo import load_tokenizer
from .word_vocabulary import WORD_VOCABULARY_FILE, WordVocabulary, read_word_vocabulary, write_word_vocabulary

__all__ = ["ElmoTokenizer"]

_IDS_TO_TOKENS = {index: token for token, index in CHARACTER_TOKENS.items()}
_NO_PAIRS = "ElmoTokenizer does not support sequence pairs"


@functools.lru_cache(maxsize=8)
def _added_words_pattern(tokens: tuple[str, ...]) -> re.Pattern:
    # Longest first: of two added tokens starting at one place, the longer is the word.
    return re.compile("(" + "|".join(re.escape(token) for token in sorted(tokens, key=len, reverse=True)) + ")")


def _padding_side_error(value: Any) -> str:
    return (
        f"ElmoTokenizer only supports padding_side='right' (got {value!r}): ELMo's biLM reads the "
        "sentence length from the number of leading real positions."
    )


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

    Sentence pairs (`tok(premise, hypothesis)`, `tok(text=..., text_pair=...)`, single or batched, raw or pre-split,
    or as BERT's batch of pairs `tok([(premise, hypothesis), ...])`, pre-split a tuple of two word lists)
    follow ELMo, not BERT: each side is a sentence of its own, with its own `<S>`/`</S>` and padding and no separator.
    The first sides give `input_ids`, `attention_mask`, the second `pair_input_ids`, `pair_attention_mask` (and
    `pair_input_word_ids`), with their word indices from `pair_word_ids()`; `pad` pads each side on its own. Nothing is
    truncated unless asked; a truncation strategy applies `max_length` to each side it names (`longest_first`: both).

    Character-vocabulary mode (ELMoForManyLangs models): `ElmoTokenizer(char_vocab={...}, input_word_vocab={...})`
    (or the `char_vocab.json` / `input_word_vocab.json` files it saves) maps characters through the vocabulary as
    `CharacterVocabulary` describes; the boundary words are then `<bos>` / `<eos>`, and with a word vocabulary
    the output also has `input_word_ids` `(B, T + 2)`.

    Added tokens (`add_tokens`, `add_special_tokens`, `extra_special_tokens=`), e.g. entity markers such as `"[E1]"`,
    are words that raw text never splits (the word splitter would cut `"[E1]"` into `[`, `E1`, `]`), wherever they
    occur. The model reads an added token by its characters, as every word: its row in `input_ids` is the row of
    the word `"[E1]"` given pre-split, so there is no embedding row to add (`resize_token_embeddings` refuses) and a
    fine-tuned head learns what the marker's characters stand for. Its id (`convert_tokens_to_ids`, `get_vocab()`,
    `len(tokenizer)`) follows the pseudo-vocabulary, as transformers numbers added tokens, and is saved with the
    tokenizer (`tokenizer_config.json`); special ones are dropped by `decode(..., skip_special_tokens=True)`. Special
    tokens such as `cls_token` are not put into the rows: the sentence boundaries are always `<S>`/`</S>`.
    """

    vocab_files_names: dict[str, str] = {
        "char_vocab_file": "char_vocab.json",
        "input_word_vocab_file": "input_word_vocab.json",
        "word_vocab_file": WORD_VOCABULARY_FILE,
    }
    model_input_names = ["input_ids", "attention_mask"]
    # Saved with its code and `auto_map` also where it is the remote code of a folder (a model saves its tokenizer).
    _auto_class = "AutoTokenizer"

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
            raise ValueError(_padding_side_error(kwargs["padding_side"]))
        self._utf8_bytes = Utf8Bytes(max_characters_per_token)
        if max_characters_per_token != MAX_WORD_LENGTH and (char_vocab or char_vocab_file):
            raise ValueError(
                f"max_characters_per_token={max_characters_per_token}: a character vocabulary (ELMoForManyLangs) has "
                f"rows of {MAX_WORD_LENGTH}"
            )
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
        self.set_word_vocabulary(read_word_vocabulary(word_vocab_file) if word_vocab_file is not None else None)
        # The base class's special-token helpers then count, mask and type `<S> words </S>` (through
        # `build_inputs_with_special_tokens`, which places the boundary rows); not a user setting.
        kwargs.update(special_tokens_pattern="bos_eos", token_type_ids_pattern="all_zeros")
        kwargs["token_type_ids_include_special_tokens"] = True
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
        """`PreTrainedTokenizer.from_pretrained` with ELMo's loading policy (`model_io.load_tokenizer`): a file that is
        not valid JSON is named, and a tokenizer that reads characters otherwise than the model of the same folder
        (`char_vocab.json` against config.json's `char_vocabulary`) is refused."""
        return load_tokenizer(super().from_pretrained, pretrained_model_name_or_path, *args, **kwargs)

    @property
    def characters(self) -> CharacterVocabulary | Utf8Bytes:
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
            raise ValueError(_padding_side_error(value))

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

    def added_words(self) -> list[str]:
        """The tokens added with `add_tokens` / `add_special_tokens` (beyond the pseudo-vocabulary's): words that raw
        text never splits, each read by its characters as any word."""
        return [token for token in self._added_tokens_encoder if token not in self._vocab]

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
        rows (dropped when `skip_special_tokens`). The base class's `_decode` joins these words.
        """
        if is_scalar_id(ids):
            return super().convert_ids_to_tokens(int(ids))
        depth = nesting_depth(ids)
        if depth <= 1:
            flat = [int(i) for i in to_numpy(ids).reshape(-1).tolist()]
            return super().convert_ids_to_tokens(flat, skip_special_tokens=skip_special_tokens)
        if depth != 2:
            raise ValueError(f"convert_ids_to_tokens expects ids of one sequence, got {depth}-D input")
        rows = as_rows(ids, width=self.characters.width)
        words = rows_to_words(self.characters, rows, self.pad_token, skip_special_tokens)
        if skip_special_tokens:  # an added special token is a word whose row is its characters
            special = set(self.all_special_tokens) & set(self.added_words())
            words = [word for word in words if word not in special]
        return words

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        # UTF-8 byte ids are fixed by the algorithm; only the vocabularies a tokenizer has need files.
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        if self._word_vocabulary is not None:
            path = os.path.join(save_directory, prefix + WORD_VOCABULARY_FILE)
            paths.append(write_word_vocabulary(self._word_vocabulary.words, path))
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
        return None if self._word_vocabulary is None else self._word_vocabulary.words

    def set_word_vocabulary(self, words: Sequence[str] | None) -> None:
        """Attach a word vocabulary (validated by `check_word_vocabulary`); `None` removes it."""
        self._word_vocabulary = None if words is None else WordVocabulary(words)

    def word_targets(self, words: Sequence[str]) -> np.ndarray:
        """Word ids `(n,)` int64 of `n` words for the LM targets; words outside the vocabulary get `<UNK>`'s id 2.

        The literal words `<S>` and `</S>` get ids 0 and 1.
        """
        if self._word_vocabulary is None:
            raise ValueError(
                "This ElmoTokenizer has no word vocabulary: load one with ElmoTokenizer(word_vocab_file=...) or "
                "set_word_vocabulary(words) (see build_word_vocabulary)."
            )
        return self._word_vocabulary.ids(words)

    # --- word splitting -----------------------------------------------------------------------------

    def split_words(self, text: str) -> list[str]:
        """Split raw text into Penn-Treebank-style words (see `pre_tokenizer.PRE_TOKENIZER_PATTERN`), each added token
        (`added_words`) a word of its own wherever it occurs, as BERT's tokenizers keep theirs whole.

        `"I don't think it's raining, is it?"` -> `["I", "do", "n't", "think", "it", "'s",
        "raining", ",", "is", "it", "?"]`; with `[E1]` added, `"[E1]Paris"` -> `["[E1]", "Paris"]`.
        """
        added = self.added_words()
        if not added or not isinstance(text, str):
            return split_words(self.pre_tokenizer, text)
        words = []
        # re.split with one group: the pieces between the added tokens at even indices, the added tokens at odd ones.
        for index, piece in enumerate(_added_words_pattern(tuple(sorted(added))).split(text)):
            if index % 2:
                words.append(piece)
            elif piece:
                words.extend(split_words(self.pre_tokenizer, piece))
        return words

    def tokenize(self, text: str, **kwargs) -> list[str]:
        """The words of `text` (`split_words`)."""
        return self.split_words(text)

    # --- special tokens: whole rows (the base class counts and types them through these) -------------

    def build_inputs_with_special_tokens(self, token_ids_0: list, token_ids_1: list | None = None) -> list:
        """`[<S> row] + rows + [</S> row]` for a list of 50-id rows."""
        if token_ids_1 is not None:
            raise ValueError(_NO_PAIRS)
        bos, eos = self.characters.boundary_rows
        return [bos.tolist()] + [list(row) for row in token_ids_0] + [eos.tolist()]

    def get_special_tokens_mask(
        self, token_ids_0: list, token_ids_1: list | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        """1 for each special position: the boundaries around `token_ids_0` (rows of words), or, if it already has
        them, its boundary and padding rows (read off their content)."""
        if token_ids_1 is not None:
            raise ValueError(_NO_PAIRS)
        if not already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0)
        rows = as_rows(token_ids_0, width=self.characters.width)
        return [int(word is None) for word in word_ids_from_rows(rows, self.characters.boundary_rows)]

    # --- encoding -----------------------------------------------------------------------------------

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
        if text_pair is None and (pairs := split_batch_of_pairs(text, is_split_into_words)) is not None:
            text, text_pair = pairs
        if text_pair is not None:
            unshared = ("self", "text", "text_pair", "kwargs")
            options = {key: value for key, value in locals().items() if key not in unshared}
            return self._encode_sentence_pairs(text, text_pair, **options, **kwargs)
        if return_overflowing_tokens:
            raise ValueError("ElmoTokenizer does not support return_overflowing_tokens")
        if return_offsets_mapping:
            raise NotImplementedError("ElmoTokenizer does not return offsets; use word_ids() for alignment")
        if padding_side not in (None, "right"):
            raise ValueError(_padding_side_error(padding_side))
        sentences, batched = collect_sentences(text, is_split_into_words, self.split_words)

        n_special = 2 if add_special_tokens else 0
        first_words = [0] * len(sentences)
        if truncation_strategy != TruncationStrategy.DO_NOT_TRUNCATE and max_length is not None:
            if truncation_strategy == TruncationStrategy.ONLY_SECOND:
                raise ValueError("truncation='only_second' needs sequence pairs: pass text_pair")
            budget = max_length - n_special
            if budget < 0:
                raise ValueError(
                    f"max_length={max_length} leaves no room for the {n_special} sentence-boundary positions"
                )
            for index, words in enumerate(sentences):
                excess = max(len(words) - budget, 0)
                if self.truncation_side == "left":  # the indices of the kept words stay those of the sentence
                    first_words[index], sentences[index] = excess, words[excess:]
                else:
                    sentences[index] = words[: len(words) - excess]

        word_counts = np.array([len(words) for words in sentences], dtype=np.int64)
        lengths = word_counts + n_special
        positions = padded_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        flat_words = [word for words in sentences for word in words]
        characters = self.characters
        frame = characters.boundary_rows if add_special_tokens else None
        data = {"input_ids": pad_rows(characters.rows(flat_words), positions, frame=frame, lengths=word_counts)}
        if characters.words is not None:
            frame = characters.boundary_word_ids if add_special_tokens else None
            word_ids = characters.word_ids(flat_words)
            fill = characters.padding_word_id
            data["input_word_ids"] = pad_rows(word_ids, positions, fill, frame, lengths=word_counts)
        position = np.arange(positions)[None, :]
        first_word_position = 1 if add_special_tokens else 0
        attention_mask = (position < lengths[:, None]).astype(np.int64)
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        if return_attention_mask:
            data["attention_mask"] = attention_mask
        if return_token_type_ids:
            data["token_type_ids"] = np.zeros_like(attention_mask)
        if return_special_tokens_mask:
            is_word = (position >= first_word_position) & (position < (word_counts + first_word_position)[:, None])
            data["special_tokens_mask"] = (~is_word).astype(np.int64)
        if return_length:
            data["length"] = lengths

        spans = [(first, int(count), first_word_position) for first, count in zip(first_words, word_counts)]
        unpadded = padding_strategy == PaddingStrategy.DO_NOT_PAD
        return ElmoBatchEncoding.from_arrays(
            data, lengths, unpadded, batched, return_tensors, characters.boundary_rows, spans
        )

    def _encode_sentence_pairs(
        self, text: Any, text_pair: Any, truncation_strategy: TruncationStrategy, **options
    ) -> ElmoBatchEncoding:
        """ELMo's layout of a pair: each side is a sentence of its own, encoded as `text` alone would be (its own
        `<S>`/`</S>`, its own padding), with no separator between them; the second side's features get the prefix
        `pair_` (`pair_input_ids`, `pair_attention_mask`, ...) and its word indices come from `pair_word_ids`. A
        truncation strategy applies `max_length` to the sides it names (`longest_first`: both)."""
        strategy = TruncationStrategy(truncation_strategy)
        sides = []
        for _side, value, truncated in (
            ("text", text, (TruncationStrategy.LONGEST_FIRST, TruncationStrategy.ONLY_FIRST)),
            ("text_pair", text_pair, (TruncationStrategy.LONGEST_FIRST, TruncationStrategy.ONLY_SECOND)),
        ):
            side_strategy = TruncationStrategy.DO_NOT_TRUNCATE
            if strategy in truncated:
                side_strategy = TruncationStrategy.LONGEST_FIRST
            sides.append(self._encode_plus(value, truncation_strategy=side_strategy, **options))
        first, second = sides
        if first._batched != second._batched:
            raise ValueError(
                "text and text_pair must both be one sentence or both a batch of sentences, got "
                f"{'a batch' if first._batched else 'one sentence'} and "
                f"{'a batch' if second._batched else 'one sentence'}"
            )
        if first._batched and len(first["input_ids"]) != len(second["input_ids"]):
            raise ValueError(
                f"text has {len(first['input_ids'])} sentences but text_pair has {len(second['input_ids'])}: "
                "each sentence needs its pair"
            )
        for key, value in second.items():
            first[PAIR_PREFIX + key] = value
        first.pair = second
        return first

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
        if padding_side not in (None, "right"):
            raise ValueError(_padding_side_error(padding_side))
        first, second = split_pairs(encoded_inputs)
        if second is not None:  # each side of a pair is padded as a batch of its own (see _encode_sentence_pairs)
            options = dict(
                padding=padding,
                max_length=max_length,
                pad_to_multiple_of=pad_to_multiple_of,
                return_attention_mask=return_attention_mask,
                return_tensors=return_tensors,
                verbose=verbose,
            )
            encoding, pair = self.pad(first, **options), self.pad(second, **options)
            for key, value in pair.items():
                encoding[PAIR_PREFIX + key] = value
            encoding.pair = pair
            return encoding
        width = self.characters.width
        examples, batched, given_tensor_type = collect_examples(encoded_inputs, width)
        if return_tensors is None:
            return_tensors = given_tensor_type
        padding_strategy, _, max_length, _ = self._get_padding_truncation_strategies(
            padding=padding, max_length=max_length, verbose=verbose
        )
        rows = [as_rows(example, width=width) for example in examples["input_ids"]]
        for key, value in examples.items():
            if key in PER_POSITION_FEATURES and len(value) != len(rows):
                raise ValueError(f"Feature `{key}` has {len(value)} entries but there are {len(rows)} examples")
        lengths = np.array([r.shape[0] for r in rows], dtype=np.int64)
        positions = padded_length(lengths, padding_strategy, max_length, pad_to_multiple_of)
        data: dict[str, Any] = {"input_ids": pad_rows(rows, positions)}

        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        padded_with = {"attention_mask": 0, "token_type_ids": self.pad_token_type_id, "special_tokens_mask": 1}
        if self.characters.words is not None:
            padded_with["input_word_ids"] = self.characters.padding_word_id
        for key, fill in padded_with.items():
            if key == "attention_mask" and not return_attention_mask:
                continue
            if key in examples:
                data[key] = pad_rows(per_position_values(examples[key], key, lengths), positions, fill)
            elif key == "attention_mask":  # a position is real iff some id of its row is > 0
                data[key] = np.any(data["input_ids"] > 0, axis=2).astype(np.int64)

        extra = {key: value for key, value in examples.items() if key not in data and key not in padded_with}
        unpadded = padding_strategy == PaddingStrategy.DO_NOT_PAD
        return ElmoBatchEncoding.from_arrays(
            data, lengths, unpadded, batched, return_tensors, self.characters.boundary_rows, extra=extra
        )

    # --- decoding -----------------------------------------------------------------------------------

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
        if is_scalar_id(token_ids):
            return self.convert_ids_to_tokens(int(token_ids))
        depth = nesting_depth(token_ids)
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
        # The base class joins the words of `convert_ids_to_tokens` and undoes the PTB spacing if asked.
        return self._decode(token_ids, skip_special_tokens, clean_up_tokenization_spaces)
