"""`ElmoBatchEncoding`: the tokenizer's output, which knows which word sits at each position."""

from __future__ import annotations

from typing import Any

from transformers import BatchEncoding
from transformers.tokenization_utils_base import TokenSpan
from transformers.utils import TensorType

from .character_rows import BOS_WORD_IDS, EOS_WORD_IDS, to_numpy, word_ids_from_rows


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
            return word_ids_from_rows(to_numpy(sequence), self._boundary_rows)
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


__all__ = ["ElmoBatchEncoding"]
