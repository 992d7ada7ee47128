"""Triton kernels for the character encoder on GPUs: the CNN's window products with their max, and the highway
layers' elementwise part.

`linear(windows, weight).max(dim=1)` writes a `(words, windows, filters)` tensor and reads it back: about 92,000
values per word for the original model's 2,048 filters over 50 slots, 15 GB in bfloat16 for a batch of 4,096
sentences of 20 words, where the max itself is `(words, filters)`. Here one program keeps a block of words times a
block of filters in registers and takes the running max over the windows as it multiplies them, noting the window
each max came from; the backward pass (`weight_grad`, `chars_grad`) multiplies each window by the gradient where its
max was taken, in registers too, instead of scattering the gradient into a `(words, windows, filters)` tensor.
Products accumulate in float32; float32 operands are multiplied as such, never rounded to TF32.

A highway layer, `t + g (x - t)` with `t = relu(a)`, `g = sigmoid(b)` from its product `[a | b]`, is five
elementwise operations in PyTorch, each a pass over `(words, filters)` tensors, and autograd keeps three of their
results; `HighwayCombine` is one pass forward and one backward, and keeps only the product and `x`.

Importing this module needs Triton. With `TRITON_INTERPRET=1` set before the import, the kernels run on CPU
tensors (slowly), which is how the CPU test suite checks them; `tests/model/test_triton_compile.py` compiles them for a
GPU.
"""

import torch

from .triton_support import INTERPRETED, require_triton, tl, triton

require_triton(__name__)  # its importer then keeps PyTorch's operations


@triton.jit
def _block_windows(spans_ptr, rows, row_ok, num_windows, HAS_SPANS: tl.constexpr):
    # A window from a word's span on lies inside the word's final run of one character, whose value the caller
    # takes apart: a block of words needs the windows before its longest span only.
    windows = num_windows
    if HAS_SPANS:
        windows = tl.minimum(tl.max(tl.load(spans_ptr + rows, mask=row_ok, other=0).to(tl.int32)), num_windows)
    return windows


@triton.jit
def _window_max_kernel(
    chars_ptr,
    weight_ptr,
    spans_ptr,
    values_ptr,
    argmax_ptr,
    words,
    filters,
    depth,
    num_windows,
    slot_stride,
    s_chars,
    s_weight,
    s_values,
    s_argmax,
    HAS_SPANS: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    OPERANDS_IN_FLOAT32: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok, col_ok, k_ok = rows < words, cols < filters, ks < depth
    # The window at slot p is the `depth` values of a word's row from `p * slot_stride` on.
    weight = tl.load(
        weight_ptr + cols[None, :] * s_weight + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0
    )
    if OPERANDS_IN_FLOAT32:  # the interpreter's products of bfloat16 operands are wrong (Triton 3.9)
        weight = weight.to(tl.float32)
    windows = chars_ptr + rows[:, None] * s_chars + ks[None, :]
    window_mask = row_ok[:, None] & k_ok[None, :]
    best = tl.full((BLOCK_W, BLOCK_N), float("-inf"), dtype=tl.float32)
    best_at = tl.zeros((BLOCK_W, BLOCK_N), dtype=tl.int32)
    for p in range(_block_windows(spans_ptr, rows, row_ok, num_windows, HAS_SPANS)):
        window = tl.load(windows + p * slot_stride, mask=window_mask, other=0.0)
        if OPERANDS_IN_FLOAT32:
            window = window.to(tl.float32)
        value = tl.dot(window, weight, input_precision="ieee")  # float32 operands: not rounded to TF32
        # The first of equal maxima, as `torch.max`; a NaN wins and stays, as there.
        take = ((value > best) | (value != value)) & (best == best)
        best = tl.where(take, value, best)
        best_at = tl.where(take, p, best_at)
    valid = row_ok[:, None] & col_ok[None, :]
    tl.store(values_ptr + rows[:, None] * s_values + cols[None, :], best.to(values_ptr.dtype.element_ty), mask=valid)
    if SAVE_ARGMAX:
        tl.store(argmax_ptr + rows[:, None] * s_argmax + cols[None, :], best_at.to(tl.int16), mask=valid)


@triton.jit
def _gradient_and_window(grad_ptr, argmax_ptr, rows, cols, row_ok, col_ok, s_grad, s_argmax, OPERANDS_IN_FLOAT32):
    # A block of the maxima's gradient and the windows they were taken at (-1 outside the block's rows and columns).
    at = row_ok[:, None] & col_ok[None, :]
    grad = tl.load(grad_ptr + rows[:, None] * s_grad + cols[None, :], mask=at, other=0.0)
    taken = tl.load(argmax_ptr + rows[:, None] * s_argmax + cols[None, :], mask=at, other=-1).to(tl.int32)
    if OPERANDS_IN_FLOAT32:  # the interpreter's products of bfloat16 operands are wrong (Triton 3.9)
        grad = grad.to(tl.float32)
    return grad, taken


@triton.jit
def _weight_grad_kernel(
    chars_ptr,
    grad_ptr,
    argmax_ptr,
    spans_ptr,
    partial_ptr,
    words,
    filters,
    depth,
    num_windows,
    slot_stride,
    words_per_split,
    s_chars,
    s_grad,
    s_argmax,
    s_partial_split,
    s_partial_k,
    HAS_SPANS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    OPERANDS_IN_FLOAT32: tl.constexpr,
):
    # One block of filters over one split of the words: sum over words and windows of window^T (grad where the
    # max was taken at that window), into this split's partial sum.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    first = tl.program_id(1) * words_per_split
    ks = tl.arange(0, BLOCK_K)
    col_ok, k_ok = cols < filters, ks < depth
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for start in range(first, first + words_per_split, BLOCK_W):
        rows = start + tl.arange(0, BLOCK_W)
        row_ok = (rows < words) & (rows < first + words_per_split)
        grad, taken = _gradient_and_window(
            grad_ptr, argmax_ptr, rows, cols, row_ok, col_ok, s_grad, s_argmax, OPERANDS_IN_FLOAT32
        )
        windows = chars_ptr + rows[:, None] * s_chars + ks[None, :]
        for p in range(_block_windows(spans_ptr, rows, row_ok, num_windows, HAS_SPANS)):
            window = tl.load(windows + p * slot_stride, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if OPERANDS_IN_FLOAT32:
                window = window.to(tl.float32)
            taken_here = tl.where(taken == p, grad, 0.0).to(window.dtype)
            acc = tl.dot(tl.trans(window), taken_here, acc, input_precision="ieee")
    partial = partial_ptr + tl.program_id(1) * s_partial_split + ks[:, None] * s_partial_k + cols[None, :]
    tl.store(partial, acc, mask=k_ok[:, None] & col_ok[None, :])


@triton.jit
def _chars_grad_kernel(
    weight_ptr,
    grad_ptr,
    argmax_ptr,
    spans_ptr,
    grad_chars_ptr,
    words,
    filters,
    num_windows,
    slot_dim,
    s_weight,
    s_grad,
    s_argmax,
    s_grad_chars,
    HAS_SPANS: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr,
    OPERANDS_IN_FLOAT32: tl.constexpr,
):
    # Slot q of a word gets, from each window p = q - j that holds it, that window's gradient times the weight's
    # rows of slot j; summed here over this program's filters, and over the other programs' by atomic adds.
    rows = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    es = tl.arange(0, BLOCK_E)
    row_ok, col_ok, e_ok = rows < words, cols < filters, es < slot_dim
    grad, taken = _gradient_and_window(
        grad_ptr, argmax_ptr, rows, cols, row_ok, col_ok, s_grad, s_argmax, OPERANDS_IN_FLOAT32
    )
    weight_rows = weight_ptr + cols[:, None] * s_weight + es[None, :]
    weight_mask = col_ok[:, None] & e_ok[None, :]
    grad_chars = grad_chars_ptr + rows[:, None] * s_grad_chars + es[None, :]
    for q in range(_block_windows(spans_ptr, rows, row_ok, num_windows, HAS_SPANS) + WIDTH - 1):
        acc = tl.zeros((BLOCK_W, BLOCK_E), dtype=tl.float32)
        for j in tl.static_range(WIDTH):
            weight = tl.load(weight_rows + j * slot_dim, mask=weight_mask, other=0.0)
            if OPERANDS_IN_FLOAT32:
                weight = weight.to(tl.float32)
            acc = tl.dot(tl.where(taken == q - j, grad, 0.0).to(weight.dtype), weight, acc, input_precision="ieee")
        tl.atomic_add(grad_chars + q * slot_dim, acc, mask=row_ok[:, None] & e_ok[None, :])


@triton.jit
def _highway_forward_kernel(
    product_ptr, x_ptr, out_ptr, dim, s_product, s_x, s_out, COMPUTE: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    a = tl.load(product_ptr + row * s_product + cols, mask=valid, other=0.0).to(COMPUTE)
    b = tl.load(product_ptr + row * s_product + dim + cols, mask=valid, other=0.0).to(COMPUTE)
    x = tl.load(x_ptr + row * s_x + cols, mask=valid, other=0.0).to(COMPUTE)
    t = tl.maximum(a, 0.0)
    g = 1.0 / (1.0 + tl.exp(-b))
    tl.store(out_ptr + row * s_out + cols, (t + g * (x - t)).to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _highway_backward_kernel(
    product_ptr,
    x_ptr,
    grad_ptr,
    grad_product_ptr,
    grad_x_ptr,
    dim,
    s_product,
    s_x,
    s_grad,
    s_gproduct,
    s_gx,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    a = tl.load(product_ptr + row * s_product + cols, mask=valid, other=0.0).to(COMPUTE)
    b = tl.load(product_ptr + row * s_product + dim + cols, mask=valid, other=0.0).to(COMPUTE)
    x = tl.load(x_ptr + row * s_x + cols, mask=valid, other=0.0).to(COMPUTE)
    grad = tl.load(grad_ptr + row * s_grad + cols, mask=valid, other=0.0).to(COMPUTE)
    t = tl.maximum(a, 0.0)
    g = 1.0 / (1.0 + tl.exp(-b))
    grad_a = tl.where(a > 0.0, grad * (1.0 - g), 0.0)
    grad_b = grad * (x - t) * g * (1.0 - g)
    gproduct_type = grad_product_ptr.dtype.element_ty
    tl.store(grad_product_ptr + row * s_gproduct + cols, grad_a.to(gproduct_type), mask=valid)
    tl.store(grad_product_ptr + row * s_gproduct + dim + cols, grad_b.to(gproduct_type), mask=valid)
    tl.store(grad_x_ptr + row * s_gx + cols, (grad * g).to(grad_x_ptr.dtype.element_ty), mask=valid)


_HIGHWAY_BLOCK = 1024


def _compute_type(tensor: torch.Tensor):
    return tl.float64 if tensor.dtype == torch.float64 else tl.float32


class HighwayCombine(torch.autograd.Function):
    """`(U, 2F)` product `[a | b]` and `(U, F)` input `x` -> `relu(a) + sigmoid(b) (x - relu(a))` `(U, F)`, in the
    dtype the two promote to, computed in float32 (float64 for float64)."""

    @staticmethod
    def forward(ctx, product, x):
        product, x = product.contiguous(), x.contiguous()
        rows, dim = x.shape
        out = x.new_empty(rows, dim, dtype=torch.promote_types(product.dtype, x.dtype))
        grid = (rows, triton.cdiv(dim, _HIGHWAY_BLOCK))
        _highway_forward_kernel[grid](
            product,
            x,
            out,
            dim,
            product.stride(0),
            x.stride(0),
            out.stride(0),
            COMPUTE=_compute_type(out),
            BLOCK=_HIGHWAY_BLOCK,
        )
        ctx.save_for_backward(product, x)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        product, x = ctx.saved_tensors
        grad = grad.contiguous()
        rows, dim = x.shape
        grad_product, grad_x = torch.empty_like(product), torch.empty_like(x)
        grid = (rows, triton.cdiv(dim, _HIGHWAY_BLOCK))
        _highway_backward_kernel[grid](
            product,
            x,
            grad,
            grad_product,
            grad_x,
            dim,
            product.stride(0),
            x.stride(0),
            grad.stride(0),
            grad_product.stride(0),
            grad_x.stride(0),
            COMPUTE=_compute_type(grad),
            BLOCK=_HIGHWAY_BLOCK,
        )
        return grad_product, grad_x


def _block(size: int, smallest: int, largest: int) -> int:
    return max(smallest, min(largest, triton.next_power_of_2(size)))


def window_max(
    chars: torch.Tensor, weight: torch.Tensor, num_windows: int, save_argmax: bool, spans: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each filter's max over the first `num_windows` windows of each word.

    Args:
        chars: `(U, L, e)` embedded characters, contiguous, with `L >= num_windows + w - 1`.
        weight: `(n, w * e)` the filters, slot-major (`conv.weight.transpose(1, 2)` flattened), same dtype.
        save_argmax: also return where each max was taken (the backward pass needs it).
        spans: `(U,)` integers, each word's slots before its final run of one character (`char_cnn_fast._spans`), or
            None. With them a block of words stops at its longest span: a word's later windows are then left out
            (only where they lie inside its final run, whose value the caller takes into the max).

    Returns:
        `(U, n)` maxima in `chars.dtype` (products accumulated in float32, float32 operands multiplied as such, not
        rounded to TF32; -inf for a word with no window computed), and `(U, n)` int16 window indices or None.
    """
    words, slots, slot_stride = chars.shape
    filters, depth = weight.shape
    width = depth // slot_stride
    if not chars.is_contiguous() or weight.stride(1) != 1 or depth % slot_stride or num_windows + width - 1 > slots:
        raise ValueError(
            f"window_max needs contiguous chars (U, L, e) and a weight (n, w * e) with L >= windows + w - 1, got "
            f"chars {tuple(chars.shape)}, weight {tuple(weight.shape)}, {num_windows} windows."
        )
    values = chars.new_empty(words, filters)
    argmax = torch.empty(words, filters, dtype=torch.int16, device=chars.device) if save_argmax else values
    block_w, block_n, block_k = _block(words, 16, 64), _block(filters, 16, 128), _block(depth, 16, 256)
    grid = (triton.cdiv(words, block_w), triton.cdiv(filters, block_n))
    _window_max_kernel[grid](
        chars,
        weight,
        values if spans is None else spans,
        values,
        argmax,
        words,
        filters,
        depth,
        num_windows,
        slot_stride,
        chars.stride(0),
        weight.stride(0),
        values.stride(0),
        argmax.stride(0),
        HAS_SPANS=spans is not None,
        SAVE_ARGMAX=save_argmax,
        BLOCK_W=block_w,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        OPERANDS_IN_FLOAT32=INTERPRETED,
        num_warps=4 if block_w * block_n <= 4096 else 8,
    )
    return values, argmax if save_argmax else None


def weight_grad(chars: torch.Tensor, grad: torch.Tensor, argmax: torch.Tensor, num_windows: int, depth: int, spans):
    """The gradient of `window_max`'s weight: `(U, L, e)` chars, `(U, n)` gradient of the maxima and their windows
    -> `(n, w * e)` float32. Each split of the words sums into its own partial sum (no atomic adds), then the splits
    are added."""
    words, slot_stride = chars.shape[0], chars.shape[2]
    filters = grad.shape[1]
    block_w, block_n, block_k = _block(words, 16, 64), _block(filters, 16, 64), _block(depth, 16, 256)
    filter_blocks = triton.cdiv(filters, block_n)
    splits = max(1, min(triton.cdiv(words, block_w), 264 // filter_blocks))  # about two programs per SM of an H100
    words_per_split = triton.cdiv(triton.cdiv(words, splits), block_w) * block_w
    splits = triton.cdiv(words, words_per_split)
    partial = torch.empty(splits, depth, filters, dtype=torch.float32, device=chars.device)
    _weight_grad_kernel[(filter_blocks, splits)](
        chars,
        grad,
        argmax,
        argmax if spans is None else spans,
        partial,
        words,
        filters,
        depth,
        num_windows,
        slot_stride,
        words_per_split,
        chars.stride(0),
        grad.stride(0),
        argmax.stride(0),
        partial.stride(0),
        partial.stride(1),
        HAS_SPANS=spans is not None,
        BLOCK_W=block_w,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        OPERANDS_IN_FLOAT32=INTERPRETED,
        num_warps=4 if block_k * block_n <= 8192 else 8,
    )
    return partial.sum(dim=0).t()


def chars_grad(weight: torch.Tensor, grad: torch.Tensor, argmax: torch.Tensor, num_windows: int, shape, spans):
    """The gradient of `window_max`'s chars: `(n, w * e)` weight, `(U, n)` gradient of the maxima and their windows
    -> `(U, L, e)` float32 (`shape`)."""
    words, _, slot_dim = shape
    filters, depth = weight.shape
    grad_chars = torch.zeros(shape, dtype=torch.float32, device=weight.device)
    block_w, block_n, block_e = _block(words, 16, 64), _block(filters, 16, 64), _block(slot_dim, 16, 64)
    grid = (triton.cdiv(words, block_w), triton.cdiv(filters, block_n))
    _chars_grad_kernel[grid](
        weight,
        grad,
        argmax,
        argmax if spans is None else spans,
        grad_chars,
        words,
        filters,
        num_windows,
        slot_dim,
        weight.stride(0),
        grad.stride(0),
        argmax.stride(0),
        grad_chars.stride(0),
        HAS_SPANS=spans is not None,
        WIDTH=depth // slot_dim,
        BLOCK_W=block_w,
        BLOCK_N=block_n,
        BLOCK_E=block_e,
        OPERANDS_IN_FLOAT32=INTERPRETED,
    )
    return grad_chars


class WindowMax(torch.autograd.Function):
    """`window_max` with gradients: `(U, L, e)` chars, `(n, w * e)` weight, windows and optional `(U,)` spans
    -> `(U, n)`."""

    @staticmethod
    def forward(ctx, chars, weight, num_windows, spans=None):
        values, argmax = window_max(chars, weight, num_windows, any(ctx.needs_input_grad[:2]), spans)
        ctx.save_for_backward(chars, weight, argmax, spans)
        ctx.num_windows = num_windows
        return values

    @staticmethod
    def backward(ctx, grad_values):
        chars, weight, argmax, spans = ctx.saved_tensors
        grad_values = grad_values.contiguous()
        grad_chars = grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = weight_grad(chars, grad_values, argmax, ctx.num_windows, weight.shape[1], spans)
            grad_weight = grad_weight.to(weight.dtype)
        if ctx.needs_input_grad[0]:
            grad_chars = chars_grad(weight, grad_values, argmax, ctx.num_windows, chars.shape, spans).to(chars.dtype)
        return grad_chars, grad_weight, None, None
