"""Training throughput of ElmoForBiLM: tokens per second per direction, as bilm-tf counts them.

    python benchmarks/bench_training.py --size small --batch-size 32 --words 20 --vocab-size 100000 \\
        --num-samples 8192 --threads 2
    python benchmarks/bench_training.py --size small --compare   # the straightforward encoder too, alternating
    python benchmarks/bench_training.py --size mid --corpus data/tinyshakespeare/input.txt --num-samples 1024 \\
        --window 25 --min-count 2 --steps 40 --clock cpu              # real windows of a corpus, as hf-elmo train
    python benchmarks/bench_training.py --size mid ... --profile 30   # then the operators of 30 more steps

One step is what `hf-elmo train` does per batch: forward with the sampled softmax (dropout 0.1), backward,
gradient clipping and an Adagrad update. Each row holds `--words` positions (`<S>`, random words, `</S>`),
targets are Zipf-distributed word ids; tokens/s = batch size x words / median step time, the count
bilm-tf prints (batch_size x unroll_steps per direction). With `--corpus`, the batches are instead the
windows `hf-elmo train` makes of that text (`--split`, `--window`, vocabulary of the words seen at least
`--min-count` times, shuffled with a fixed seed, one new batch per step) and tokens/s counts the real
targets of one direction (bilm-tf predicts at every one of its positions; a packed window also has
boundaries and padding). `--corpus ... --stream` trains on `hf-elmo train --stream`'s batches instead, the
original's recipe: `--batch-size` continuous streams of the text, pieces of `--window` positions, every position
a target, the LSTM state carried from step to step. Like `hf-elmo train`, it keeps the memory a step frees for the
next step (`hf_elmo.training.freed_memory`; `--return-freed-memory` leaves malloc as it is). Prints the machine and
a table.

`--size mid` is a model people train on one machine: character CNN of 384 filters (widths 1-5), two highway
layers, two LSTM layers of 512 cells projected to 64.
"""

import argparse
import itertools
import random
import resource
import string
import time

import numpy as np
import torch
from bench_inference import CLOCKS, machine_description, reference_copy, speedup

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.training.adagrad import Adagrad
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.corpus import SPLITS, build_word_vocabulary
from hf_elmo.training.freed_memory import keep_freed_memory
from hf_elmo.training.streams import DataCollatorForBiLMStreams, StreamWindowDataset
from hf_elmo.training.windows import load_bilm_dataset

MID_SIZE = {
    "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
    "n_highway": 2,
    "cell_dim": 512,
    "projection_dim": 64,
    "num_layers": 2,
}


def make_config(size: str, **kwargs) -> ElmoConfig:
    if size == "mid":
        return ElmoConfig(**MID_SIZE, **kwargs)
    return ElmoConfig.from_preset(size, **kwargs)


def corpus_batches(
    path: str, split: str, window: int, min_count: int, batch_size: int, device: str, stream: bool = False
):
    """The vocabulary size and an endless iterator over `hf-elmo train`'s batches of the corpus at `path` (with
    `stream`, `hf-elmo train --stream`'s)."""
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([path], split, tokenizer, min_count))
    if stream:
        streams = StreamWindowDataset([path], tokenizer, batch_size, window, seed=0, split=split, epochs=1000)
        collate_streams = DataCollatorForBiLMStreams()

        def stream_batches():
            for step in range(streams.steps):
                examples = [streams[step * batch_size + row] for row in range(batch_size)]
                yield {k: v.to(device) for k, v in collate_streams(examples).items()}

        return len(tokenizer.word_vocabulary), stream_batches()
    dataset = load_bilm_dataset([path], tokenizer, window, split).shuffle(seed=0)
    collate = DataCollatorForBiLM()

    def batches():
        for start in itertools.cycle(range(0, len(dataset) - batch_size + 1, batch_size)):
            rows = dataset[start : start + batch_size]
            examples = [{"input_ids": ids, "labels": labels} for ids, labels in zip(rows["input_ids"], rows["labels"])]
            yield {k: v.to(device) for k, v in collate(examples).items()}

    return len(tokenizer.word_vocabulary), batches()


def make_batch(batch_size: int, words: int, vocab_size: int, device: str, seed: int = 0) -> dict:
    rng = random.Random(seed)
    sentences = [
        ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(words - 2)]
        for _ in range(batch_size)
    ]
    batch = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    ids = np.minimum(np.random.default_rng(seed).zipf(1.1, size=(batch_size, words, 2)) - 1, vocab_size - 1)
    labels = torch.from_numpy(ids)
    labels[:, -1, 0] = -100  # nothing after </S>
    labels[:, 0, 1] = -100  # nothing before <S>
    batch["labels"] = labels
    return {k: v.to(device) for k, v in batch.items()}


def peak_memory_mib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "medium", "original", "mid"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--words", type=int, default=20, help="positions per row, <S> and </S> included")
    parser.add_argument("--vocab-size", type=int, default=100_000)
    parser.add_argument("--num-samples", type=int, default=8192, help="sampled-softmax negatives (0: full softmax)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: autocast")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", help="train on the windows of this text file instead of random words")
    parser.add_argument("--split", choices=SPLITS, default="pretokenizer", help="with --corpus")
    parser.add_argument("--window", type=int, default=20, help="with --corpus: positions per window")
    parser.add_argument("--min-count", type=int, default=1, help="with --corpus: vocabulary of words seen this often")
    parser.add_argument(
        "--stream", action="store_true", help="with --corpus: continuous streams, the state carried (train --stream)"
    )
    parser.add_argument(
        "--return-freed-memory",
        action="store_true",
        help="leave malloc as it is (hf-elmo train keeps freed memory for the next step: training.freed_memory)",
    )
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall", help="cpu: processor time of the process")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--compare", action="store_true", help="also time the straightforward encoder, alternating with the fast one"
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="then profile N more steps: where a step's time goes"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if not args.return_freed_memory:
        keep_freed_memory()
    if args.corpus:
        args.vocab_size, batches = corpus_batches(
            args.corpus, args.split, args.window, args.min_count, args.batch_size, args.device, args.stream
        )
    elif args.stream:
        parser.error("--stream needs --corpus")
    else:
        batches = itertools.repeat(make_batch(args.batch_size, args.words, args.vocab_size, args.device))
    config = make_config(args.size, vocab_size=args.vocab_size, num_softmax_samples=args.num_samples, dropout=0.1)
    models = {"fast": ElmoForBiLM(config).to(args.device).train()}
    if args.compare:
        models["reference"] = reference_copy(models["fast"])
    optimizers = {
        name: Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0 / args.words**2)
        for name, model in models.items()
    }
    device_type = args.device.split(":")[0]
    autocast = torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

    clock = CLOCKS[args.clock]
    carried = dict.fromkeys(models)  # with --stream: each model's state at the end of its last step

    def train_step(name, batch):
        model, optimizer = models[name], optimizers[name]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start, faults_before = clock(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with autocast:
            if args.stream:
                outputs = model(**batch, state=carried[name], use_cache=True, split_directions=True)
                carried[name] = tuple(t.detach() for t in outputs.state)
                loss = outputs.loss
            else:
                loss = model(**batch).loss
        loss.backward()
        optimizer.clip_grad_norm_(10.0 / args.words)  # clipped inside the step, as hf-elmo train does
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return clock() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before

    times = {name: [] for name in models}
    page_faults = dict.fromkeys(models, 0)  # minor: first writes to fresh pages
    tokens = []  # per step: tokens of one direction
    for step in range(args.warmup + args.steps):
        batch = next(batches)
        for name in models:  # alternating, so that both paths see the same machine load
            seconds, faults = train_step(name, batch)
            if step >= args.warmup:
                times[name].append(seconds)
                page_faults[name] += faults
        if step >= args.warmup:
            labels = batch["labels"]
            tokens.append(int((labels[..., 0] != -100).sum()) if args.corpus else labels.shape[0] * labels.shape[1])

    print(f"machine: {machine_description(args.device)}")
    if args.corpus:
        rows = "streams in pieces" if args.stream else "windows"
        data = (
            f"{args.corpus}: batch {args.batch_size} {rows} of {args.window}, "
            f"{sum(tokens) / len(tokens):.0f} targets per direction and step on average"
        )
    else:
        data = f"batch {args.batch_size} x {args.words} words"
    print(
        f"{args.size}: {sum(p.numel() for p in models['fast'].parameters()):,} parameters with the softmax; {data}, "
        f"vocabulary {args.vocab_size:,}, {args.num_samples or 'full softmax'} samples, {args.dtype}, {args.device}, "
        f"{args.clock} clock, median of {args.steps} steps"
    )
    print(f"{'size':<10}{'path':<11}{'tokens/s':>10}{'s/step':>9}")
    for name, values in times.items():
        # Steps of a corpus differ in size: the median of the steps' rates (without a corpus, tokens / median time).
        seconds = sorted(values)[len(values) // 2]
        rate = sorted(n / t for n, t in zip(tokens, values))[len(values) // 2]
        print(f"{args.size:<10}{name:<11}{rate:>10,.0f}{seconds:>9.3f}")
    if args.compare:
        print(f"{'':<21}{speedup(times)}")
    print(f"peak memory of the process: {peak_memory_mib(args.device):,.0f} MiB")
    faults = ", ".join(f"{name} {count / args.steps:,.0f}" for name, count in page_faults.items())
    print(f"minor page faults per timed step (the warm-up's not counted): {faults}")
    if args.profile:
        print_profile(lambda: train_step("fast", next(batches)), args.profile, args.device)


def print_profile(step, steps: int, device: str):
    """The operators that take a step's time (self time per step) and the rate of its matrix products, beside the
    rate of one large float32 product on the same threads (what the processor gives such products at best)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities, with_flops=True) as profiler:
        for _ in range(steps):
            step()
    events = sorted(profiler.key_averages(), key=lambda e: -e.self_device_time_total - e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) / steps / 1e3
    print(f"\nwhere a step's time goes ({steps} steps profiled; {total:.1f} ms of operators per step on the host)")
    print(f"{'operator':<44}{'ms/step':>9}{'calls/step':>12}{'GFLOP/s':>9}")
    for event in events[:15]:
        microseconds = event.self_device_time_total or event.self_cpu_time_total
        milliseconds = microseconds / steps / 1e3
        rate = f"{event.flops / microseconds / 1e3:.0f}" if event.flops else ""
        print(f"{event.key[:43]:<44}{milliseconds:>9.2f}{event.count / steps:>12.1f}{rate:>9}")
    square = torch.randn(2048, 2048, device=device)
    best = float("inf")
    for _ in range(4):
        began = time.perf_counter()
        square @ square
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    rate = 2 * 2048**3 / best / 1e9
    print(f"one float32 product 2,048 x 2,048 x 2,048 on the same threads: {rate:,.0f} GFLOP/s (best of four)")


if __name__ == "__main__":
    main()
