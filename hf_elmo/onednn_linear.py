"""Matrix products through oneDNN on CPUs, float32 and bfloat16.

PyTorch multiplies float32 matrices on CPUs with MKL, whose AVX-512 kernels run only on Intel processors; on
other AVX-512 processors (AMD Zen 4 and 5) it falls back to AVX2 kernels. oneDNN, which PyTorch also ships,
runs AVX-512 on any of them: a higher float32 throughput than MKL's there for every product shape ELMo has
(docs/performance.md). Same arithmetic up to the order of the sums. PyTorch already multiplies bfloat16
through oneDNN, but adds a bias by first copying it into every output row; oneDNN adds it in the product.
Everything else (other devices and dtypes, autocast, small products, builds without oneDNN) goes to
`torch.nn.functional.linear` unchanged, and so is every product of a model whose
`paths.linear` is "torch".
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from .cpu_backend import current_cpu_backend

# Below this many multiply-adds PyTorch's own product (MKL) is as fast or faster. On processors without AVX-512
# both libraries run AVX2 kernels and MKL's are faster up to large products: ELMo's narrow per-step products (one
# side 64 or 128 wide: 32 x 64 x 2048, 32 x 512 x 64, 32 x 1024 x 128) are faster through MKL on AMD EPYC (Zen 3);
# there only the fixed cost of a oneDNN call is at stake above 2^23. With AVX-512 the threshold is 2^20.
_AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
_MIN_MULTIPLY_ADDS = 1 << 20 if _AVX512 else 1 << 23

# A oneDNN product called through `torch.ops` holds the GIL for as long as it runs, so in a thread working beside
# others (`cpu_threads.py`) it makes them wait; PyTorch's own products release it. There only the products where
# oneDNN is much faster go to oneDNN: large products of a few rows, as the original size's per-step gate products
# (32 x 512 x 16384); the character CNN's products of hundreds of words and the small preset's per-step products
# (32 x 128 x 4096) are faster through PyTorch there (benchmarks/bench_inference.py).
_MIN_MULTIPLY_ADDS_BESIDE_OTHER_THREADS = 1 << 27
_MAX_ROWS_BESIDE_OTHER_THREADS = 64
_BESIDE_OTHER_THREADS: ContextVar[bool] = ContextVar("hf_elmo_beside_other_threads", default=False)


@contextmanager
def beside_other_threads() -> Iterator[None]:
    """Marks the work of the `with` block as running side by side with other threads of the same pass."""
    token = _BESIDE_OTHER_THREADS.set(True)
    try:
        yield
    finally:
        _BESIDE_OTHER_THREADS.reset(token)


_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
try:
    _DTYPES = (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)
except (AttributeError, RuntimeError):
    _DTYPES = (torch.float32,)


def _use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` (`x` `(M, K)`, `weight` `(N, K)`) goes to oneDNN: large enough, its dtype, the backend
    choice, no autocast, not under torch.compile."""
    if torch.compiler.is_compiling():  # first: Inductor lowers the oneDNN operator only for frozen weights
        return False
    return (
        current_cpu_backend().onednn
        and _onednn_linear is not None
        and x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.dtype in _DTYPES
        and (
            x.shape[0] <= _MAX_ROWS_BESIDE_OTHER_THREADS
            and x.numel() * weight.shape[0] >= _MIN_MULTIPLY_ADDS_BESIDE_OTHER_THREADS
            if _BESIDE_OTHER_THREADS.get()
            else x.numel() * weight.shape[0] >= _MIN_MULTIPLY_ADDS
        )
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
    )


def matmul_nt(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for 2-D `x` `(M, K)` and `weight` `(N, K)` -> `(M, N)`, without autograd; into
    `out` `(M, N)` when given.

    `weight` may be a transposed view (`w.t()` multiplies by `w` itself)."""
    if _use_onednn(x, weight):
        result = _onednn_linear.default(x, weight, bias, "none", [], "")
        return result if out is None else out.copy_(result)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear`: `(..., K)` inputs, `(N, K)` weight, `(N,)` bias -> `(..., N)`, with autograd."""
    if not _use_onednn(x, weight):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _Linear.apply(x, weight, bias)
    return matmul_nt(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        flat = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(flat, weight)
        ctx.has_bias = bias is not None
        return matmul_nt(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        flat, weight = ctx.saved_tensors
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = matmul_nt(grad, weight.t()).view(*grad_output.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_weight = matmul_nt(grad.t(), flat.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(dim=0)
        return grad_x, grad_weight, grad_bias
