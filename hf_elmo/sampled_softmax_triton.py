"""Triton kernels for the sampled softmax on GPUs: the log-sum-exp of each row of the sampled logits with one
column left out (the accidental hit), in one pass forward and one pass backward.

Done with PyTorch operations, the `(N, S)` logits are cast to float32, masked, reduced twice and read back
for the gradient in float32: about eight passes over `N x S` floats, at batch 1,024 of the original model
(N = 40,960 targets, S = 8,192) gigabytes per step. Here the logits stay in their own dtype in memory, the
arithmetic is float32, the forward pass reads them once (each block's max and sum of exponentials, combined in a
`(N, S / 1024)` step) and the backward pass writes the gradient once. `sampled_softmax.py` uses this on CUDA and the
same function written with PyTorch operations elsewhere; the tests keep both equal.
"""

import torch

from .triton_support import require_triton, tl, triton

require_triton(__name__)  # its importer then keeps PyTorch's operations

_BLOCK = 1024


@triton.jit
def _logsumexp_partial_kernel(logits_ptr, skip_ptr, max_ptr, sum_ptr, columns, stride, BLOCK: tl.constexpr):
    """Per row and block of columns: the block's max and its sum of exp(x - max), the skipped column left out."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    skip = tl.load(skip_ptr + row)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * stride + cols, mask=cols < columns, other=float("-inf")).to(tl.float32)
    x = tl.where(cols == skip, float("-inf"), x)
    block_max = tl.max(x, axis=0)
    total = tl.sum(tl.where(x == float("-inf"), 0.0, tl.exp(x - block_max)), axis=0)
    tl.store(max_ptr + row * blocks + block, block_max)
    tl.store(sum_ptr + row * blocks + block, total)


@triton.jit
def _logsumexp_backward_kernel(
    logits_ptr, skip_ptr, lse_ptr, grad_ptr, grad_logits_ptr, columns, stride, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    col_block = tl.program_id(1)
    skip = tl.load(skip_ptr + row)
    lse = tl.load(lse_ptr + row)
    grad = tl.load(grad_ptr + row)
    cols = col_block * BLOCK + tl.arange(0, BLOCK)
    valid = cols < columns
    x = tl.load(logits_ptr + row * stride + cols, mask=valid, other=float("-inf")).to(tl.float32)
    weight = tl.where(cols == skip, 0.0, tl.exp(x - lse))
    weight = tl.where(lse == float("-inf"), 0.0, weight)  # a row with nothing left: no gradient
    out = grad_logits_ptr + row * columns + cols
    tl.store(out, (grad * weight).to(grad_logits_ptr.dtype.element_ty), mask=valid)


def logsumexp_forward(logits: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """`(N, S)` logits (last axis contiguous), `(N,)` int64 column to leave out per row (`S`: none) -> `(N,)`
    float32."""
    rows, columns = logits.shape
    blocks = triton.cdiv(columns, _BLOCK)
    block_max = torch.empty(rows, blocks, dtype=torch.float32, device=logits.device)
    block_sum = torch.empty_like(block_max)
    _logsumexp_partial_kernel[(rows, blocks)](
        logits, skip, block_max, block_sum, columns, logits.stride(0), BLOCK=_BLOCK
    )
    row_max = block_max.amax(dim=1, keepdim=True)
    # Blocks of -inf only (and rows of them) add nothing: their sums are 0.
    scale = torch.where(
        block_max == float("-inf"), 0.0, torch.exp(block_max - row_max.clamp(min=torch.finfo(torch.float32).min))
    )
    return row_max[:, 0] + torch.log((block_sum * scale).sum(dim=1))


def logsumexp_backward(logits: torch.Tensor, skip: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient `(N, S)` (in the logits' dtype) of `logsumexp_forward`'s result times `grad` `(N,)`."""
    grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    grid = (logits.shape[0], triton.cdiv(logits.shape[1], _BLOCK))
    _logsumexp_backward_kernel[grid](
        logits, skip, lse, grad.float().contiguous(), grad_logits, logits.shape[1], logits.stride(0), BLOCK=_BLOCK
    )
    return grad_logits
