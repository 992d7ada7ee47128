"""One LSTM layer's inference time loop at the original (SeqVec's) size, by rows per step: the compiled loop (whose
step products read weights packed for few rows on AVX-512 builds) against the PyTorch operations per step (products
through oneDNN where `paths.onednn` takes them), the two alternating in one process, one direction or two stacked.

    python benchmarks/bench_lstm_steps.py --rows 1 4 16 64 --steps 50 --threads 1

This is the choice `paths_resolution` makes for inference with large steps (`lstm_kernels` "compiled" where the
loops were built with the packed products, else "torch"): both paths compute the same layer (the largest difference
is printed). Prints the machine and, per row count, milliseconds per step of each path (median of `--repeats`) and
their ratio.
"""

import argparse
import statistics
import time

import torch

from hf_elmo.compute_paths import onednn_products
from hf_elmo.cpu_kernels import loops_built, packed_products_built
from hf_elmo.lstm_sorted import LstmSettings, PackedSteps, lstm_layer


def timed_layer(inputs, settings):
    """Seconds of one inference pass of `lstm_layer(*inputs, settings)`, and its first direction's outputs."""
    with torch.no_grad():
        start = time.perf_counter()
        out = lstm_layer(*inputs, settings)
        return time.perf_counter() - start, out[0][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--cells", type=int, default=4096)
    parser.add_argument("--projection", type=int, default=512)
    parser.add_argument("--directions", type=int, choices=[1, 2], default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from bench_inference import machine_description

    print(machine_description("cpu"))
    print(f"compiled loops built: {loops_built()}; packed step products: {packed_products_built()}")
    D, P, K = args.cells, args.projection, args.directions
    generator = torch.Generator().manual_seed(0)
    weights = [
        (
            torch.randn(4 * D, P, generator=generator) / P**0.5,
            torch.randn(4 * D, generator=generator) * 0.1,
            torch.randn(4 * D, P, generator=generator) / P**0.5,
            torch.randn(P, D, generator=generator) / D**0.5,
        )
        for _ in range(K)
    ]
    settings = {
        kernels: LstmSettings(3.0, 3.0, 0.0, kernels == "compiled", onednn_products(), "single")
        for kernels in ("compiled", "torch")
    }
    print(f"{D} cells, projections of {P}, {K} direction(s), {args.steps} steps")
    print(
        "| rows | compiled, ms per step | PyTorch operations, ms per step | PyTorch / compiled | largest difference |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in args.rows:
        x = torch.randn(args.steps, rows, P, generator=generator)
        states = [(torch.zeros(rows, P), torch.zeros(rows, D)) for _ in range(K)]
        steps = PackedSteps.from_batch_sizes([rows] * args.steps, rows, x.device)

        inputs = ([x] * K, states, weights, [k == 1 for k in range(K)], steps)
        times = {"compiled": [], "torch": []}
        outputs = {}
        for repeat in range(args.repeats + 1):
            for kernels in ("compiled", "torch") if repeat % 2 == 0 else ("torch", "compiled"):
                seconds, outputs[kernels] = timed_layer(inputs, settings[kernels])
                if repeat > 0:  # the first of each: allocator, build
                    times[kernels].append(seconds)
        compiled, pytorch = (statistics.median(times[k]) * 1e3 / args.steps for k in ("compiled", "torch"))
        difference = (outputs["compiled"] - outputs["torch"]).abs().max().item()
        print(f"| {rows} | {compiled:.2f} | {pytorch:.2f} | {pytorch / compiled:.2f}x | {difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
