"""`hf-elmo embed`: the ELMo vectors of a text file, one sentence per line, written to an HDF5 file.

    hf-elmo embed sentences.txt vectors.hdf5 --model DIR (--all | --top | --average | --scalar-mix-weights W ...)

The file reads like the output of AllenNLP's `allennlp elmo` command, so existing readers keep working:

* one float32 dataset per input line, named by its line number from 0: `(num_layers + 1, n_words, 2P)` with
  `--all`; `(n_words, 2P)` with `--top` (the last layer), `--average` (mean of all layers, layer 0 being the
  char-CNN `[x | x]`) or `--scalar-mix-weights` (`sum_k softmax(w)_k * layer_k`, the unnormalised weights of
  AllenNLP's `scalar_mix_parameters`). `--dtype float64` stores float64; `--output-dtype float16` stores float16
  (half the file, about 5e-4 relative rounding of each value; for bulk embedding, where writing the file is the
  bound). A value the output dtype cannot hold (beyond float16's range, or NaN or infinite as computed, e.g. under
  `--dtype float16`) is an error naming the line: nothing is written.
* `sentence_to_index`: a one-element string dataset holding the JSON map from each line (stripped) to its key.

`--layout packed` writes the same vectors for bulk embedding, where one dataset per line costs more than the model
on a GPU (HDF5's bookkeeping per dataset): `vectors`, every line's words one after another along
the words axis, `(L + 1, total_words, 2P)` or `(total_words, 2P)`, and `spans` `(lines, 2)` int64, line i's first
row and word count, so that line i's dataset above is `vectors[..., start : start + count, :]`. The file's attribute
`layout` is `"packed"`; `sentence_to_index` is the same.

Lines are split on whitespace (`str.split`), or with `--raw` by the tokenizer's word splitter. Differences from
the original command:

* **Stateless**: a line's vectors depend only on the line, not on the lines before it or its batch (every line
  starts from the model's warm start state if it has one, else from zeros; up to float rounding: another
  `--batch-size` pads and sums differently, so bit-for-bit equality across batch sizes is not promised). Lines are
  sorted by length within a window of `--batch-size * 16` lines to pad little. A repeated line is computed once
  and its dataset is an HDF5 hard link to the first one (packed: the first one's span; identical vectors, no extra
  space); the map gives the first key (AllenNLP's gave the last, which held different vectors). `--carry-state`
  restores the original behaviour: batches of consecutive lines, row k of each batch continuing the LSTM state of
  row k of the previous batch, no sorting and no sharing.
* **Empty lines** give empty datasets, `(num_layers + 1, 0, 2P)` or `(0, 2P)`, instead of an error; with
  `--carry-state` they still pass `<S> </S>` through their row.
* **Memory** holds one window of lines and two batches of vectors (one is written to the file on a thread of its
  own while the next is computed), plus the map of distinct lines (about the size of the distinct input text;
  `--forget-sentences` drops it, and with it the sharing of repeated lines).
* **Safe output**: everything is written to a hidden temporary file beside the output, renamed when complete,
  so an interrupted run leaves no output file; an existing output is kept unless `--force`, which replaces only an
  HDF5 file (see `file_io`).
"""

import contextlib
import json
import math
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..io.files import HDF5_FILE, ElmoInputError, HDF5Output, read_lines, write_output

WINDOW_BATCHES = 16
"""Lines sorted by length together, in batches: more pads less, holds more lines in memory."""

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
OUTPUT_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}  # HDF5 has no bfloat16


def count_lines(path) -> int | None:
    """About the number of lines of a regular file (for the progress bar: `\r` alone is not counted); `None` for
    standard input."""
    if str(path) == "-" or not Path(path).is_file():
        return None
    count, last = 0, b"\n"
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


class LayerSelector:
    """The `(num_layers + 1)` layers `(B, T, 2P)` -> what one output dataset holds: `(L + 1, B, T, 2P)` for `all`,
    `(B, T, 2P)` otherwise (`top`, `average`, `sum`: SeqVec's per-residue vectors, `mix`)."""

    def __init__(self, mode: str, num_layers: int, mix_weights: list[float] | None = None):
        self.mode = mode
        if mode == "mix":
            if len(mix_weights) != num_layers + 1:
                raise ElmoInputError(
                    f"--scalar-mix-weights needs {num_layers + 1} values (one per layer of this model), "
                    f"got {len(mix_weights)}"
                )
            if not all(math.isfinite(w) for w in mix_weights):
                raise ElmoInputError(f"--scalar-mix-weights must be finite numbers, got {mix_weights}")
            self.mix = torch.softmax(torch.tensor(mix_weights, dtype=torch.float64), dim=0)

    def __call__(self, layers: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.mode == "top":
            return layers[-1]
        stacked = torch.stack(layers)
        if self.mode == "all":
            return stacked
        if self.mode == "average":
            return stacked.mean(dim=0)
        if self.mode == "sum":
            return stacked.sum(dim=0)
        return torch.einsum("l,l...->...", self.mix.to(stacked), stacked)


def _state_rows(store, batch_size: int, model):
    """The first `batch_size` rows of the carried state; where nothing was stored yet, the model's start state (its
    warm start state, else zeros)."""
    hidden, memory = store
    missing = batch_size - hidden.shape[1]
    if missing <= 0:
        return hidden[:, :batch_size], memory[:, :batch_size]
    start = model.initial_state(missing, dtype=hidden.dtype, device=hidden.device)
    return torch.cat([hidden, start[0]], dim=1), torch.cat([memory, start[1]], dim=1)


def _store_rows(store, new_state):
    """The original's bookkeeping: the rows of this batch are replaced, rows beyond it keep their state."""
    if store is None or store[0].shape[1] <= new_state[0].shape[1]:
        return new_state
    rows = new_state[0].shape[1]
    return tuple(torch.cat([new, old[:, rows:]], dim=1) for new, old in zip(new_state, store))


class Embedder:
    """Runs a batch of word lists through the model; returns each sentence's output as a numpy array."""

    def __init__(self, model, tokenizer, select: LayerSelector, output_dtype: torch.dtype = torch.float32):
        self.model = model
        self.tokenizer = tokenizer
        self.select = select
        self.output_dtype = output_dtype
        self.device = model.device
        self.store = None  # carried (hidden, memory), with --carry-state

    @property
    def empty_shape(self) -> tuple[int, ...]:
        """The shape of no words' vectors: `(L + 1, 0, 2P)` for `all`, `(0, 2P)` otherwise."""
        layers = (self.model.config.num_layers + 1,) if self.select.mode == "all" else ()
        return (*layers, 0, self.model.config.hidden_size)

    @property
    def numpy_dtype(self) -> np.dtype:
        return torch.empty((), dtype=self.output_dtype).numpy().dtype

    @torch.inference_mode()
    def __call__(self, sentences: list[list[str]], carry_state: bool = False) -> np.ndarray:
        """The words' vectors of all sentences, one sentence after another along the words axis: `(L + 1,
        sum(n_words), 2P)` for `all`, `(sum(n_words), 2P)` otherwise; boundaries and padding left out."""
        batch = self.tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
        # Row r's words sit at positions 1..n_r of its padded row; 0 and n_r + 1 hold the boundaries.
        counts = np.array([len(words) for words in sentences])
        row_starts = np.arange(len(sentences)) * batch["input_ids"].shape[1]
        first_words = np.cumsum(counts) - counts
        word_positions = np.arange(counts.sum()) + np.repeat(row_starts + 1 - first_words, counts)
        word_positions = torch.from_numpy(word_positions).to(self.device)
        batch = {key: value.to(self.device) for key, value in batch.items()}
        state = None
        if carry_state and self.store is not None:
            state = _state_rows(self.store, len(sentences), self.model)
        out = self.model(**batch, state=state, use_cache=carry_state, output_hidden_states=True)
        if carry_state:
            self.store = _store_rows(self.store, out.state)
        selected = self.select(out.hidden_states)
        words = selected.flatten(-3, -2).index_select(-2, word_positions)
        stored = words.to("cpu", self.output_dtype)
        finite = torch.isfinite(stored)
        if not finite.all():
            position = tuple((~finite).nonzero()[0].tolist())
            row = int(np.searchsorted(np.cumsum(counts), position[-2], side="right"))
            raise NonFiniteVectors(row, words[position].item(), self.model.dtype, self.output_dtype)
        return stored.numpy()


class NonFiniteVectors(ValueError):
    """A vector value the output cannot hold: computed as NaN or infinite by the model, or beyond the range of the
    output dtype; `row` is the sentence's row in its batch."""

    def __init__(self, row: int, value: float, model_dtype: torch.dtype, output_dtype: torch.dtype):
        self.row = row
        model_name, output_name = (str(dtype).removeprefix("torch.") for dtype in (model_dtype, output_dtype))
        if math.isfinite(value):
            largest = torch.finfo(output_dtype).max
            message = (
                f"a vector value, {value:.6g}, is beyond the range of --output-dtype {output_name} (largest "
                f"{largest:,.0f}); use a wider --output-dtype"
            )
        else:
            message = f"the model, running in {model_name}, computed a vector value of {value}"
            if model_dtype == torch.float16:
                largest = torch.finfo(model_dtype).max
                message += f" (float16 holds at most {largest:,.0f}): use --dtype float32 or bfloat16"
        super().__init__(message)


class PerLineStore:
    """AllenNLP's layout: one dataset per line, named by its line number; a repeated line a hard link."""

    def __init__(self, h5file):
        self.h5file = h5file

    def add(self, indices: list[int], counts: list[int], vectors: np.ndarray):
        """`vectors` `(..., sum(counts), 2P)`: the lines `indices`, `counts[i]` words each, one after another."""
        for index, words in zip(indices, np.split(vectors, np.cumsum(counts)[:-1], axis=-2)):
            self.h5file.create_dataset(str(index), data=np.ascontiguousarray(words))

    def end_window(self, first_index: int, lines: int, repeats: list[tuple[int, int]]):
        """`repeats`: `(index, first)` for each line of the window that repeats line `first`."""
        for index, first in repeats:
            self.h5file[str(index)] = self.h5file[str(first)]  # a hard link: the same dataset under two names


class PackedStore:
    """The packed layout: the words of all lines in one dataset `vectors`, `(L + 1, total_words, 2P)` or
    `(total_words, 2P)`, appended a batch at a time in the order computed, and `spans` `(lines, 2)` int64, line i's
    first row and word count: its vectors are `vectors[..., start : start + count, :]`. A repeated line has its
    first copy's span."""

    CHUNK_BYTES = 1 << 18  # a quarter of HDF5's default chunk cache, so a batch's last, partial chunk stays cached

    def __init__(self, h5file, empty_shape: tuple[int, ...], dtype: np.dtype):
        """`empty_shape`: the shape of no words' vectors, `(L + 1, 0, 2P)` or `(0, 2P)`."""
        self.h5file = h5file
        word_bytes = np.dtype(dtype).itemsize * math.prod(empty_shape[:-2] + empty_shape[-1:])
        chunks, maxshape = list(empty_shape), list(empty_shape)
        chunks[-2], maxshape[-2] = max(1, self.CHUNK_BYTES // word_bytes), None
        self.vectors = h5file.create_dataset(
            "vectors", empty_shape, dtype=dtype, maxshape=tuple(maxshape), chunks=tuple(chunks)
        )
        self.spans = h5file.create_dataset("spans", (0, 2), dtype=np.int64, maxshape=(None, 2), chunks=(8192, 2))
        self.window_spans: dict[int, tuple[int, int]] = {}
        h5file.attrs["layout"] = "packed"

    def add(self, indices: list[int], counts: list[int], vectors: np.ndarray):
        start = self.vectors.shape[-2]
        if vectors.shape[-2]:
            self.vectors.resize(start + vectors.shape[-2], axis=self.vectors.ndim - 2)
            self.vectors[..., start:, :] = vectors
        for index, words, offset in zip(indices, counts, np.cumsum([0, *counts[:-1]])):
            self.window_spans[index] = (start + int(offset), words)

    def end_window(self, first_index: int, lines: int, repeats: list[tuple[int, int]]):
        """Writes the spans of the window's lines `first_index ..`, which are all known once it is embedded;
        `repeats`: `(index, first)` for each line of the window that repeats line `first`."""
        for index, first in repeats:
            if first not in self.window_spans:  # a line of an earlier window, already written
                self.window_spans[first] = tuple(self.spans[first])
            self.window_spans[index] = self.window_spans[first]
        self.spans.resize(first_index + lines, axis=0)
        self.spans[first_index:] = [self.window_spans[index] for index in range(first_index, first_index + lines)]
        self.window_spans.clear()


class _InOrder:
    """Runs calls one after another on a thread of their own, so that the file is written while the next batch is
    tokenized and computed (on a GPU, writing the file is most of a batch's time). `run` returns once the calls before
    it are done, so one batch is written while the next is computed; a call's error is raised by the next `run` or by
    `wait`. Leaving the block waits for the calls."""

    def __init__(self):
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-elmo-embed-writer")
        self.pending: Future | None = None

    def run(self, function, *args):
        submitted = self.executor.submit(function, *args)
        self.wait()
        self.pending = submitted

    def wait(self):
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.executor.shutdown(wait=True, cancel_futures=True)


def _windows(lines: Iterator[tuple[int, str, list[str]]], size: int) -> Iterator[list]:
    window = []
    for line in lines:
        window.append(line)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def embed_file(
    embedder: Embedder,
    input_path,
    output_path,
    *,
    batch_size: int = 64,
    raw: bool = False,
    carry_state: bool = False,
    forget_sentences: bool = False,
    force: bool = False,
    packed: bool = False,
    progress: bool = True,
    inputs: Iterable = (),
    part: tuple[int, int] = (0, 1),
) -> int:
    """Writes the HDF5 file described in the module docstring; returns the number of lines embedded. `inputs` are the
    other files the run reads (the model's), which the output must not be, hold or lie inside. With `part` `(k, n)`
    only the lines whose number is k modulo n are embedded, under their numbers in the whole input."""
    import h5py
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ElmoInputError(f"--batch-size must be >= 1, got {batch_size}")

    def split(index: int, text: str) -> list[str]:
        if not raw:
            return text.split()
        try:
            return embedder.tokenizer.split_words(text)
        except ValueError as error:
            raise ElmoInputError(f"{input_path}: line {index + 1}: {error}") from None

    rank, processes = part
    lines = (
        (index, text.strip(), split(index, text))
        for index, text in enumerate(read_lines(input_path))
        if index % processes == rank
    )
    total = count_lines(input_path) if progress else None
    total = None if total is None else len(range(rank, total, processes))
    bar = tqdm(total=total, unit=" sentences", disable=not progress)

    embedded = [0]  # lines written; the bar counts nothing when disabled

    def write(path):
        key_of_line: dict[str, str] = {}
        with HDF5Output(path) as output, _InOrder() as writer:
            h5file = output.file
            if packed:
                store = PackedStore(h5file, embedder.empty_shape, embedder.numpy_dtype)
            else:
                store = PerLineStore(h5file)
            for window in _windows(lines, batch_size if carry_state else batch_size * WINDOW_BATCHES):
                to_compute, repeats = [], []
                for index, text, words in window:
                    if forget_sentences:
                        to_compute.append((index, words))
                    elif text in key_of_line and not carry_state:
                        repeats.append((index, int(key_of_line[text])))
                    else:
                        key_of_line.setdefault(text, str(index))
                        to_compute.append((index, words))
                if not carry_state:
                    to_compute.sort(key=lambda item: len(item[1]), reverse=True)  # stable: ties keep file order
                for start in range(0, len(to_compute), batch_size):
                    batch = to_compute[start : start + batch_size]
                    try:
                        vectors = embedder([words for _, words in batch], carry_state)
                    except NonFiniteVectors as error:
                        raise ElmoInputError(f"{input_path}: line {batch[error.row][0] + 1}: {error}") from None
                    writer.run(store.add, [index for index, _ in batch], [len(words) for _, words in batch], vectors)
                    output.check()
                    bar.update(len(batch))
                    embedded[0] += len(batch)
                writer.run(store.end_window, window[0][0], len(window), repeats)
                bar.update(len(repeats))
                embedded[0] += len(repeats)
            writer.wait()
            if not forget_sentences:
                index_dataset = h5file.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                index_dataset[0] = json.dumps(key_of_line)

    try:
        write_output(output_path, write, HDF5_FILE, [input_path, *inputs], force)
    finally:
        bar.close()
    return embedded[0]


def part_path(output, rank: int, processes: int) -> Path:
    """Where process `rank` writes its part of `output`: a hidden file beside it."""
    output = Path(output)
    return output.with_name(f".{output.name}.part-{rank}-of-{processes}")


def merge_parts(parts: list[Path], output, force: bool = False, inputs: Iterable = ()) -> int:
    """The per-line files of `parts` (line i in part i modulo their number) as one file `output`, in the input's line
    order, as one process writes it: a line repeated within a part stays a hard link, and `sentence_to_index` maps each
    line to its first key over all parts. Returns the number of lines."""
    import h5py

    def write(path):
        with HDF5Output(path) as output_file, contextlib.ExitStack() as stack:
            sources = [stack.enter_context(h5py.File(part, "r")) for part in parts]
            lines = sum(len(source) - ("sentence_to_index" in source) for source in sources)
            first_copy = {}
            for index in range(lines):
                source = sources[index % len(sources)]
                stored = source[str(index)]
                where = (index % len(sources), h5py.h5o.get_info(stored.id).addr)
                if where in first_copy:
                    output_file.file[str(index)] = output_file.file[first_copy[where]]
                else:
                    source.copy(stored, output_file.file, name=str(index))
                    first_copy[where] = str(index)
                output_file.check()
            if all("sentence_to_index" in source for source in sources):
                key_of_line = {}
                for source in sources:
                    for text, key in json.loads(source["sentence_to_index"][0]).items():
                        if text not in key_of_line or int(key) < int(key_of_line[text]):
                            key_of_line[text] = key
                index_dataset = output_file.file.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())
                index_dataset[0] = json.dumps(dict(sorted(key_of_line.items(), key=lambda item: int(item[1]))))
            counted[0] = lines

    counted = [0]
    write_output(output, write, HDF5_FILE, [*parts, *inputs], force)
    return counted[0]
