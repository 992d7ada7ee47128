"""`WindowDataset`, the dataset of compact windows that `word_table.load_compact_bilm_dataset` returns. A module of its
own: defining it imports `datasets`, which `word_table` (imported by most commands) imports only where it reads data."""

import functools

import datasets
import numpy as np
import pyarrow.compute as pc
from datasets.formatting import query_table

NUMPY_WINDOWS = {"type": "numpy", "format_kwargs": {}, "columns": ["positions"], "output_all_columns": False}
WORD_TABLE = "word_table"
"""The key of a row of `WindowDataset` naming the digest of the word table its window was prepared with: the same
indices read with another table are other words."""


class WindowDataset(datasets.Dataset):
    """A `datasets.Dataset` of stored windows (`positions`) whose batches of rows, what a `DataLoader` fetches for each
    batch, are read as one Arrow slice: the `numpy` format would make each row an array on its own, in Python, which
    took most of the host's time per batch. Each of those rows also names the `WordTable.digest` of the table the
    windows were prepared with (`WORD_TABLE`), which `DataCollatorForBiLM(words=...)` compares with its own. The
    datasets its `select`, `shuffle`, `train_test_split` and the like return are `WindowDataset`s of the same table
    (`datasets` makes them plain datasets)."""

    word_table: str | None = None

    def adopt(self, result):
        """`result` (a dataset, or a `DatasetDict` of them, holding these windows) as `WindowDataset`s of this
        table."""
        if isinstance(result, datasets.DatasetDict):
            return datasets.DatasetDict({name: self.adopt(part) for name, part in result.items()})
        if not isinstance(result, datasets.Dataset) or isinstance(result, WindowDataset):
            return result
        windows = WindowDataset(
            result.data,
            info=result.info,
            split=result.split,
            indices_table=result._indices,
            fingerprint=result._fingerprint,
        )
        windows.set_format(**result.format)
        windows.word_table = self.word_table
        return windows

    def __getitems__(self, keys: list) -> list[dict]:
        if self.format != NUMPY_WINDOWS:
            return super().__getitems__(keys)
        column = query_table(self.data, keys, indices=self._indices).column("positions")
        values = pc.list_flatten(column).to_numpy().astype(np.int64)  # int64, as the numpy format gives each row
        ends = np.cumsum(pc.list_value_length(column).to_numpy()).tolist()
        return [{"positions": values[start:end], WORD_TABLE: self.word_table} for start, end in zip([0, *ends], ends)]


def _keeping_windows(name: str):
    method = getattr(datasets.Dataset, name)

    @functools.wraps(method)
    def keeping_windows(self, *args, **kwargs):
        return self.adopt(method(self, *args, **kwargs))

    return keeping_windows


for _name in ("select", "shuffle", "sort", "filter", "skip", "take", "shard", "flatten_indices", "train_test_split"):
    setattr(WindowDataset, _name, _keeping_windows(_name))
