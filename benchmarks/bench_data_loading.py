"""Host time to make one training batch, in the main process, as `Trainer` reads them: `load_bilm_dataset` rows
through a shuffled `DataLoader` and `DataCollatorForBiLM` (windows), or with `--stream` the items of
`StreamWindowDataset` through a sequential `DataLoader` and `DataCollatorForBiLMStreams` (`hf-elmo train --stream`).

    python benchmarks/bench_data_loading.py --corpus data/tinyshakespeare/input.txt --batch-sizes 32 128
    python benchmarks/bench_data_loading.py --stream --window 20 --batch-sizes 128
    python benchmarks/bench_data_loading.py --stream --window 20 --batch-sizes 128 --words 1000000 --processes 1 2 3

`--stream --resume-at N` times what a resumed run's first step costs after N steps: the streams laid out again from
the start, or from the position saved with the checkpoint (`StreamWindowDataset.resume_at`).

`--words N` reads a generated corpus of N words instead (Zipfian, `bench_data_preparation.generate_corpus`).
`--stream --processes 1 2 3` also times the share of one of 2 or 3 loader workers (`--dataloader-num-workers`):
each makes every 2nd or 3rd step but lays out all of them, the streams being one sequence; the rate given is that of
all the workers together, on as many free cores, leaving out what passing the batches between processes costs.
This work runs on the host each step (in the main process with `--dataloader-num-workers 0`, the CPUs' default, or
spread over the workers); on a GPU it must stay below the step's GPU time, or the GPU waits for it.
"""

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from bench_data_preparation import generate_corpus
from bench_inference import machine_description

from hf_elmo import ElmoTokenizer, keep_freed_memory
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.corpus import build_word_vocabulary
from hf_elmo.training.streams import DataCollatorForBiLMStreams, StreamWindowDataset
from hf_elmo.training.windows import load_bilm_dataset


def batch_read_ms(dataset, batch_size: int, batches: int = 40, collate=None) -> float:
    """Mean host milliseconds per shuffled, collated batch of `dataset` (after a first batch), by `collate` (default:
    `DataCollatorForBiLM()`, for the full rows of `load_bilm_dataset`)."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, collate_fn=collate or DataCollatorForBiLM(), drop_last=True
    )
    return mean_ms_after_first(iter(loader), min(batches, len(loader) - 1))[0]


def stream_step_ms(corpus: str, tokenizer: ElmoTokenizer, rows: int, window: int, steps: int, every: int = 1):
    """Mean host milliseconds (wall-clock, CPU) per `--stream` step of `rows` streams in pieces of `window` (after a
    first step): the dataset's items fetched in order and collated, as `Trainer`'s sequential sampler and loader do.
    With `every` > 1 only every `every`-th step is made, as one of `every` loader workers does (each lays out the
    others' steps too)."""
    dataset = StreamWindowDataset([corpus], tokenizer, rows, window, 0, "whitespace", steps=(steps + 1) * every)
    own_steps = [list(range(step * rows, (step + 1) * rows)) for step in range(0, (steps + 1) * every, every)]
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=own_steps, collate_fn=DataCollatorForBiLMStreams())
    return mean_ms_after_first(iter(loader), steps)


def resumed_first_step_seconds(corpus: str, tokenizer: ElmoTokenizer, rows: int, window: int, steps: int):
    """Seconds to the first step after `steps` steps of a resumed `--stream` run: laid out again from the start, and
    from the saved position of step `steps`."""
    make = partial(StreamWindowDataset, [corpus], tokenizer, rows, window, 0, "whitespace", steps=steps + 1)
    position = make()[(steps - 1) * rows]["stream_position"]
    start = time.perf_counter()
    from_start = make()[steps * rows]
    middle = time.perf_counter()
    resumed = make()
    resumed.resume_at(position)
    from_position = resumed[steps * rows]
    end = time.perf_counter()
    assert all((from_start[k] == from_position[k]).all() for k in from_start if k != "stream_position")
    return middle - start, end - middle


def mean_ms_after_first(reader, count: int) -> tuple[float, float]:
    """Mean milliseconds per item of `reader` after the first: wall-clock, and the process's CPU time (on a shared
    machine, the work itself: the wall-clock also counts waits for a core)."""
    next(reader)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(count):
        next(reader)
    return (time.perf_counter() - start) / count * 1e3, (time.process_time() - cpu_start) / count * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="data/tinyshakespeare/input.txt")
    parser.add_argument("--words", type=int, help="generate a Zipfian corpus of this many words instead")
    parser.add_argument("--stream", action="store_true", help="time --stream steps instead of windows")
    parser.add_argument("--window", type=int, default=25)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--resume-at", type=int, nargs="+", default=[], help="--stream: resume after these steps")
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[1],
        help="--stream: loader processes (the main one, or workers) whose share of the steps one process times",
    )
    args = parser.parse_args()
    print(machine_description("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        corpus = args.corpus
        if args.words:
            corpus = str(Path(folder) / "corpus.txt")
            generate_corpus(Path(corpus), args.words)
        tokenizer = ElmoTokenizer()
        tokenizer.set_word_vocabulary(build_word_vocabulary([corpus], "whitespace", tokenizer, 2))
        if args.stream and args.resume_at:
            print("| rows x window | resumed after steps | first step: laid out from the start | from the position |")
            print("| --- | ---: | ---: | ---: |")
            for rows in args.batch_sizes:
                for steps in args.resume_at:
                    again, saved = resumed_first_step_seconds(corpus, tokenizer, rows, args.window, steps)
                    print(f"| {rows} x {args.window} | {steps:,} | {again:.2f} s | {saved:.2f} s |", flush=True)
            return
        if args.stream:
            keep_freed_memory()  # as hf-elmo train does
            print("| rows x window | processes | ms per step made | CPU ms | positions/s (by CPU time) |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for rows in args.batch_sizes:
                for processes in args.processes:
                    ms, cpu_ms = stream_step_ms(corpus, tokenizer, rows, args.window, args.batches, processes)
                    rate, cpu_rate = (processes * rows * args.window / t * 1e3 for t in (ms, cpu_ms))
                    row = f"| {rows} x {args.window} | {processes} | {ms:.2f} | {cpu_ms:.2f} |"
                    print(f"{row} {rate:,.0f} ({cpu_rate:,.0f}) |", flush=True)
            return
        dataset = load_bilm_dataset([corpus], tokenizer, args.window)
        print("| batch | ms per batch |\n| ---: | ---: |")
        for batch_size in args.batch_sizes:
            print(f"| {batch_size} | {batch_read_ms(dataset, batch_size, args.batches):.1f} |")


if __name__ == "__main__":
    main()
