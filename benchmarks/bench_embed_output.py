"""What `hf-elmo embed`'s output file costs per line, without the model: the per-line layout (AllenNLP's, one
dataset per line) against the packed one (`--layout packed`: one `vectors` dataset and `spans`), alternating runs.

    python benchmarks/bench_embed_output.py --lines 20000 --width 1024 --rounds 3
    python benchmarks/bench_embed_output.py --lines 20000 --width 1024 --layers 3   # --all of the original model
    python benchmarks/bench_embed_output.py --model DIR --input lines.txt --batch-size 2048   # hf-elmo embed --top
    python benchmarks/bench_embed_output.py --model original --device cuda --dtype bfloat16 --input lines.txt

Each run writes the same batches (random float32 vectors, `--batch-size` lines each, the word counts of Tiny
Shakespeare's lines in file order) through `embed_elmo.PerLineStore` or `PackedStore` into a fresh file in
`--folder`, as `embed_file` does after the model. Reported: lines/s, words/s and MB/s of vectors written, the file's
closing included. With `--model` (a model folder, or a preset name for random weights of that size), `embed_file`
itself runs on `--input` with that model (`--top`), alternating the two layouts in one process: tokenizing and the
model included, the loading of the model not; each layout also "written in turn" (the former way: a batch written
before the next is computed, where `embed_file` writes it on a thread of its own meanwhile).
"""

import argparse
import contextlib
import tempfile
import time
import unittest.mock
from pathlib import Path

import h5py
import numpy as np
import torch
from bench_inference import machine_description, random_model

from hf_elmo import ELMO_PRESETS, ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.features import embed as embed_elmo
from hf_elmo.features.embed import Embedder, LayerSelector, PackedStore, PerLineStore, embed_file, read_lines

CORPUS = Path(__file__).resolve().parent.parent / "data" / "tinyshakespeare" / "input.txt"


def word_counts(lines: int) -> list[int]:
    counts = [len(line.split()) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    return (counts * (lines // len(counts) + 1))[:lines]


def alternate(args, measure, layouts=("per-line", "packed")) -> dict[str, list[float]]:
    """`measure(path, layout)` (seconds) for each layout, `args.rounds` times, alternating so that all see the same
    machine load; each writes into a fresh file in `args.folder`, removed after."""
    times = {layout: [] for layout in layouts}
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        for _ in range(args.rounds):
            for number, layout in enumerate(times):
                path = Path(folder) / f"{number}.hdf5"
                times[layout].append(measure(path, layout))
                path.unlink()
    return times


def print_rates(times: dict[str, list[float]], lines: int, words: int, megabytes: float | None = None):
    """A Markdown table of each layout's median rates."""
    print("| layout | lines/s | words/s |" + (" MB/s |" if megabytes else "") + " s (median) |")
    print("| --- | ---: | ---: |" + (" ---: |" if megabytes else "") + " ---: |")
    for layout, values in times.items():
        seconds = sorted(values)[len(values) // 2]
        rate = f" {megabytes / seconds:,.0f} |" if megabytes else ""
        print(f"| {layout} | {lines / seconds:,.0f} | {words / seconds:,.0f} |{rate} {seconds:.2f} |")


def write(path, layout: str, batches: list[tuple[list[int], list[int], np.ndarray]], empty_shape) -> float:
    start = time.perf_counter()
    with h5py.File(path, "w") as h5file:
        store = PackedStore(h5file, empty_shape, np.float32) if layout == "packed" else PerLineStore(h5file)
        for indices, counts, vectors in batches:
            store.add(indices, counts, vectors)
        store.end_window(0, sum(len(indices) for indices, _, _ in batches), [])
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--width", type=int, default=1024, help="2P: 1,024 for the original model")
    parser.add_argument("--layers", type=int, default=0, help="0: one layer per line (--top); L + 1 for --all")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", default=None, help="where the files are written (default: a temporary folder)")
    parser.add_argument("--model", default=None, help="a model folder: time embed_file end to end instead")
    parser.add_argument("--input", default=None, help="with --model: the text to embed, one sentence per line")
    parser.add_argument("--device", default="cpu", help="with --model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="with --model: weights")
    args = parser.parse_args()
    if args.model:
        return end_to_end(args)
    counts = word_counts(args.lines)
    layers = (args.layers,) if args.layers else ()
    rng = np.random.default_rng(0)
    batches = []
    for first in range(0, args.lines, args.batch_size):
        batch_counts = counts[first : first + args.batch_size]
        vectors = rng.standard_normal((*layers, sum(batch_counts), args.width), dtype=np.float32)
        batches.append((list(range(first, first + len(batch_counts))), batch_counts, vectors))
    words = sum(counts)
    megabytes = sum(vectors.nbytes for _, _, vectors in batches) / 1e6
    times = alternate(args, lambda path, layout: write(path, layout, batches, (*layers, 0, args.width)))
    print(f"machine: {machine_description('cpu')}")
    print(
        f"{args.lines:,} lines, {words:,} words, vectors {(*layers, 'n', args.width)} float32 ({megabytes:,.0f} MB), "
        f"batches of {args.batch_size}, median of {args.rounds}; h5py {h5py.version.version}, "
        f"HDF5 {h5py.version.hdf5_version}, torch {torch.__version__}"
    )
    print_rates(times, args.lines, words, megabytes)


WRITTEN_IN_TURN = ", written in turn"


class InTurn:
    """The former way, for comparison: each batch written before the next is computed (`embed_elmo._InOrder` writes
    it on a thread of its own meanwhile)."""

    def run(self, function, *args):
        function(*args)

    def wait(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass


def end_to_end(args):
    dtype = getattr(torch, args.dtype)
    if args.model in ELMO_PRESETS:
        model, tokenizer = random_model(ElmoConfig.from_preset(args.model), args.device, dtype), ElmoTokenizer()
    else:
        model = ElmoModel.from_pretrained(args.model).to(args.device, dtype).eval()
        tokenizer = ElmoTokenizer.from_pretrained(args.model)
    embedder = Embedder(model, tokenizer, LayerSelector("top", model.config.num_layers))
    words = sum(len(line.split()) for line in Path(args.input).read_text(encoding="utf-8").splitlines())
    lines = sum(1 for _ in read_lines(args.input))

    def embed(path, layout):
        start = time.perf_counter()
        in_turn = layout.endswith(WRITTEN_IN_TURN)
        with unittest.mock.patch.object(embed_elmo, "_InOrder", InTurn) if in_turn else contextlib.nullcontext():
            packed = layout.startswith("packed")
            embed_file(embedder, args.input, path, batch_size=args.batch_size, packed=packed, progress=False)
        return time.perf_counter() - start

    times = alternate(args, embed, ("per-line", "packed", "per-line" + WRITTEN_IN_TURN, "packed" + WRITTEN_IN_TURN))
    print(f"machine: {machine_description(args.device)}")
    print(
        f"embed_file --top, {args.input}: {lines:,} lines, {words:,} words; model {args.model} "
        f"(width {model.config.hidden_size}, {args.dtype} on {args.device}), batches of {args.batch_size}, median of "
        f"{args.rounds}"
    )
    print_rates(times, lines, words)


if __name__ == "__main__":
    main()
