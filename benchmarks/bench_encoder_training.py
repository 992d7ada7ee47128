"""Training throughput of the ELMo encoder alone (ElmoModel forward + backward), tokens per second.

    python benchmarks/bench_encoder_training.py --sizes small --batch-size 16 --unroll 20 --threads 2
    python benchmarks/bench_encoder_training.py --compare        # fast path vs the reference, alternating
    python benchmarks/bench_encoder_training.py --autocast bfloat16

As in bilm-tf's training: each row is a window of `--unroll` tokens of a continuous text (no `<S>`/`</S>`
added per window), the LSTM state is carried from batch to batch (detached), dropout as in the config is on.
The loss is a fixed random projection of every layer (so every parameter gets a gradient); no softmax and
no optimizer step: the full language-model numbers come from `bench_training.py`. Tokens are counted once
per window position (bilm-tf's count), although both directions process each of them. Peak memory is
measured over one step as in `bench_inference.py`.
"""

import argparse
import random
import string

import torch
from bench_inference import (
    add_common_arguments,
    machine_description,
    measure,
    median,
    random_model,
    reference_copy,
    speedup,
)

from hf_elmo import ElmoConfig
from hf_elmo.character_rows import words_to_char_ids


def random_windows(batch_size: int, unroll: int, seed: int) -> torch.Tensor:
    """`(B, unroll, 50)` character ids of random words of 3-10 letters."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(batch_size * unroll)]
    return torch.from_numpy(words_to_char_ids(words)).view(batch_size, unroll, -1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small"], choices=["small", "medium", "original"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--unroll", type=int, default=20, help="tokens per window (bilm-tf's unroll_steps)")
    add_common_arguments(parser)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    print(f"machine: {machine_description(args.device)}")
    print(
        f"batch {args.batch_size} windows x {args.unroll} tokens, float32 weights, autocast {args.autocast or 'off'}, "
        f"{args.device}, {args.clock} clock, median of {args.repeats} after {args.warmup} warm-up"
    )
    print(f"{'size':<10}{'path':<11}{'tokens/s':>10}{'s/step':>9}{'peak MiB':>10}")
    for size in args.sizes:
        times, peaks = benchmark_size(ElmoConfig.from_preset(size), args)
        for name, seconds in times.items():
            tokens_per_second = args.batch_size * args.unroll / median(seconds)
            print(f"{size:<10}{name:<11}{tokens_per_second:>10,.0f}{median(seconds):>9.3f}{peaks[name]:>10}")
        if args.compare:
            print(f"{'':<10}{speedup(times)}")


class TrainingPath:
    """Training steps of one path (`ElmoModel` or the reference) over a few batches, the state carried."""

    def __init__(self, module, batches: list[torch.Tensor], directions: list[torch.Tensor], autocast):
        self.module, self.batches, self.directions, self.autocast = module, batches, directions, autocast
        self.state, self.steps = None, 0

    def __call__(self):
        ids = self.batches[self.steps % len(self.batches)]
        self.steps += 1
        with torch.autocast(**self.autocast):
            out = self.module(ids, state=self.state, use_cache=True, output_hidden_states=True)
            layers, state = out.hidden_states, out.state
            loss = sum((layer.float() @ direction).mean() for layer, direction in zip(layers, self.directions))
        loss.backward()
        self.state = tuple(t.detach() for t in state)
        self.module.zero_grad(set_to_none=True)


def benchmark_size(config: ElmoConfig, args):
    """Peak memory and seconds per training step of the fast path (and the reference with `--compare`)."""
    model = random_model(config, args.device, torch.float32).train()
    modules = {"fast": model}
    if args.compare:
        modules["reference"] = reference_copy(model).train()
    batches = [random_windows(args.batch_size, args.unroll, seed).to(args.device) for seed in range(4)]
    generator = torch.Generator().manual_seed(0)
    directions = [
        torch.randn(2 * config.projection_dim, generator=generator).to(args.device)
        for _ in range(config.num_layers + 1)
    ]
    autocast = {
        "device_type": args.device.split(":")[0],
        "dtype": getattr(torch, args.autocast) if args.autocast else None,
        "enabled": args.autocast is not None,
    }
    return measure(
        {name: TrainingPath(module, batches, directions, autocast) for name, module in modules.items()}, args
    )


if __name__ == "__main__":
    main()
