"""Training throughput of ElmoForBiLM: tokens per second per direction, as bilm-tf counts them.

    python benchmarks/bench_training.py --size small --batch-size 32 --words 20 --vocab-size 100000 \\
        --num-samples 8192 --threads 2
    python benchmarks/bench_training.py --size small --compare   # the straightforward encoder too, alternating

One step is what `hf-elmo train` does per batch: forward with the sampled softmax (dropout 0.1), backward,
gradient clipping and an Adagrad update. Each row holds `--words` positions (`<S>`, random words, `</S>`),
targets are Zipf-distributed word ids; tokens/s = batch size x words / median step time, the count
bilm-tf prints (batch_size x unroll_steps per direction). Prints the machine and a table.
"""

import argparse
import random
import resource
import string
import time

import numpy as np
import torch

from hf_elmo.adagrad import Adagrad  # noqa: E402
from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer

from bench_inference import machine_description, reference_copy, speedup


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
    parser.add_argument("--size", default="small", choices=["small", "medium", "original"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--words", type=int, default=20, help="positions per row, <S> and </S> included")
    parser.add_argument("--vocab-size", type=int, default=100_000)
    parser.add_argument("--num-samples", type=int, default=8192, help="sampled-softmax negatives (0: full softmax)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: autocast")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--compare", action="store_true", help="also time the straightforward encoder, alternating with the fast one"
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ElmoConfig.from_preset(
        args.size, vocab_size=args.vocab_size, num_softmax_samples=args.num_samples, dropout=0.1
    )
    models = {"fast": ElmoForBiLM(config).to(args.device).train()}
    if args.compare:
        models["reference"] = reference_copy(models["fast"])
    optimizers = {
        name: Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0 / args.words**2)
        for name, model in models.items()
    }
    batch = make_batch(args.batch_size, args.words, args.vocab_size, args.device)
    device_type = args.device.split(":")[0]
    autocast = torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")

    def train_step(name):
        model, optimizer = models[name], optimizers[name]
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0 / args.words)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start

    times = {name: [] for name in models}
    for step in range(args.warmup + args.steps):
        for name in models:  # alternating, so that both paths see the same machine load
            seconds = train_step(name)
            if step >= args.warmup:
                times[name].append(seconds)

    print(f"machine: {machine_description(args.device)}")
    print(
        f"{args.size}: {sum(p.numel() for p in models['fast'].parameters()):,} parameters with the softmax; batch "
        f"{args.batch_size} x {args.words} words, vocabulary {args.vocab_size:,}, "
        f"{args.num_samples or 'full softmax'} samples, {args.dtype}, {args.device}, median of {args.steps} steps"
    )
    print(f"{'size':<10}{'path':<11}{'tokens/s':>10}{'s/step':>9}")
    for name, values in times.items():
        seconds = sorted(values)[len(values) // 2]
        print(f"{args.size:<10}{name:<11}{args.batch_size * args.words / seconds:>10,.0f}{seconds:>9.3f}")
    if args.compare:
        print(f"{'':<21}{speedup(times)}")
    print(f"peak memory of the process: {peak_memory_mib(args.device):,.0f} MiB")


if __name__ == "__main__":
    main()
