"""Compact prepared windows: a position stored as one int32, an index into the corpus's table of distinct words
(`WordTable`), from which each batch's character rows and targets are made; the prepared cache files."""

import contextlib
import ctypes
import hashlib
import itertools
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from ..character_rows import BOS_TOKEN, EOS_TOKEN
from ..folder_files import cache_file_damage, record_cache_file, remove_cache_file
from ..io.files import ElmoInputError, read_lines
from ..tokenization_elmo import ElmoTokenizer
from ..word_vocabulary import BOS_WORD_INDEX, EOS_WORD_INDEX
from .corpus import _check_split, _check_targets, check_text_files, iter_sentences, split_line
from .windows import IGNORE_INDEX, pack_sentences

logger = logging.getLogger(__name__)

WINDOWS_FORMAT = "hf-elmo compact windows 1"
"""Part of every cache key: a change of the stored layout must not read files written in the old one."""
NO_NEIGHBOUR = -1
STORED_PADDING = -2
"""Fills a row of `WordTable.stored` after its window."""
STORED_WINDOWS = "stored_windows"
"""The key of the batches of `DataCollatorForBiLM(words=..., stored_only=True)`."""
LINES_PER_PACK = 1000
"""Windows are packed within blocks of this many lines of a file, as `load_bilm_dataset` packs each batch of its map:
both preparations give the same windows."""


class WordTable:
    """The distinct words of a corpus: the vocabulary's words first (so a word's index is its word id), then, sorted,
    the corpus's other words and its literal `<S>` and `</S>` words (indices 0 and 1 are the sentence boundaries
    only, which the targets tell apart from the same words written in the text). `rows` are their character rows and
    `targets` their word ids."""

    def __init__(self, tokenizer: ElmoTokenizer, words_seen: Iterable[str]):
        _check_targets(tokenizer)
        vocabulary = tokenizer.word_vocabulary
        known = set(vocabulary)
        extra = sorted(word for word in set(words_seen) if word not in known or word in (BOS_TOKEN, EOS_TOKEN))
        self.words = (*vocabulary, *extra)
        # A literal <S> or </S> of the text maps to its own entry, after the vocabulary.
        self.index = {word: i for i, word in enumerate(self.words)}
        self.rows = tokenizer.characters.rows(self.words).astype(np.int16)
        self.targets = tokenizer.word_targets(self.words).astype(np.int64)
        self.digest = hashlib.sha256("\n".join(self.words).encode("utf-8", "surrogatepass")).hexdigest()
        self._tensors = {}
        self.split = None  # how the text of its words was split, where known (`of_files`)

    @classmethod
    def of_files(cls, files, tokenizer: ElmoTokenizer, split: str = "whitespace") -> "WordTable":
        """The table of the words of `files` (read once, line by line)."""
        seen = set()
        for words in iter_sentences(check_text_files(files), split, tokenizer):
            seen.update(words)
        table = cls(tokenizer, seen)
        table.split = split
        return table

    def window_arrays(self, positions, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """A stored window `[before, p_1 ... p_T, after]` (table indices; `before`/`after` the neighbours of a window
        cut out of a longer sentence, else -1) as `(input_ids (T, C), labels (T, 2))` int64, as `encode_windows`
        gives them."""
        batch = self.expand(self.stored([positions], first_index=index))
        return batch["input_ids"][0].numpy(), batch["labels"][0].numpy()

    def stored(self, windows: Sequence, positions: int | None = None, first_index: int = 0) -> torch.Tensor:
        """Stored windows side by side: `(B, P + 2)` int32, each `[before, p_1 ... p_T, after]` followed by
        `STORED_PADDING`, with `P` the longest window's `T` (or `positions`). `first_index` numbers the windows in
        errors."""
        windows = [np.asarray(window) for window in windows]
        for index, window in enumerate(windows, start=first_index):
            if window.ndim != 1 or window.size < 3:
                raise ValueError(f"Example {index}: expected a stored window of 3 entries or more, got {window.shape}.")
        values = np.concatenate(windows)
        if values.dtype.kind not in "iu":
            bad, window = next((i, w) for i, w in enumerate(windows, start=first_index) if w.dtype.kind not in "iu")
            raise ValueError(f"Example {bad}: stored word indices must be integers, got {window.dtype}.")
        if values.min() < NO_NEIGHBOUR or values.max() >= len(self.words):
            bad = next(i for i, w in enumerate(windows) if w.min() < NO_NEIGHBOUR or w.max() >= len(self.words))
            raise ValueError(
                f"Example {first_index + bad}: stored word indices must be in [-1, {len(self.words) - 1}], got "
                f"[{windows[bad].min()}, {windows[bad].max()}]: the window was prepared with another word table."
            )
        sizes = np.array([window.size for window in windows])
        starts = np.cumsum(sizes) - sizes
        ends = starts + sizes - 1
        # Every -1 must be a window's neighbour, its first or last entry (the range is checked: no value is below -1).
        neighbours = np.count_nonzero(values[starts] == NO_NEIGHBOUR) + np.count_nonzero(values[ends] == NO_NEIGHBOUR)
        if np.count_nonzero(values == NO_NEIGHBOUR) > neighbours:
            bad = next(i for i, w in enumerate(windows) if w[1:-1].min() < 0)
            raise ValueError(
                f"Example {first_index + bad}: the positions of a stored window must be word indices in [0, "
                f"{len(self.words) - 1}], got {windows[bad][1:-1].min()} (-1 is only the neighbour before or after "
                "them)."
            )
        width = int(sizes.max()) if positions is None else positions + 2
        stored = torch.full((len(windows), width), STORED_PADDING, dtype=torch.int32)
        stored.numpy()[np.repeat(np.arange(len(windows)), sizes), np.arange(sizes.sum()) - np.repeat(starts, sizes)] = (
            values
        )
        return stored

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tensors": {}}  # a loader worker started with spawn gets no device tensors

    def tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The table's character rows `(N, C)` int16 and targets `(N,)` int64 on `device` (kept once made)."""
        device = torch.device(device)
        if device not in self._tensors:
            rows, targets = torch.from_numpy(self.rows), torch.from_numpy(self.targets)
            self._tensors[device] = rows.to(device), targets.to(device)
        return self._tensors[device]

    def expand(self, stored: torch.Tensor) -> dict[str, torch.Tensor]:
        """`stored` windows `(B, P + 2)` (`stored`) as the batch the model takes: `input_ids` `(B, P, C)`,
        `attention_mask` `(B, P)` and `labels` `(B, P, 2)`, int64, on the device of `stored`, made there (a few
        gathers: on a GPU the host sends `P + 2` integers a window instead of `53 P`)."""
        rows, targets = self.tensors(stored.device)
        stored = stored.long()
        positions = stored.shape[1] - 2
        lengths = stored.ne(STORED_PADDING).sum(dim=1) - 2
        mask = torch.arange(positions, device=stored.device) < lengths[:, None]
        words = stored[:, 1:-1]
        input_ids = rows[words.clamp(min=0)].long().mul_(mask[..., None])
        neighbours = torch.where(stored >= 0, targets[stored.clamp(min=0)], IGNORE_INDEX)
        forward = torch.where(mask & words.ne(EOS_WORD_INDEX), neighbours[:, 2:], IGNORE_INDEX)
        backward = torch.where(mask & words.ne(BOS_WORD_INDEX), neighbours[:, :-2], IGNORE_INDEX)
        return {"input_ids": input_ids, "attention_mask": mask.long(), "labels": torch.stack([forward, backward], -1)}


def _pack_block(lines, first_number, table: WordTable, window, split, tokenizer, source) -> tuple[np.ndarray, ...]:
    """The stored windows of one block of lines: `(offsets, values)` of the list column."""
    lookup, flat, lengths = table.index.__getitem__, [], []
    sentences = (
        split_line(line, split, tokenizer, f"{source}, line {first_number + i}") for i, line in enumerate(lines)
    )
    try:
        for group in pack_sentences((words for words in sentences if words), window):
            length = 0
            for words in group:
                flat.append(BOS_WORD_INDEX)
                flat.extend(map(lookup, words))
                flat.append(EOS_WORD_INDEX)
                length += len(words) + 2
            lengths += [min(window, length - start) for start in range(0, length, window)]
    except KeyError as error:  # a word the table's pass did not see
        raise ElmoInputError(
            f"{source}: the word {error.args[0]!r} is not in the word table: the file changed after the table was "
            "made from it, or the table was made from other files"
        ) from None
    flat = np.asarray(flat, dtype=np.int32)
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    values = np.empty(flat.size + 2 * lengths.size, dtype=np.int32)
    shift = 2 * np.arange(lengths.size)
    values[np.arange(flat.size) + np.repeat(shift, lengths) + 1] = flat
    cut_before = flat[starts] != BOS_WORD_INDEX
    cut_after = flat[ends - 1] != EOS_WORD_INDEX
    values[starts + shift] = np.where(cut_before, flat[np.maximum(starts - 1, 0)], NO_NEIGHBOUR)
    values[ends + shift + 1] = np.where(cut_after, flat[np.minimum(ends, flat.size - 1)], NO_NEIGHBOUR)
    offsets = np.concatenate([[0], ends + shift + 2]).astype(np.int32)
    return offsets, values


def _compact_schema():
    import pyarrow as pa

    return pa.schema([("positions", pa.list_(pa.int32()))])


def _remove_parts_of_ended_writers(target: Path) -> None:
    """Removes what writers of `target` on this machine that ended without cleaning up (killed) left beside it: its
    parts named by a host and process id (`_written_aside`) whose process no longer runs. Parts of other machines
    sharing the folder, and of writers that still run, are left alone."""
    name = re.compile(rf"\.{re.escape(target.name)}\.(?P<host>.+)\.(?P<pid>\d+)\.partial(\.\d+)?")
    for path in target.parent.glob(f".{target.name}.*.partial*"):
        part = name.fullmatch(path.name)
        if part is not None and part["host"] == socket.gethostname() and not _runs(int(part["pid"])):
            path.unlink(missing_ok=True)


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


PR_SET_PDEATHSIG = 1


def _end_with_parent(parent: int) -> None:
    """A preparation worker's initializer: the worker is killed when the process that forked it ends, however it
    ends (SIGKILL included). Left behind, it would run on holding what it inherited, the launch's store among it:
    the other processes of the launch would wait on a store that never answers instead of seeing it gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def _preparation_workers(processes: int):
    """`processes` forked worker processes that end with this one (forked, they share the word table instead of each
    receiving a copy)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(
        processes, mp_context=get_context("fork"), initializer=_end_with_parent, initargs=(os.getpid(),)
    )


@contextlib.contextmanager
def _written_aside(target: Path):
    """A path to write `target` at, renamed to it when the block ends without error, then its record (length and
    digest, `record_cache_file`) written: `target` is complete or absent, a `target` without its record was cut short
    after the rename, and a failed write leaves no empty cache folder behind."""
    created = [folder for folder in (target.parent, *target.parent.parents) if not folder.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{socket.gethostname()}.{os.getpid()}.partial")
    written = False
    try:
        yield aside
        os.replace(aside, target)
        record_cache_file(target)
        written = True
    finally:
        aside.unlink(missing_ok=True)
        for folder in [] if written else created:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _write_blocks(path: str, target: Path, table: WordTable, window, split, tokenizer, part=(0, 1)):
    """The windows of the blocks of `LINES_PER_PACK` lines of `path` whose number is `part[0]` modulo `part[1]`, one
    record batch per block (empty ones too when there are several parts, so that the parts interleave), into the
    Arrow stream file `target`."""
    import pyarrow as pa

    rank, parts = part
    schema = _compact_schema()
    with pa.OSFile(str(target), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        lines = read_lines(path)
        for number in itertools.count():
            block = list(itertools.islice(lines, LINES_PER_PACK))
            if not block:
                break
            if number % parts != rank:
                continue
            offsets, values = _pack_block(block, number * LINES_PER_PACK + 1, table, window, split, tokenizer, path)
            if len(offsets) > 1 or parts > 1:
                column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.int32()))
                writer.write_batch(pa.record_batch([column], schema=schema))


def _write_compact_file(path: str, target: Path, table: WordTable, window, split, tokenizer, processes: int = 1):
    """The windows of one text file into the Arrow file `target`; with several `processes`, each packs one block of
    lines in `processes` (reading the whole file, packing only its blocks), and the parts are interleaved."""
    import pyarrow as pa

    with _written_aside(target) as aside:
        if processes == 1:
            _write_blocks(path, aside, table, window, split, tokenizer)
            return
        pieces = [aside.with_name(f"{aside.name}.{rank}") for rank in range(processes)]
        try:
            with _preparation_workers(processes) as pool:
                jobs = [
                    pool.submit(_write_blocks, path, piece, table, window, split, tokenizer, (rank, processes))
                    for rank, piece in enumerate(pieces)
                ]
                for job in jobs:
                    job.result()
            with contextlib.ExitStack() as stack, pa.OSFile(str(aside), "wb") as sink:
                readers = [stack.enter_context(pa.ipc.open_stream(pa.memory_map(str(piece)))) for piece in pieces]
                with pa.ipc.new_stream(sink, _compact_schema()) as writer:
                    for reader in itertools.cycle(readers):  # block n is in piece n modulo processes
                        try:
                            batch = reader.read_next_batch()
                        except StopIteration:
                            break
                        if batch.num_rows:
                            writer.write_batch(batch)
        finally:
            for piece in pieces:
                piece.unlink(missing_ok=True)


def window_positions(dataset) -> int:
    """The positions of all windows of a `load_compact_bilm_dataset` dataset, from its stored offsets."""
    import pyarrow.compute as pc

    column = dataset.data.column("positions")
    return int(pc.sum(pc.list_value_length(column)).as_py()) - 2 * len(column)


def load_compact_bilm_dataset(
    files: Sequence[str | os.PathLike],
    table: WordTable,
    tokenizer: ElmoTokenizer,
    window: int = 20,
    split: str = "whitespace",
    cache_dir: str | os.PathLike | None = None,
    role: str = "data",
    processes: int | None = None,
):
    """The windows of `load_bilm_dataset`, stored compactly: one row per window, `positions` `(T + 2,)` int32
    (`WordTable.window_arrays`); `DataCollatorForBiLM(words=table)` makes batches of them, the same batches.

    Each text file is prepared once into an Arrow file of the cache (`cache_dir`, default the `datasets` cache), keyed
    by the file's path, size and modification time, the window, the split and the table; the files are then
    memory-mapped, so preparing and training take memory independent of the corpus's size. Each file's length and
    SHA-256 are recorded beside it once it is complete and checked before it is read: a file cut short, changed or
    without its record is named in one line (a warning) and prepared again. What a writer killed on this machine left
    beside a file (its parts, named by host and process id) is removed. Files not prepared yet are prepared by
    `processes` processes (default: one per core): one file each when there are as many files, else sharing each
    file's blocks of lines.
    """
    import datasets
    from datasets.fingerprint import Hasher

    if window < 3:
        raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {window}.")
    _check_split(split, tokenizer)
    if table.split not in (None, split):
        raise ValueError(
            f"The word table was made of the words of split={table.split!r}, the windows would be split with "
            f"split={split!r}: give both the same split."
        )
    files = check_text_files(files, role)
    folder = Path(cache_dir if cache_dir is not None else datasets.config.HF_DATASETS_CACHE) / "hf_elmo_windows"
    splitter = tokenizer if split == "pretokenizer" else None
    targets = []
    for path in files:
        info = os.stat(path)
        source = (os.path.abspath(path), info.st_size, info.st_mtime_ns)
        key = Hasher.hash((WINDOWS_FORMAT, source, window, split, splitter, table.digest))
        targets.append(folder / f"{key}.arrow")
    missing = []
    for path, target in zip(files, targets):
        _remove_parts_of_ended_writers(target)
        if not target.is_file():
            missing.append((path, target))
        elif (damage := cache_file_damage(target)) is not None:
            logger.warning(f"{target}: a damaged windows cache ({damage}): prepared again from {path}")
            remove_cache_file(target)
            missing.append((path, target))
    processes = (os.cpu_count() or 1) if processes is None else processes
    write = partial(_write_compact_file, table=table, window=window, split=split, tokenizer=tokenizer)
    if 1 < processes <= len(missing):
        with _preparation_workers(processes) as pool:
            for done in [pool.submit(write, path, target) for path, target in missing]:
                done.result()
    else:  # fewer files than processes: the processes share each file's blocks
        for path, target in missing:
            write(path, target, processes=processes)
    parts = [datasets.Dataset.from_file(str(target)) for target in targets]
    dataset = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(dataset) == 0:
        raise ValueError(f"The {role} files {files} hold no sentence.")
    from .window_dataset import WindowDataset

    windows = WindowDataset(dataset.data, info=dataset.info, split=dataset.split, fingerprint=dataset._fingerprint)
    windows.word_table = table.digest
    return windows.with_format("numpy")
