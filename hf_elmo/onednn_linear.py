"""Matrix products through oneDNN on CPUs, float32 and bfloat16.

PyTorch multiplies float32 matrices on CPUs with MKL, whose AVX-512 kernels run only on Intel processors; on
other AVX-512 processors (AMD Zen 4 and 5) it falls back to AVX2 kernels. oneDNN, which PyTorch also ships,
runs AVX-512 on any of them: a higher float32 throughput than MKL's there for every product shape ELMo has
(docs/performance.md). Same arithmetic up to the order of the sums. PyTorch already multiplies bfloat16
through oneDNN, but adds a bias by first copying it into every output row; oneDNN adds it in the product.
Which products go to oneDNN is the caller's `onednn` argument, the resolved `paths.onednn`
(`compute_paths.OnednnProducts`, by their size); every other product (none given, other devices and dtypes, autocast,
builds without oneDNN) goes to `torch.nn.functional.linear` unchanged.
"""

import torch
import torch.nn.functional as F

_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
try:
    _DTYPES = (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)
except (AttributeError, RuntimeError):
    _DTYPES = (torch.float32,)


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, onednn) -> bool:
    """Whether `x @ weight.T` (`x` `(M, K)`, `weight` `(N, K)`) goes to oneDNN: one of the products `onednn`
    (`OnednnProducts` or None) takes, which oneDNN can multiply here (its dtype, no autocast, not under
    torch.compile)."""
    if onednn is None or torch.compiler.is_compiling():  # Inductor lowers the oneDNN operator for frozen weights only
        return False
    return (
        onednn.takes(x.shape[0], x.numel() * weight.shape[0])
        and _onednn_linear is not None
        and x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.dtype in _DTYPES
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
    )


def matmul_nt(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    onednn=None,
) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for 2-D `x` `(M, K)` and `weight` `(N, K)` -> `(M, N)`, without autograd; into
    `out` `(M, N)` when given; through oneDNN where `onednn` takes the product.

    `weight` may be a transposed view (`w.t()` multiplies by `w` itself)."""
    if _use_onednn(x, weight, onednn):
        result = _onednn_linear.default(x, weight, bias, "none", [], "")
        return result if out is None else out.copy_(result)
    if out is None:
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, onednn=None) -> torch.Tensor:
    """`torch.nn.functional.linear`: `(..., K)` inputs, `(N, K)` weight, `(N,)` bias -> `(..., N)`, with autograd;
    the products `onednn` takes (`OnednnProducts`, forward and backward) through oneDNN."""
    if not _use_onednn(x, weight, onednn):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _Linear.apply(x, weight, bias, onednn)
    return matmul_nt(x.reshape(-1, x.shape[-1]), weight, bias, onednn=onednn).view(*x.shape[:-1], weight.shape[0])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, onednn):
        flat = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(flat, weight)
        ctx.has_bias, ctx.onednn = bias is not None, onednn
        return matmul_nt(flat, weight, bias, onednn=onednn).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        flat, weight = ctx.saved_tensors
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = matmul_nt(grad, weight.t(), onednn=ctx.onednn).view(*grad_output.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_weight = matmul_nt(grad.t(), flat.t(), onednn=ctx.onednn)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(dim=0)
        return grad_x, grad_weight, grad_bias, None
