"""Preparing training windows at scale: generates a corpus of N words (Zipfian over a 13,000-word vocabulary, 5-18
words a line, seeded) and measures, in a fresh process per size, the preparation `hf-elmo train` does (the word
table's pass, then the compact windows: `WordTable.of_files`, `load_compact_bilm_dataset`): time, words a second,
bytes of cache per word and peak memory (allocated, resident with the mapped cache, and the largest preparing worker's
resident, shared pages included); then the collation rate of shuffled batches through a `DataLoader`, in the
main process and with data-loader workers (`--workers`): the batches `ElmoTrainer` reads, the stored windows
(`DataCollatorForBiLM(stored_only=True)`), which it makes into the model's batches on the training device (the
milliseconds that takes on this CPU are given apart), or with `--full-batches` the model's batches made by the
collator.

    python benchmarks/bench_data_preparation.py --words 1000000 10000000
    python benchmarks/bench_data_preparation.py --words 1000000 --previous   # also load_bilm_dataset's full rows
    python benchmarks/bench_data_preparation.py --words 1000000 --workers 0 1 2 --full-batches [--host-checks]

With workers, the second table gives what sizes a loader on a machine with more cores than this one: the positions a
worker collates per second of its processor time (a worker's rate where it has a core of its own), and the main
process's processor time per batch received (the ceiling of the loader however many workers it has). `--host-checks`
wraps the collator of full batches as `ElmoTrainer` does on a GPU for batches not made from a word table (the model's
checks of each batch, in the loader's processes).

The vocabulary is built before the clock starts (with `--vocab`, `hf-elmo train` reads a given one instead).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

VOCABULARY_SIZE = 13_000
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


def generate_corpus(path: Path, words: int, seed: int = 0, lines_per_block: int = 100_000):
    """`words` words (about) in lines of 5-18 words drawn with probability proportional to 1 / rank."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 11, VOCABULARY_SIZE)
    vocabulary = [LETTERS[rng.integers(0, 26, n)].tobytes().decode() for n in lengths]
    weights = 1.0 / np.arange(1, VOCABULARY_SIZE + 1)
    weights /= weights.sum()
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < words:
            per_line = rng.integers(5, 19, lines_per_block)
            per_line = per_line[: np.searchsorted(np.cumsum(per_line), words - written, side="right") + 1]
            ids = rng.choice(VOCABULARY_SIZE, size=int(per_line.sum()), p=weights)
            tokens = [vocabulary[i] for i in ids]
            ends = np.cumsum(per_line)
            f.write("".join(" ".join(tokens[end - n : end]) + "\n" for n, end in zip(per_line, ends)))
            written += int(per_line.sum())
    return written


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class PeakMemory:
    """The largest anonymous memory (`RssAnon`: what the process allocated) seen while it runs, sampled every 20 ms.
    The resident set's peak (`ru_maxrss`) also counts the pages of the memory-mapped cache files read so far, which
    the kernel can drop at any time: it grows with the corpus where the allocations do not."""

    def __enter__(self):
        self.peak, self.running = 0, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()


def measure(
    corpus: str,
    vocabulary: str,
    cache: str,
    previous: bool,
    batch_size: int,
    window: int,
    workers,
    host_checks: bool,
    full_batches: bool,
) -> dict:
    """One preparation in this process (fresh: its peak memory is the preparation's), then the loaders."""
    import torch

    from hf_elmo import ElmoConfig, ElmoTokenizer
    from hf_elmo.training.collator import DataCollatorForBiLM
    from hf_elmo.training.trainer import HostCheckedCollator
    from hf_elmo.training.windows import load_bilm_dataset
    from hf_elmo.training.word_table import STORED_PADDING, STORED_WINDOWS, WordTable, load_compact_bilm_dataset
    from hf_elmo.word_vocabulary import read_word_vocabulary

    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(read_word_vocabulary(vocabulary))
    start = time.perf_counter()
    with PeakMemory() as memory:
        if previous:
            dataset, collate = load_bilm_dataset([corpus], tokenizer, window, cache_dir=cache), DataCollatorForBiLM()
        else:
            table = WordTable.of_files([corpus], tokenizer)
            dataset = load_compact_bilm_dataset([corpus], table, tokenizer, window, cache_dir=cache)
            collate = DataCollatorForBiLM(words=table, stored_only=not full_batches)
        seconds = time.perf_counter() - start
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # before the loaders' processes
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if host_checks:
        collate = HostCheckedCollator(collate, ElmoConfig(vocab_size=len(tokenizer.word_vocabulary)))
    rates, main_milliseconds, worker_rates = {}, {}, {}
    for count in workers:
        batches_timed = 200 * max(count, 1)
        # Exactly the batches read, the first (untimed: the workers' start) and the timed ones, so that the workers'
        # processor time, known once they have exited, is theirs.
        order = torch.randperm(len(dataset))[: (batches_timed + 1) * batch_size].tolist()
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=order, collate_fn=collate, num_workers=count
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        batches, positions = iter(loader), 0
        next(batches)
        start, processor = time.perf_counter(), time.process_time()
        for batch in batches:
            if STORED_WINDOWS in batch:
                positions += int(batch[STORED_WINDOWS].ne(STORED_PADDING).sum()) - 2 * len(batch[STORED_WINDOWS])
            else:
                positions += int(batch["attention_mask"].sum())
        rates[count] = positions / (time.perf_counter() - start)
        main_milliseconds[count] = (time.process_time() - processor) / batches_timed * 1000
        del batches  # its workers exit, and their processor time joins RUSAGE_CHILDREN
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if count:
            worker_seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            worker_rates[count] = positions * (batches_timed + 1) / batches_timed / worker_seconds
    expand_milliseconds = None
    if not previous and not full_batches:  # on this CPU; on a GPU, a few gathers there
        order = torch.randperm(len(dataset))[: 200 * batch_size].tolist()
        stored = [
            collate(dataset.__getitems__(order[i : i + batch_size]))[STORED_WINDOWS]
            for i in range(0, len(order), batch_size)
        ]
        processor = time.process_time()
        for windows in stored:
            table.expand(windows)
        expand_milliseconds = (time.process_time() - processor) / len(stored) * 1000
    return {
        "seconds": seconds,
        "expand_milliseconds_per_batch": expand_milliseconds,
        "peak_bytes": peak,
        "peak_anonymous_bytes": memory.peak,
        "worker_peak_bytes": worker_peak,
        "collated_positions_per_second": rates,
        "main_process_milliseconds_per_batch": main_milliseconds,
        "positions_per_worker_processor_second": worker_rates,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--previous", action="store_true", help="also measure load_bilm_dataset (full rows)")
    parser.add_argument("--folder", help="where the corpora and caches go (default: a temporary folder, removed)")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0], help="data loader processes to measure with")
    parser.add_argument("--host-checks", action="store_true", help="the model's checks of each batch in the loader")
    parser.add_argument("--full-batches", action="store_true", help="the collator makes the model's batches")
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)  # corpus vocabulary cache previous: the child
    args = parser.parse_args()
    if args.measure:
        corpus, vocabulary, cache, previous = args.measure
        options = (args.batch_size, args.window, args.workers, args.host_checks, args.full_batches)
        print(json.dumps(measure(corpus, vocabulary, cache, previous == "1", *options)))
        return
    from bench_inference import machine_description

    from hf_elmo.training.corpus import build_word_vocabulary
    from hf_elmo.word_vocabulary import write_word_vocabulary

    print(machine_description("cpu"))
    rates = " | ".join(f"collated positions/s, {count} workers" for count in args.workers)
    memory = "peak allocated MiB | peak resident MiB | largest preparing worker's peak resident MiB"
    print(f"| words | preparation | seconds | words/s | cache bytes/word | {memory} | {rates} |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(args.workers))
    loaders = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.folder or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for size in args.words:
            corpus = folder / f"corpus-{size}.txt"
            words = generate_corpus(corpus, size)
            vocabulary = folder / f"vocab-{size}.txt"
            write_word_vocabulary(build_word_vocabulary([corpus]), vocabulary)
            for previous in ([True] if args.previous else []) + [False]:
                cache = folder / f"cache-{size}-{'previous' if previous else 'compact'}"
                child = [sys.executable, __file__, "--measure", str(corpus), str(vocabulary), str(cache)]
                child += [
                    str(int(previous)),
                    "--window",
                    str(args.window),
                    "--batch-size",
                    str(args.batch_size),
                    "--workers",
                ]
                child += [str(count) for count in args.workers] + (["--host-checks"] if args.host_checks else [])
                child += ["--full-batches"] if args.full_batches else []
                environment = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
                output = subprocess.run(child, check=True, capture_output=True, text=True, env=environment).stdout
                result = json.loads(output.strip().splitlines()[-1])
                print(
                    f"| {words:,} | {'load_bilm_dataset' if previous else 'compact'} | {result['seconds']:.1f} | "
                    f"{words / result['seconds']:,.0f} | {folder_bytes(cache) / words:.1f} | "
                    f"{result['peak_anonymous_bytes'] / 2**20:,.0f} | {result['peak_bytes'] / 2**20:,.0f} | "
                    f"{result['worker_peak_bytes'] / 2**20:,.0f} | "
                    + " | ".join(f"{rate:,.0f}" for rate in result["collated_positions_per_second"].values())
                    + " |",
                    flush=True,
                )
                loaders.append((words, previous, result))
    print(
        "\n| words | preparation | loader workers | collated positions/s | main process CPU ms a batch | positions a "
        "worker CPU second |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for words, previous, result in loaders:
        for count, rate in result["collated_positions_per_second"].items():
            worker = result["positions_per_worker_processor_second"].get(count)
            print(
                f"| {words:,} | {'load_bilm_dataset' if previous else 'compact'} | {count} | {rate:,.0f} | "
                f"{result['main_process_milliseconds_per_batch'][count]:.2f} | "
                f"{'' if worker is None else f'{worker:,.0f}'} |"
            )
    for words, _, result in loaders:
        if result["expand_milliseconds_per_batch"] is not None:
            print(
                f"\n{words:,} words: the stored windows made into the model's batches (`WordTable.expand`, which "
                f"ElmoTrainer runs on the training device) take {result['expand_milliseconds_per_batch']:.2f} ms a "
                "batch on this CPU."
            )


if __name__ == "__main__":
    main()
