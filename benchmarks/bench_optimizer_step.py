"""Clipping and the Adagrad update of one training step: `torch.nn.utils.clip_grad_norm_` then `Adagrad.step`, against
`Adagrad.clip_grad_norm_` (the clip applied inside the step), alternating on the same gradients.

    python benchmarks/bench_optimizer_step.py --size original --steps 9
    python benchmarks/bench_optimizer_step.py --size original --device cuda

The gradients are those of one real step (`bench_training.make_batch`, sampled softmax of 8,192 of 100,000 words), so
the softmax rows a step does not touch are zero as in training. Both ways give the same norm and update to the bit
(`tests/training/test_adagrad.py`); what differs is one read and one write of every gradient.
"""

import argparse
import time

import torch
from bench_inference import machine_description
from bench_training import make_batch, make_config

from hf_elmo import ElmoForBiLM
from hf_elmo.training.adagrad import Adagrad


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="original", choices=["small", "medium", "original", "mid"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = make_config(args.size, vocab_size=100_000, num_softmax_samples=8192, dropout=0.1)
    model = ElmoForBiLM(config).to(args.device).train()
    optimizer = Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0 / 20**2)
    model(**make_batch(args.batch_size, 20, 100_000, args.device)).loss.backward()
    gradients = {name: param.grad.clone() for name, param in model.named_parameters()}
    max_norm = 0.5  # below the norm: every step clips

    def clip_then_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()

    def clip_inside_step():
        optimizer.clip_grad_norm_(max_norm)
        optimizer.step()

    ways = {
        "torch.nn.utils.clip_grad_norm_, then step": clip_then_step,
        "Adagrad.clip_grad_norm_ (in the step)": clip_inside_step,
    }
    times = {name: [] for name in ways}
    for _ in range(args.steps):
        for name, way in ways.items():  # alternating, so that both see the same machine load
            for param_name, param in model.named_parameters():
                param.grad = gradients[param_name].clone()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            way()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    print(f"machine: {machine_description(args.device)}")
    print(
        f"{args.size}: {sum(p.numel() for p in model.parameters()):,} parameters, {args.device}, median of {args.steps}"
    )
    print("| clipping and update | ms (median) | ms (fastest) |\n| --- | ---: | ---: |")
    for name, values in times.items():
        values = sorted(values)
        print(f"| {name} | {values[len(values) // 2] * 1e3:.1f} | {values[0] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
