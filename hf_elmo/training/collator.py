"""`DataCollatorForBiLM`: windows, full or stored as word-table indices, padded to a batch."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..character_rows import pad_rows
from .windows import IGNORE_INDEX, window_arrays
from .word_table import STORED_WINDOWS, WordTable


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
