"""ELMo's float32 matrix products on a CUDA GPU: PyTorch float32, PyTorch TF32 and `hf_elmo.gpu_matmul` (3xTF32).

    python benchmarks/bench_gpu_matmul.py        # about 2 minutes on one H100, autotuning included

The products of the original-size model (P = 512, D = 4096, 4D = 16384, both LSTM directions as a batch of 2),
with the operands laid out as ELMo holds them (weights stored `(out, in)` and used transposed, no copies):

    a  LSTM step gates       h (2, M, 512) @ W_h^T (2, 512, 16384) + input products (2, M, 16384), M = 128, 1024
    b  LSTM step projection  c (2, M, 4096) @ W_p^T (2, 4096, 512)
    c  backward step dh      dgates (2, M, 16384) @ W_h (2, 16384, 512)
    d  input products        x (2, 2560, 512) @ W_x^T (2, 512, 16384) + bias      (128 sentences x 20 positions)
    e  weight gradient       dgates^T (2, 16384, 2560) @ x (2, 2560, 512)
    f  highway layer         (2816, 2048) @ W^T (2048, 4096) + bias               (128 x 22 tokens, 2 x 2048)
    g  sampled softmax       (5120, 512) @ W^T (512, 8192) + bias                 (2 x 2560 positions, 8192 words)

For each: the median time (`triton.testing.do_bench`, L2 flushed between runs) and TFLOP/s of PyTorch float32
(TF32 off: CUDA cores), PyTorch with TF32 on (shown for reference only: its error is not float32's) and ours, and
the largest error of each relative to the largest value of a float64 product. "ours, whole K" times ours without
split-K where split-K was chosen. Our first call per shape class autotunes (compiles and times every config);
Triton's cache makes a second run of this script faster.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_inference import machine_description  # noqa: E402

from hf_elmo import gpu_matmul  # noqa: E402

DEVICE = "cuda"
P, D = 512, 4096
STEP_ROWS = (128, 1024)  # batch sizes: rows of one LSTM step
ROWS = 2560  # 128 sentences x 20 positions
HIGHWAY_ROWS, HIGHWAY_DIM = 2816, 2048  # 128 x (20 + 2 boundary) tokens; the character CNN's filters
SOFTMAX_ROWS, SAMPLED = 5120, 8192  # both directions' positions; sampled words
EXACT = 1e-5
"""Largest relative error accepted as float32 accuracy; rows of ours above it are marked."""


def cases():
    """(name, builder); a builder makes the operands and returns (function of a module with `bmm`, `baddbmm` and
    `linear` (PyTorch's or ours) -> the product, shape `(batch, M, N, K)`)."""

    def step_gates(m):
        h, w_h, inputs = torch.randn(2, m, P), torch.randn(2, 4 * D, P) / P**0.5, torch.randn(2, m, 4 * D)
        return lambda mm: mm.baddbmm(inputs, h, w_h.transpose(1, 2)), (2, m, 4 * D, P)

    def step_projection(m):
        c, w_p = torch.randn(2, m, D), torch.randn(2, P, D) / D**0.5
        return lambda mm: mm.bmm(c, w_p.transpose(1, 2)), (2, m, P, D)

    def step_dh(m):
        grad_gates, w_h = torch.randn(2, m, 4 * D), torch.randn(2, 4 * D, P) / P**0.5
        return lambda mm: mm.bmm(grad_gates, w_h), (2, m, P, 4 * D)

    def input_products():
        x, w_x, bias = torch.randn(2, ROWS, P), torch.randn(2, 4 * D, P) / P**0.5, torch.randn(2, 1, 4 * D)
        return lambda mm: mm.baddbmm(bias, x, w_x.transpose(1, 2)), (2, ROWS, 4 * D, P)

    def weight_gradient():
        grad_gates, x = torch.randn(2, ROWS, 4 * D), torch.randn(2, ROWS, P)
        return lambda mm: mm.bmm(grad_gates.transpose(1, 2), x), (2, 4 * D, P, ROWS)

    def linear(rows, n_in, n_out):
        x, w, bias = torch.randn(rows, n_in), torch.randn(n_out, n_in) / n_in**0.5, torch.randn(n_out)
        return lambda mm: mm.linear(x, w, bias), (1, rows, n_out, n_in)

    return [
        *((f"a gates M={m}", lambda m=m: step_gates(m)) for m in STEP_ROWS),
        *((f"b projection M={m}", lambda m=m: step_projection(m)) for m in STEP_ROWS),
        *((f"c dh M={m}", lambda m=m: step_dh(m)) for m in STEP_ROWS),
        ("d input products", input_products),
        ("e weight gradient", weight_gradient),
        ("f highway", lambda: linear(HIGHWAY_ROWS, HIGHWAY_DIM, 2 * HIGHWAY_DIM)),
        ("g softmax", lambda: linear(SOFTMAX_ROWS, P, SAMPLED)),
    ]


class TorchProducts:
    """PyTorch's functions under the names `gpu_matmul` uses."""

    bmm, baddbmm = staticmethod(torch.bmm), staticmethod(torch.baddbmm)
    linear = staticmethod(torch.nn.functional.linear)


class Float64Products:
    """PyTorch's products of the float32 operands converted to float64: the reference."""

    @staticmethod
    def bmm(a, b):
        return torch.bmm(a.double(), b.double())

    @staticmethod
    def baddbmm(add, a, b):
        return torch.baddbmm(add.double(), a.double(), b.double())

    @staticmethod
    def linear(x, w, bias):
        return torch.nn.functional.linear(x.double(), w.double(), bias.double())


class WholeK:
    """`gpu_matmul` without split-K."""

    bmm = staticmethod(lambda a, b: gpu_matmul.matmul(a, b, split_k=1))
    baddbmm = staticmethod(lambda add, a, b: gpu_matmul.matmul(a, b, add, split_k=1))
    linear = staticmethod(lambda x, w, bias: gpu_matmul.matmul(x, w.t(), bias, split_k=1))


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.double() - reference).abs().max() / reference.abs().max()).item()


def measure(product, module, flop: int, reference: torch.Tensor, tf32: bool = False) -> tuple[str, str, str]:
    """(median ms, TFLOP/s, relative error) of `product(module)` as printed."""
    from triton.testing import do_bench

    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        error = relative_error(product(module), reference)
        ms = do_bench(lambda: product(module), return_mode="median")
    finally:
        torch.set_float32_matmul_precision("highest")
    return f"{ms:.3f}", f"{flop / ms / 1e9:.1f}", f"{error:.1e}"


def best_config() -> str:
    config = gpu_matmul._matmul_kernel.best_config
    k = config.kwargs
    return f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} w{config.num_warps} s{config.num_stages}"


def main():
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_matmul.py needs a CUDA GPU.")
    import triton

    start = time.monotonic()
    torch.set_default_device(DEVICE)
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    print(f"machine: {machine_description(DEVICE)}; {sms} multiprocessors; triton {triton.__version__}", flush=True)
    header = ["product", "GFLOP", "fp32 ms", "TFLOP/s", "error", "tf32 ms", "TFLOP/s", "error", "ours ms", "TFLOP/s",
              "error", "vs fp32", "split-K", "config", "whole K ms"]  # fmt: skip
    rows = []
    with torch.no_grad():
        for name, build in cases():
            product, (batch, m, n, k) = build()
            flop = 2 * batch * m * n * k
            reference = product(Float64Products)
            shape_start = time.monotonic()
            product(gpu_matmul)  # autotunes at the first call of a shape class
            torch.cuda.synchronize()
            tuning = time.monotonic() - shape_start
            fp32 = measure(product, TorchProducts, flop, reference)
            tf32 = measure(product, TorchProducts, flop, reference, tf32=True)
            ours = measure(product, gpu_matmul, flop, reference)
            config = best_config()
            split = gpu_matmul.choose_split_k(batch, m, n, k, sms)
            whole_k = measure(product, WholeK, flop, reference)[0] if split > 1 else "-"
            mark = "" if float(ours[2]) <= EXACT else " !"
            speedup = f"{float(fp32[0]) / float(ours[0]):.2f}x"
            rows.append([name, f"{flop / 1e9:.1f}", *fp32, *tf32, *ours[:2], ours[2] + mark, speedup, split, config,
                         whole_k])  # fmt: skip
            print(f"[{time.monotonic() - start:5.0f} s] {name}: ours {ours[0]} ms ({ours[1]} TFLOP/s, error "
                  f"{ours[2]}), float32 {fp32[0]} ms; first call {tuning:.1f} s", flush=True)  # fmt: skip
            del product, reference
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    print(f"\nELMo's products in float32 (errors: max |x - float64| / max |float64|; ! above {EXACT:g}); "
          f"{time.monotonic() - start:.0f} s in all")  # fmt: skip
    for line in [header, *rows]:
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths)))


if __name__ == "__main__":
    main()
