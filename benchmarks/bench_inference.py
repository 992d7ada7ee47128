"""Inference throughput of ElmoModel with random weights: words per second (boundaries not counted).

    python benchmarks/bench_inference.py --sizes small original --batch-size 32 --words 20 --threads 2

Each sentence is `--words` random words of 3-10 lowercase letters; all layers are computed, as a user
embedding text would. Prints the machine and a table.
"""

import argparse
import platform
import random
import string
import time

import torch

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer


def machine_description(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if device.startswith("cuda"):
        text += f", {torch.cuda.get_device_name(device)}"
    return text


def random_sentences(batch_size: int, words: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [
        ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(words)]
        for _ in range(batch_size)
    ]


def random_model(config: ElmoConfig, device: str, dtype: torch.dtype) -> ElmoModel:
    with torch.device("meta"):
        model = ElmoModel(config)
    model = model.to_empty(device=device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():  # timing only needs plausible magnitudes, not a careful init
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
    return model.to(dtype).eval()


def time_inference(model, batch, repeats: int, warmup: int) -> float:
    """Median seconds per forward pass."""
    times = []
    with torch.inference_mode():
        for i in range(warmup + repeats):
            if batch["input_ids"].is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(**batch, output_hidden_states=True)
            if batch["input_ids"].is_cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], choices=["small", "medium", "original"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--words", type=int, default=20, help="words per sentence")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"machine: {machine_description(args.device)}")
    print(f"batch {args.batch_size} sentences x {args.words} words, {args.dtype}, {args.device}")
    print(f"{'size':<10}{'words/s':>12}{'s/batch':>10}")
    tokenizer = ElmoTokenizer()
    batch = tokenizer(
        random_sentences(args.batch_size, args.words), is_split_into_words=True, padding=True, return_tensors="pt"
    ).to(args.device)
    for size in args.sizes:
        model = random_model(ElmoConfig.from_preset(size), args.device, dtype)
        seconds = time_inference(model, batch, args.repeats, args.warmup)
        print(f"{size:<10}{args.batch_size * args.words / seconds:>12,.0f}{seconds:>10.3f}")


if __name__ == "__main__":
    main()
