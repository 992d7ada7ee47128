"""The tokenizer's batches: `ElmoBatchEncoding`, its output, which knows which word sits at each position; what
`ElmoTokenizer.pad` is given, read as examples (`collect_examples`, `per_position_values`); and the number of
positions a padding strategy gives (`padded_length`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from transformers import BatchEncoding
from transformers.tokenization_utils_base import TokenSpan
from transformers.utils import PaddingStrategy, TensorType

from .character_rows import (
    BOS_WORD_IDS,
    EOS_WORD_IDS,
    is_tensor_like,
    nesting_depth,
    to_numpy,
    word_ids_from_rows,
)

PER_POSITION_FEATURES = ("attention_mask", "token_type_ids", "special_tokens_mask", "input_word_ids")
"""Features with one value per position besides `input_ids`: padded and cut back like it."""
PAIR_PREFIX = "pair_"
"""Prefix of the second sentence's features in an encoded pair (`pair_input_ids`, `pair_attention_mask`, ...)."""


def padded_length(
    lengths: np.ndarray,
    padding_strategy: PaddingStrategy | str | bool,
    max_length: int | None,
    pad_to_multiple_of: int | None,
) -> int:
    """Number of positions of a batch of sequences of `lengths` `(B,)` padded by `padding_strategy` (for
    `DO_NOT_PAD`: the longest, each sequence is cut back to its length later)."""
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


def collect_examples(encoded_inputs: Any, width: int) -> tuple[dict[str, list], bool, str | None]:
    """What `pad` is given, as `(features, batched, tensor type)`: each feature a list with one entry per example.

    Accepts a list of per-example dicts, a dict of such lists, a dict holding one example (`input_ids` `(T, width)`:
    `batched` is then False) or an already batched `(B, T, width)` dict. The tensor type is that of the examples'
    `input_ids` (`"pt"`, `"np"`, or None for lists): like the base class, tensors in, the same kind of tensors out.
    """
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
    probe = input_ids[0] if isinstance(input_ids, (list, tuple)) and len(input_ids) else input_ids
    tensor_type = "pt" if hasattr(probe, "detach") else "np" if isinstance(probe, np.ndarray) else None
    depth = nesting_depth(input_ids)
    if from_example_list or depth == 3:
        return dict(encoded_inputs), True, tensor_type
    if depth == 2:
        return {key: [value] for key, value in encoded_inputs.items()}, False, tensor_type
    raise ValueError(
        f"`input_ids` must be one example of shape (positions, {width}) or a batch of them, got a {depth}-D value"
    )


def split_pairs(encoded_inputs: Any) -> tuple[Any, Any]:
    """What `pad` is given, split into the first sentences and the second (`pair_...` features, without the prefix):
    in the same form (a list of per-example dicts or a dict of features); the second is None if there are none."""
    if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs and isinstance(encoded_inputs[0], Mapping):
        if not any(str(key).startswith(PAIR_PREFIX) for key in encoded_inputs[0]):
            return encoded_inputs, None
        halves = [split_pairs(example) for example in encoded_inputs]
        if any(second is None for _, second in halves):
            raise ValueError("pad() got examples with and without `pair_input_ids`: every example must be a pair")
        return [first for first, _ in halves], [second for _, second in halves]
    if not isinstance(encoded_inputs, Mapping) or not any(str(key).startswith(PAIR_PREFIX) for key in encoded_inputs):
        return encoded_inputs, None
    first, second = {}, {}
    for key, value in encoded_inputs.items():
        if str(key).startswith(PAIR_PREFIX):
            second[key[len(PAIR_PREFIX) :]] = value
        else:
            first[key] = value
    if "input_ids" not in second:
        names = sorted(PAIR_PREFIX + key for key in second)
        raise ValueError(f"pad() got pair features {names} without `pair_input_ids`")
    return first, second


def per_position_values(examples: list, key: str, lengths: np.ndarray) -> list[np.ndarray]:
    """Feature `key` of each example as `(T_b,)` int64, checked against the examples' numbers of positions `(B,)`."""
    values = [to_numpy(value).astype(np.int64).reshape(-1) for value in examples]
    for index, value in enumerate(values):
        if value.shape[0] != lengths[index]:
            raise ValueError(
                f"`{key}` of example {index} has {value.shape[0]} entries but its input_ids have "
                f"{lengths[index]} positions"
            )
    return values


def _converted(value: Any, return_tensors: str | TensorType | None) -> Any:
    """A feature that is not per position (e.g. `labels`) as the tensor type if it is rectangular, else as it is (a
    collator such as `DataCollatorForTokenClassification` pads ragged labels itself)."""
    if return_tensors is None:
        return value
    try:
        if is_tensor_like(value):
            array = to_numpy(value)
        elif isinstance(value, (list, tuple)) and value and all(is_tensor_like(v) for v in value):
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
        # The second sentences' own encoding, for a pair (`pair_word_ids`).
        self.pair: ElmoBatchEncoding | None = None

    @classmethod
    def from_arrays(
        cls,
        data: dict[str, np.ndarray],
        lengths: np.ndarray,
        unpadded: bool,
        batched: bool,
        return_tensors: str | TensorType | None,
        boundary_rows: tuple[np.ndarray, np.ndarray],
        word_spans: list[tuple[int, int, int]] | None = None,
        extra: dict[str, list] | None = None,
    ) -> ElmoBatchEncoding:
        """The encoding of padded features `data` (`(B, L, ...)` arrays, `lengths` `(B,)` real positions each) in
        the type the caller asked for: tensors of `return_tensors`, else nested lists, of one sequence unless
        `batched`. `unpadded` (no padding asked): lists are cut back to each sequence's length, and tensors of
        sequences of different lengths are refused. `extra`: features that are not per position, one entry per
        example, converted when rectangular."""
        if return_tensors is not None:
            if unpadded and bool(np.any(lengths != data["input_ids"].shape[1])):
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
            encoding = cls(data, word_spans=word_spans, batched=True, boundary_rows=boundary_rows)
        else:
            sequence_keys = {"input_ids", *PER_POSITION_FEATURES}
            lists = {}
            for key, value in data.items():
                if key in sequence_keys and unpadded:
                    lists[key] = [row[:length].tolist() for row, length in zip(value, lengths.tolist())]
                else:
                    lists[key] = value.tolist()
            if not batched:
                lists = {key: value[0] for key, value in lists.items()}
            encoding = cls(lists, word_spans=word_spans, batched=batched, boundary_rows=boundary_rows)
        for key, value in (extra or {}).items():
            encoding[key] = _converted(value if batched else value[0], return_tensors)
        return encoding

    def __getstate__(self):
        state = super().__getstate__()
        state["word_spans"] = self._word_spans
        state["batched"] = self._batched
        state["boundary_rows"] = self._boundary_rows
        state["pair"] = self.pair
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._word_spans = state.get("word_spans")
        self._batched = state.get("batched", True)
        self._boundary_rows = state.get("boundary_rows", (BOS_WORD_IDS, EOS_WORD_IDS))
        self.pair = state.get("pair")

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
            return word_ids_from_rows(to_numpy(sequence), self._boundary_rows)
        first_word, n_words, first_position = self._word_spans[batch_index]
        n_positions = len(sequence)
        words = list(range(first_word, first_word + n_words))
        return [None] * first_position + words + [None] * (n_positions - first_position - n_words)

    def pair_word_ids(self, batch_index: int = 0) -> list[int | None]:
        """`word_ids` of the second sentence of pair `batch_index` (its `pair_input_ids`)."""
        if self.pair is None:
            raise ValueError("pair_word_ids needs an encoded pair: tokenizer(text, text_pair)")
        return self.pair.word_ids(batch_index)

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


__all__ = [
    "PAIR_PREFIX",
    "ElmoBatchEncoding",
    "collect_examples",
    "padded_length",
    "per_position_values",
    "split_pairs",
]
