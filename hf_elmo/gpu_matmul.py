"""Float32 matrix products on tensor cores at float32 accuracy (3xTF32), for ELMo on GPUs.

A plain float32 product runs on a GPU's CUDA cores (an H100 peaks near 67 TFLOP/s there), and TF32 tensor cores
are much faster but round the inputs to 10 mantissa bits (a relative error near 3e-4, not what float32 gives).
The products here split each float32 input in two TF32 numbers, `a = a_hi + a_lo`, and add three tensor-core
products in float32: `a_hi b_hi + a_hi b_lo + a_lo b_hi` (only `a_lo b_lo`, about 2^-22 of the product, is
left out). That is Triton's `tl.dot(..., input_precision="tf32x3")`: as accurate as a float32 product and, on
an H100 SXM, at most a third of the TF32 tensor-core rate (about 165 TFLOP/s), 2.5 times the float32 peak.

`matmul` (with `bmm` and `baddbmm` in PyTorch's argument order) and `linear` are differentiable: their backward
products use the same kernel. Operands may be any strided views (transposes cost no copy); results are new
contiguous tensors, or written into `out`. Products with a long inner dimension and a small result (an LSTM
step's `dh W_h` has 128 x 512 outputs over 16,384 terms per direction) would occupy few of the GPU's
multiprocessors, so their inner dimension is cut into parts computed side by side ("split-K") and summed in a
fixed order (no atomics: the same inputs always give the same bits).

Importing this module never needs Triton; calling it does (`AVAILABLE`). The kernels run on CUDA tensors, or on
CPU tensors under Triton's interpreter when `TRITON_INTERPRET=1` was set before the import (`INTERPRETED`; the
interpreter computes the products in plain float32), which is how the CPU test suite runs them. Autotuning runs
at the first call for each shape class: call once before capturing a CUDA graph.
"""

import contextlib
import functools
import os

import torch

try:  # Triton ships with PyTorch's CUDA builds; the package works without it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

AVAILABLE = triton is not None
"""Whether Triton is installed (the functions below need it)."""

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether the kernels were defined for Triton's interpreter (they then run on CPU tensors only)."""

_MIN_K_PER_SPLIT = 512
"""Split-K only gives each part at least this many terms: fewer would not pay for writing and summing partials."""

_SPLIT_K_TILE = 128
"""The output tile (square) assumed when estimating how many programs a product has, to decide on split-K."""


def _configs():
    """Autotuning candidates for H100 (sm_90). Float32 tiles take twice the shared memory of 16-bit ones, and
    3xTF32 holds each operand tile twice (high and low parts) and a second accumulator for the small products
    in registers: these are the shapes that compile for sm_90 without spilling registers (128 x 256 tiles, or
    128 x 128 with 4 warps, spill). BLOCK_K = 32 is one 128-byte row of float32; 64 halves the loop overhead
    where two stages suffice. The smaller tiles serve small outputs and split-K parts (two programs per
    multiprocessor). Under the interpreter one config with small blocks: every program costs milliseconds there,
    and small blocks let small test shapes span several tiles and a ragged edge."""
    if INTERPRETED:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=4, num_stages=1)]
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
        (128, 128, 32, 8, 3),
        (128, 128, 32, 8, 4),
        (128, 128, 64, 8, 2),
        (64, 128, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 64, 64, 4, 3),
    ]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for m, n, k, w, s in shapes
    ]


if AVAILABLE:
    _CONFIGS = _configs()
    _K_ALIGN = max(config.kwargs["BLOCK_K"] for config in _CONFIGS)
    """Split-K parts start at multiples of this, so that every part's first block is a whole K block."""

    _KEYS = ["M_CLASS", "N_CLASS", "K_CLASS", "PROGRAMS_CLASS"]

    @triton.autotune(configs=_CONFIGS, key=_KEYS, restore_value=["c_ptr"])
    @triton.jit(do_not_specialize=_KEYS)  # the keys are unused in the kernel: no compiled variants for their values
    def _matmul_kernel(
        a_ptr, b_ptr, c_ptr, d_ptr,
        M, N, K, K_PER_SPLIT,
        stride_ab, stride_am, stride_ak,
        stride_bb, stride_bk, stride_bn,
        stride_cs, stride_cb, stride_cm, stride_cn,
        stride_db, stride_dm, stride_dn,
        M_CLASS, N_CLASS, K_CLASS, PROGRAMS_CLASS,
        HAS_ADD: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):  # fmt: skip
        """`C[s, b] = A[b] @ B[b][k-part s] (+ D[b])` for one `(BLOCK_M, BLOCK_N)` tile. Grid: (tiles of one
        product, batch, K parts). `*_CLASS` only key the autotuning (size classes, not exact sizes)."""
        # Grouped order: GROUP_M row-tiles share each column-tile of B while it is in L2.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        tiles_in_group = GROUP_M * tiles_n
        first_m = (pid // tiles_in_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % tiles_in_group) % group_m
        pid_n = (pid % tiles_in_group) // group_m
        batch = tl.program_id(1).to(tl.int64)  # 64-bit: batch offsets may pass 2^31 elements
        part = tl.program_id(2)

        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        k_start = part * K_PER_SPLIT
        k_end = min(K, k_start + K_PER_SPLIT)
        offsets_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + batch * stride_ab + rows[:, None] * stride_am + (k_start + offsets_k)[None, :] * stride_ak
        b_ptrs = b_ptr + batch * stride_bb + (k_start + offsets_k)[:, None] * stride_bk + cols[None, :] * stride_bn
        # Masks rather than wrapped indices: they keep every address inside the operands for any strides.
        row_ok = rows[:, None] < M
        col_ok = cols[None, :] < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_start, k_end, BLOCK_K):
            k_ok = k + offsets_k < k_end
            a = tl.load(a_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok, other=0.0)
            acc = tl.dot(a, b, acc, input_precision="tf32x3")
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if HAS_ADD:
            acc += tl.load(d_ptr + batch * stride_db + rows[:, None] * stride_dm + cols[None, :] * stride_dn,
                           mask=row_ok & col_ok)  # fmt: skip
        c_ptrs = c_ptr + part.to(tl.int64) * stride_cs + batch * stride_cb + rows[:, None] * stride_cm
        tl.store(c_ptrs + cols[None, :] * stride_cn, acc, mask=row_ok & col_ok)

    @triton.jit
    def _sum_parts_kernel(
        p_ptr, c_ptr, d_ptr, M, N, PARTS, stride_ps, stride_pb, stride_pm,
        stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn,
        HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        """`C[b] = sum over s of P[s, b] (+ D[b])`, parts added in order; P contiguous in its last dimension.
        Grid: (row tiles, column tiles, batch)."""
        batch = tl.program_id(2).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = (rows[:, None] < M) & (cols[None, :] < N)
        p_ptrs = p_ptr + batch * stride_pb + rows[:, None] * stride_pm + cols[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(PARTS):
            acc += tl.load(p_ptrs + s * stride_ps, mask=ok)
        if HAS_ADD:
            acc += tl.load(d_ptr + batch * stride_db + rows[:, None] * stride_dm + cols[None, :] * stride_dn, mask=ok)
        tl.store(c_ptr + batch * stride_cb + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc, mask=ok)


def _size_class(n: int) -> int:
    """Autotuning key for a size: the next power of two (shapes in one class share the tuned config)."""
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_split_k(batch: int, m: int, n: int, k: int, multiprocessors: int) -> int:
    """How many K parts a `(batch, m, k) @ (batch, k, n)` product is cut into: 1 when its output tiles already
    occupy at least half the multiprocessors; else enough parts to fill them, each of at least
    `_MIN_K_PER_SPLIT` terms."""
    tiles = batch * -(-m // _SPLIT_K_TILE) * -(-n // _SPLIT_K_TILE)
    if 2 * tiles > multiprocessors:
        return 1
    return max(1, min(multiprocessors // tiles, k // _MIN_K_PER_SPLIT))


def _check(condition: bool, message: str):
    if not condition:
        raise ValueError(f"gpu_matmul: {message}")


def _product(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None, out: torch.Tensor | None,
             split_k: int | None, config=None) -> torch.Tensor:  # fmt: skip
    """Launches the kernels for 3-D `a (batch, M, K)`, `b (batch, K, N)` and `add` broadcastable to
    `(batch, M, N)`; returns `out` (or a new tensor) `(batch, M, N)`. No autograd. `config` (one of `_CONFIGS`)
    replaces autotuning, for testing every candidate."""
    batch, m, k = a.shape
    n = b.shape[2]
    if out is None:
        out = a.new_empty(batch, m, n)
    if batch == 0 or m == 0 or n == 0:
        return out
    # Grid dimensions 1 and 2 hold at most 65535 programs; offsets inside one matrix are 32-bit.
    _check(batch <= 65535, f"batch of {batch} products; at most 65535")
    for name, t in (("a", a), ("b", b), ("out", out), ("add", add)):
        if t is not None:
            extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape[-2:], t.stride()[-2:]))
            _check(extent < 2**31, f"{name}'s matrices span {extent} elements; at most 2^31 - 1")
    if split_k is None:
        split_k = 1 if a.device.type != "cuda" else choose_split_k(batch, m, n, k, _multiprocessors(a.device))
    _check(split_k >= 1, f"split_k must be at least 1, got {split_k}")
    k_per_split = -(-k // split_k)
    k_per_split = max(_K_ALIGN, -(-k_per_split // _K_ALIGN) * _K_ALIGN)
    parts = max(1, -(-k // k_per_split))
    d = add.expand(batch, m, n) if add is not None else None  # broadcast dimensions get stride 0
    d_strides = d.stride() if d is not None else (0, 0, 0)
    c = out if parts == 1 else a.new_empty(parts, batch, m, n)
    c_strides = (0, *out.stride()) if parts == 1 else c.stride()

    def grid(meta):
        return triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), batch, parts

    # Triton launches on the current device.
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        launch = _matmul_kernel[grid]
        if config is not None:
            launch = functools.partial(_matmul_kernel.fn[grid], **config.all_kwargs())
        launch(
            a, b, c, d if parts == 1 else None,
            m, n, k, k_per_split,
            *a.stride(), *b.stride(), *c_strides, *d_strides,
            _size_class(m), _size_class(n), _size_class(k_per_split), _size_class(batch * parts),
            HAS_ADD=d is not None and parts == 1,
        )  # fmt: skip
        if parts > 1:
            block_m, block_n = (32, 32) if INTERPRETED else (32, 128)
            _sum_parts_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n), batch)](
                c, out, d, m, n, parts, *c.stride()[:3], *out.stride(), *d_strides,
                HAS_ADD=d is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            )  # fmt: skip
    return out


def _validate(a, b, add, out):
    """Raises a one-line ValueError naming what makes `matmul(a, b, add, out=out)` impossible."""
    _check(AVAILABLE, "needs Triton (it comes with PyTorch's CUDA builds)")
    _check(a.dim() == b.dim() and a.dim() in (2, 3),
           f"a and b must both be 2-D or both 3-D, got {a.dim()}-D and {b.dim()}-D")  # fmt: skip
    tensors = {"a": a, "b": b, "add": add, "out": out}
    for name, t in tensors.items():
        if t is not None:
            _check(t.dtype == torch.float32, f"{name} must be float32, got {t.dtype}")
            _check(t.device == a.device, f"{name} is on {t.device}, a on {a.device}")
    where = "CPU tensors (Triton's interpreter is on)" if INTERPRETED else "CUDA tensors"
    on_its_device = a.device.type == ("cpu" if INTERPRETED else "cuda")
    _check(on_its_device, f"runs on {where}, got {a.device}")
    _check(a.shape[-1] == b.shape[-2], f"a {tuple(a.shape)} and b {tuple(b.shape)}: inner sizes differ")
    if a.dim() == 3:
        _check(a.shape[0] == b.shape[0], f"a {tuple(a.shape)} and b {tuple(b.shape)}: batch sizes differ")
    shape = (*a.shape[:-1], b.shape[-1])
    if add is not None:
        fits = add.dim() <= len(shape) and all(s in (1, t) for s, t in zip(reversed(add.shape), reversed(shape)))
        _check(fits, f"add {tuple(add.shape)} does not broadcast to the product's shape {shape}")
    if out is not None:
        _check(out.shape == shape, f"out is {tuple(out.shape)}, the product {shape}")


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, add, split_k):
        ctx.save_for_backward(a, b)
        ctx.add_shape = add.shape if add is not None else None
        return _product(a, b, add, None, split_k)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = grad_add = None
        if ctx.needs_input_grad[0]:
            grad_a = _product(grad, b.transpose(1, 2), None, None, None)
        if ctx.needs_input_grad[1]:
            grad_b = _product(a.transpose(1, 2), grad, None, None, None)
        if ctx.needs_input_grad[2]:
            grad_add = grad.sum_to_size(ctx.add_shape)
        return grad_a, grad_b, grad_add, None


def matmul(a: torch.Tensor, b: torch.Tensor, add: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
           split_k: int | None = None) -> torch.Tensor:  # fmt: skip
    """`a @ b (+ add)` in float32 at float32 accuracy (3xTF32 on tensor cores); differentiable in all three.

    Args:
        a: `(M, K)`, or `(batch, M, K)` for `batch` products; any strides.
        b: `(K, N)`, or `(batch, K, N)`; any strides.
        add: optional, broadcastable to the result `(M, N)` or `(batch, M, N)`: a bias `(N,)` or `(batch, 1, N)`,
            or a whole `(batch, M, N)`; added in float32 before the one rounding of the result.
        out: optional result tensor `(M, N)` or `(batch, M, N)` (any strides, every element overwritten); it may
            be `add` itself but must not overlap `a` or `b`. Not with autograd.
        split_k: K parts computed side by side and summed in order; None chooses from the shape and the GPU.

    Returns:
        `(M, N)` or `(batch, M, N)` float32: `out` when given, else a new contiguous tensor.
    """
    _validate(a, b, add, out)
    if out is not None:
        _check(not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, add))),
               "out= does not support autograd; call it under torch.no_grad() or pass no out")  # fmt: skip
    if a.dim() == 2:  # one product of a batch of 1
        if out is not None:
            _product(a[None], b[None], add, out[None], split_k)
            return out
        return _Matmul.apply(a[None], b[None], add, split_k)[0]
    if out is not None:
        return _product(a, b, add, out, split_k)
    return _Matmul.apply(a, b, add, split_k)


def bmm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.bmm` at float32 accuracy: `a (batch, M, K) @ b (batch, K, N)` -> `(batch, M, N)`."""
    _check(a.dim() == 3, f"bmm takes 3-D tensors, got a {tuple(a.shape)}")
    return matmul(a, b, out=out)


def baddbmm(add: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.baddbmm` (beta = alpha = 1) at float32 accuracy: `add + a (batch, M, K) @ b (batch, K, N)`, `add`
    broadcastable to `(batch, M, N)`."""
    _check(a.dim() == 3, f"baddbmm takes 3-D tensors, got a {tuple(a.shape)}")
    return matmul(a, b, add, out=out)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x[None], weight.t()[None], bias, None, None)[0]

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad[None], weight[None], None, None, None)[0]
        if ctx.needs_input_grad[1]:
            grad_weight = _product(grad.t()[None], x[None], None, None, None)[0]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear` at float32 accuracy: `x (..., K)`, `weight (N, K)`, `bias (N,)` ->
    `(..., N)`. Differentiable; the backward products (`grad @ weight`, and `grad^T @ x` summed over all leading
    dimensions of `x` at once) use the same kernel."""
    _check(x.dim() >= 1 and weight.dim() == 2, f"x must have a feature dimension and weight be 2-D, got x "
           f"{tuple(x.shape)} and weight {tuple(weight.shape)}")  # fmt: skip
    _check(bias is None or bias.shape == weight.shape[:1], f"bias {tuple(bias.shape) if bias is not None else None} "
           f"for weight {tuple(weight.shape)}: expected ({weight.shape[0]},)")  # fmt: skip
    rows = x.reshape(-1, x.shape[-1])  # a view whenever the leading dimensions allow one
    _validate(rows, weight.t(), bias, None)
    return _Linear.apply(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
