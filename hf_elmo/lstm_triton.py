"""Triton kernels for the elementwise part of one LSTM time step, both directions of a layer at once.

Each kernel is one pass over a step's `(2, B, ·)` tensors (direction, row, feature) and replaces the dozen
small operations PyTorch would launch for it. Arithmetic is in float32 (float64 for float64 tensors);
loads and stores are in the tensors' own dtypes. A row whose mask is 0 at a step keeps its state and
outputs 0, so that padded rows need no special shapes. The same functions written with PyTorch operations
are in `gpu_lstm.py` (`_cell_forward_torch`, ...): the tests keep both equal.

Importing this module needs Triton. With `TRITON_INTERPRET=1` set before the import, the kernels run on CPU
tensors (slowly), which is how the CPU test suite checks them.
"""

import torch

from .triton_support import INTERPRETED, require_triton, tl, triton

require_triton(__name__)  # its importer then keeps PyTorch's operations

_BLOCK = 512


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # tanh through exp of a non-positive argument: no overflow, and accurate near 0 unlike 2 sigmoid(2x) - 1.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _cell_forward_kernel(
    gate_inputs_ptr,
    gates_ptr,
    memory_in_ptr,
    memory_out_ptr,
    mask_ptr,
    cell_output_ptr,
    activations_ptr,
    cell_tanh_ptr,
    cell_passed_ptr,
    rows,
    dim,
    s_gin_d,
    s_gin_b,
    s_gates_d,
    s_gates_b,
    s_mem_in_d,
    s_mem_in_b,
    s_mem_out_d,
    s_mem_out_b,
    s_mask_d,
    s_mask_b,
    s_out_d,
    s_out_b,
    s_act_d,
    s_act_b,
    s_tanh_d,
    s_tanh_b,
    s_passed_d,
    s_passed_b,
    cell_clip,
    HAS_CLIP: tl.constexpr,
    SAVE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    d = row // rows
    b = row % rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    gate_inputs = gate_inputs_ptr + d * s_gin_d + b * s_gin_b + cols
    gates = gates_ptr + d * s_gates_d + b * s_gates_b + cols
    i = tl.load(gate_inputs, mask=valid, other=0.0).to(COMPUTE) + tl.load(gates, mask=valid, other=0.0).to(COMPUTE)
    f = tl.load(gate_inputs + dim, mask=valid, other=0.0).to(COMPUTE) + tl.load(gates + dim, mask=valid, other=0.0).to(
        COMPUTE
    )
    g = tl.load(gate_inputs + 2 * dim, mask=valid, other=0.0).to(COMPUTE) + tl.load(
        gates + 2 * dim, mask=valid, other=0.0
    ).to(COMPUTE)
    o = tl.load(gate_inputs + 3 * dim, mask=valid, other=0.0).to(COMPUTE) + tl.load(
        gates + 3 * dim, mask=valid, other=0.0
    ).to(COMPUTE)
    i, f, g, o = _sigmoid(i), _sigmoid(f), _tanh(g), _sigmoid(o)
    memory_in = tl.load(memory_in_ptr + d * s_mem_in_d + b * s_mem_in_b + cols, mask=valid, other=0.0).to(COMPUTE)
    keep = tl.load(mask_ptr + d * s_mask_d + b * s_mask_b) != 0
    memory = f * memory_in + i * g
    if HAS_CLIP:
        passed = tl.abs(memory) <= cell_clip
        memory = tl.minimum(tl.maximum(memory, -cell_clip), cell_clip)
    t = _tanh(memory)
    memory_out = memory_out_ptr + d * s_mem_out_d + b * s_mem_out_b + cols
    tl.store(memory_out, tl.where(keep, memory, memory_in).to(memory_out_ptr.dtype.element_ty), mask=valid)
    cell_output = cell_output_ptr + d * s_out_d + b * s_out_b + cols
    tl.store(cell_output, tl.where(keep, o * t, 0.0).to(cell_output_ptr.dtype.element_ty), mask=valid)
    if SAVE:
        activations = activations_ptr + d * s_act_d + b * s_act_b + cols
        act_type = activations_ptr.dtype.element_ty
        tl.store(activations, i.to(act_type), mask=valid)
        tl.store(activations + dim, f.to(act_type), mask=valid)
        tl.store(activations + 2 * dim, g.to(act_type), mask=valid)
        tl.store(activations + 3 * dim, o.to(act_type), mask=valid)
        tl.store(cell_tanh_ptr + d * s_tanh_d + b * s_tanh_b + cols, t.to(cell_tanh_ptr.dtype.element_ty), mask=valid)
        if HAS_CLIP:
            tl.store(cell_passed_ptr + d * s_passed_d + b * s_passed_b + cols, passed.to(tl.int8), mask=valid)


@triton.jit
def _hidden_forward_kernel(
    projected_ptr,
    hidden_in_ptr,
    hidden_out_ptr,
    output_ptr,
    mask_ptr,
    hidden_passed_ptr,
    rows,
    dim,
    s_proj_d,
    s_proj_b,
    s_hin_d,
    s_hin_b,
    s_hout_d,
    s_hout_b,
    s_out_d,
    s_out_b,
    s_mask_d,
    s_mask_b,
    s_passed_d,
    s_passed_b,
    proj_clip,
    HAS_CLIP: tl.constexpr,
    SAVE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    d = row // rows
    b = row % rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    hidden = tl.load(projected_ptr + d * s_proj_d + b * s_proj_b + cols, mask=valid, other=0.0).to(COMPUTE)
    if HAS_CLIP:
        passed = tl.abs(hidden) <= proj_clip
        hidden = tl.minimum(tl.maximum(hidden, -proj_clip), proj_clip)
        if SAVE:
            tl.store(hidden_passed_ptr + d * s_passed_d + b * s_passed_b + cols, passed.to(tl.int8), mask=valid)
    keep = tl.load(mask_ptr + d * s_mask_d + b * s_mask_b) != 0
    hidden_in = tl.load(hidden_in_ptr + d * s_hin_d + b * s_hin_b + cols, mask=valid, other=0.0).to(COMPUTE)
    hidden_out = hidden_out_ptr + d * s_hout_d + b * s_hout_b + cols
    tl.store(hidden_out, tl.where(keep, hidden, hidden_in).to(hidden_out_ptr.dtype.element_ty), mask=valid)
    output = output_ptr + d * s_out_d + b * s_out_b + cols
    tl.store(output, tl.where(keep, hidden, 0.0).to(output_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _hidden_backward_kernel(
    grad_from_next_ptr,
    mask_next_ptr,
    grad_hidden_ptr,
    grad_output_ptr,
    hidden_passed_ptr,
    mask_ptr,
    grad_projected_ptr,
    rows,
    dim,
    s_next_d,
    s_next_b,
    s_mnext_d,
    s_mnext_b,
    s_gh_d,
    s_gh_b,
    s_gout_d,
    s_gout_b,
    s_passed_d,
    s_passed_b,
    s_mask_d,
    s_mask_b,
    s_gproj_d,
    s_gproj_b,
    HAS_CLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    d = row // rows
    b = row % rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    # The gradient reaching this step's hidden state: through the next step's gates where that step ran,
    # else unchanged (the state was only carried through it).
    grad_hidden = grad_hidden_ptr + d * s_gh_d + b * s_gh_b + cols
    carried = tl.load(grad_hidden, mask=valid, other=0.0).to(COMPUTE)
    from_next = tl.load(grad_from_next_ptr + d * s_next_d + b * s_next_b + cols, mask=valid, other=0.0).to(COMPUTE)
    next_ran = tl.load(mask_next_ptr + d * s_mnext_d + b * s_mnext_b) != 0
    grad = tl.where(next_ran, from_next, carried)
    tl.store(grad_hidden, grad.to(grad_hidden_ptr.dtype.element_ty), mask=valid)
    grad = grad + tl.load(grad_output_ptr + d * s_gout_d + b * s_gout_b + cols, mask=valid, other=0.0).to(COMPUTE)
    if HAS_CLIP:
        passed = tl.load(hidden_passed_ptr + d * s_passed_d + b * s_passed_b + cols, mask=valid, other=0)
        grad = tl.where(passed != 0, grad, 0.0)
    ran = tl.load(mask_ptr + d * s_mask_d + b * s_mask_b) != 0
    grad_projected = grad_projected_ptr + d * s_gproj_d + b * s_gproj_b + cols
    tl.store(grad_projected, tl.where(ran, grad, 0.0).to(grad_projected_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _cell_backward_kernel(
    grad_cell_output_ptr,
    grad_memory_ptr,
    activations_ptr,
    cell_tanh_ptr,
    memory_in_ptr,
    cell_passed_ptr,
    mask_ptr,
    grad_gates_ptr,
    rows,
    dim,
    s_gco_d,
    s_gco_b,
    s_gmem_d,
    s_gmem_b,
    s_act_d,
    s_act_b,
    s_tanh_d,
    s_tanh_b,
    s_mem_d,
    s_mem_b,
    s_passed_d,
    s_passed_b,
    s_mask_d,
    s_mask_b,
    s_gg_d,
    s_gg_b,
    HAS_CLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    d = row // rows
    b = row % rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < dim
    activations = activations_ptr + d * s_act_d + b * s_act_b + cols
    i = tl.load(activations, mask=valid, other=0.0).to(COMPUTE)
    f = tl.load(activations + dim, mask=valid, other=0.0).to(COMPUTE)
    g = tl.load(activations + 2 * dim, mask=valid, other=0.0).to(COMPUTE)
    o = tl.load(activations + 3 * dim, mask=valid, other=0.0).to(COMPUTE)
    t = tl.load(cell_tanh_ptr + d * s_tanh_d + b * s_tanh_b + cols, mask=valid, other=0.0).to(COMPUTE)
    memory_in = tl.load(memory_in_ptr + d * s_mem_d + b * s_mem_b + cols, mask=valid, other=0.0).to(COMPUTE)
    grad_cell_output = tl.load(grad_cell_output_ptr + d * s_gco_d + b * s_gco_b + cols, mask=valid, other=0.0)
    grad_cell_output = grad_cell_output.to(COMPUTE)
    grad_memory = grad_memory_ptr + d * s_gmem_d + b * s_gmem_b + cols
    carried = tl.load(grad_memory, mask=valid, other=0.0).to(COMPUTE)
    grad_cell = carried + grad_cell_output * o * (1.0 - t * t)
    if HAS_CLIP:
        passed = tl.load(cell_passed_ptr + d * s_passed_d + b * s_passed_b + cols, mask=valid, other=0)
        grad_cell = tl.where(passed != 0, grad_cell, 0.0)
    ran = tl.load(mask_ptr + d * s_mask_d + b * s_mask_b) != 0
    grad_gates = grad_gates_ptr + d * s_gg_d + b * s_gg_b + cols
    out_type = grad_gates_ptr.dtype.element_ty
    tl.store(grad_gates, tl.where(ran, grad_cell * g * i * (1.0 - i), 0.0).to(out_type), mask=valid)
    tl.store(grad_gates + dim, tl.where(ran, grad_cell * memory_in * f * (1.0 - f), 0.0).to(out_type), mask=valid)
    tl.store(grad_gates + 2 * dim, tl.where(ran, grad_cell * i * (1.0 - g * g), 0.0).to(out_type), mask=valid)
    tl.store(grad_gates + 3 * dim, tl.where(ran, grad_cell_output * t * o * (1.0 - o), 0.0).to(out_type), mask=valid)
    tl.store(grad_memory, tl.where(ran, grad_cell * f, carried).to(grad_memory_ptr.dtype.element_ty), mask=valid)


def _compute_type(tensor: torch.Tensor):
    return tl.float64 if tensor.dtype == torch.float64 else tl.float32


def _grid(tensor: torch.Tensor, dim: int) -> tuple[int, int]:
    return (tensor.shape[0] * tensor.shape[1], triton.cdiv(dim, _BLOCK))


def _strides(*tensors):
    """The direction and row strides of `(2, B, ·)` tensors whose last axis is contiguous."""
    return [s for t in tensors for s in t.stride()[:2]]


def cell_forward(
    gate_inputs, gates, memory_in, memory_out, mask, cell_output, activations, cell_tanh, cell_passed, cell_clip
):
    """See `gpu_lstm._cell_forward_torch`."""
    save = activations is not None
    dim = memory_in.shape[-1]
    saved = (activations, cell_tanh, cell_passed if cell_passed is not None else cell_tanh) if save else (gates,) * 3
    _cell_forward_kernel[_grid(gates, dim)](
        gate_inputs,
        gates,
        memory_in,
        memory_out,
        mask,
        cell_output,
        *saved,
        gates.shape[1],
        dim,
        *_strides(gate_inputs, gates, memory_in, memory_out),
        *mask.stride(),
        *_strides(cell_output, *saved),
        0.0 if cell_clip is None else cell_clip,
        HAS_CLIP=cell_clip is not None,
        SAVE=save,
        COMPUTE=_compute_type(memory_in),
        BLOCK=_BLOCK,
    )


def hidden_forward(projected, hidden_in, hidden_out, output, mask, hidden_passed, proj_clip):
    """See `gpu_lstm._hidden_forward_torch`."""
    save = hidden_passed is not None
    passed = hidden_passed if save else projected
    dim = projected.shape[-1]
    _hidden_forward_kernel[_grid(projected, dim)](
        projected,
        hidden_in,
        hidden_out,
        output,
        mask,
        passed,
        projected.shape[1],
        dim,
        *_strides(projected, hidden_in, hidden_out, output),
        *mask.stride(),
        *_strides(passed),
        0.0 if proj_clip is None else proj_clip,
        HAS_CLIP=proj_clip is not None,
        SAVE=save,
        COMPUTE=_compute_type(hidden_in),
        BLOCK=_BLOCK,
    )


def hidden_backward(grad_from_next, mask_next, grad_hidden, grad_output, hidden_passed, mask, grad_projected):
    """See `gpu_lstm._hidden_backward_torch`."""
    passed = hidden_passed if hidden_passed is not None else grad_output
    dim = grad_output.shape[-1]
    _hidden_backward_kernel[_grid(grad_output, dim)](
        grad_from_next,
        mask_next,
        grad_hidden,
        grad_output,
        passed,
        mask,
        grad_projected,
        grad_output.shape[1],
        dim,
        *_strides(grad_from_next),
        *mask_next.stride(),
        *_strides(grad_hidden, grad_output, passed),
        *mask.stride(),
        *_strides(grad_projected),
        HAS_CLIP=hidden_passed is not None,
        COMPUTE=_compute_type(grad_hidden),
        BLOCK=_BLOCK,
    )


def cell_backward(grad_cell_output, grad_memory, activations, cell_tanh, memory_in, cell_passed, mask, grad_gates):
    """See `gpu_lstm._cell_backward_torch`."""
    passed = cell_passed if cell_passed is not None else cell_tanh
    dim = cell_tanh.shape[-1]
    _cell_backward_kernel[_grid(cell_tanh, dim)](
        grad_cell_output,
        grad_memory,
        activations,
        cell_tanh,
        memory_in,
        passed,
        mask,
        grad_gates,
        cell_tanh.shape[1],
        dim,
        *_strides(grad_cell_output, grad_memory, activations, cell_tanh, memory_in, passed),
        *mask.stride(),
        *_strides(grad_gates),
        HAS_CLIP=cell_passed is not None,
        COMPUTE=_compute_type(grad_memory),
        BLOCK=_BLOCK,
    )


@triton.jit
def _gates_cell_forward_kernel(
    x_ptr,
    weight_ptr,
    gate_inputs_ptr,
    memory_in_ptr,
    memory_out_ptr,
    mask_ptr,
    cell_output_ptr,
    activations_ptr,
    cell_tanh_ptr,
    cell_passed_ptr,
    rows,
    dim,
    depth,
    s_x_d,
    s_x_b,
    s_w_d,
    s_w_n,
    s_gin_d,
    s_gin_b,
    s_mem_in_d,
    s_mem_in_b,
    s_mem_out_d,
    s_mem_out_b,
    s_mask_d,
    s_mask_b,
    s_out_d,
    s_out_b,
    s_act_d,
    s_act_b,
    s_tanh_d,
    s_tanh_b,
    s_passed_d,
    s_passed_b,
    cell_clip,
    HAS_CLIP: tl.constexpr,
    SAVE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    OPERANDS_IN_FLOAT32: tl.constexpr,
):
    d = tl.program_id(0)
    row = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = row < rows, cols < dim
    # The four gates of BLOCK_N cells: rows q * dim + cols of the weight, one accumulator each.
    acc_i = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_f = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_o = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_rows = x_ptr + d * s_x_d + row[:, None] * s_x_b
    w_rows = weight_ptr + d * s_w_d + cols[:, None] * s_w_n
    for k0 in range(0, depth, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        a = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w_i = tl.load(w_rows + ks[None, :], mask=w_mask, other=0.0)
        w_f = tl.load(w_rows + dim * s_w_n + ks[None, :], mask=w_mask, other=0.0)
        w_g = tl.load(w_rows + 2 * dim * s_w_n + ks[None, :], mask=w_mask, other=0.0)
        w_o = tl.load(w_rows + 3 * dim * s_w_n + ks[None, :], mask=w_mask, other=0.0)
        if OPERANDS_IN_FLOAT32:  # the interpreter's products of bfloat16 operands are wrong (Triton 3.9)
            a, w_i, w_f = a.to(tl.float32), w_i.to(tl.float32), w_f.to(tl.float32)
            w_g, w_o = w_g.to(tl.float32), w_o.to(tl.float32)
        acc_i = tl.dot(a, tl.trans(w_i), acc_i)
        acc_f = tl.dot(a, tl.trans(w_f), acc_f)
        acc_g = tl.dot(a, tl.trans(w_g), acc_g)
        acc_o = tl.dot(a, tl.trans(w_o), acc_o)
    valid = row_ok[:, None] & col_ok[None, :]
    gate_inputs = gate_inputs_ptr + d * s_gin_d + row[:, None] * s_gin_b + cols[None, :]
    i = _sigmoid(acc_i + tl.load(gate_inputs, mask=valid, other=0.0).to(tl.float32))
    f = _sigmoid(acc_f + tl.load(gate_inputs + dim, mask=valid, other=0.0).to(tl.float32))
    g = _tanh(acc_g + tl.load(gate_inputs + 2 * dim, mask=valid, other=0.0).to(tl.float32))
    o = _sigmoid(acc_o + tl.load(gate_inputs + 3 * dim, mask=valid, other=0.0).to(tl.float32))
    memory_in_at = memory_in_ptr + d * s_mem_in_d + row[:, None] * s_mem_in_b + cols[None, :]
    memory_in = tl.load(memory_in_at, mask=valid, other=0.0).to(tl.float32)
    keep = (tl.load(mask_ptr + d * s_mask_d + row * s_mask_b, mask=row_ok, other=0) != 0)[:, None]
    memory = f * memory_in + i * g
    if HAS_CLIP:
        passed = tl.abs(memory) <= cell_clip
        memory = tl.minimum(tl.maximum(memory, -cell_clip), cell_clip)
    t = _tanh(memory)
    memory_out = memory_out_ptr + d * s_mem_out_d + row[:, None] * s_mem_out_b + cols[None, :]
    tl.store(memory_out, tl.where(keep, memory, memory_in).to(memory_out_ptr.dtype.element_ty), mask=valid)
    cell_output = cell_output_ptr + d * s_out_d + row[:, None] * s_out_b + cols[None, :]
    tl.store(cell_output, tl.where(keep, o * t, 0.0).to(cell_output_ptr.dtype.element_ty), mask=valid)
    if SAVE:
        activations = activations_ptr + d * s_act_d + row[:, None] * s_act_b + cols[None, :]
        act_type = activations_ptr.dtype.element_ty
        tl.store(activations, i.to(act_type), mask=valid)
        tl.store(activations + dim, f.to(act_type), mask=valid)
        tl.store(activations + 2 * dim, g.to(act_type), mask=valid)
        tl.store(activations + 3 * dim, o.to(act_type), mask=valid)
        cell_tanh = cell_tanh_ptr + d * s_tanh_d + row[:, None] * s_tanh_b + cols[None, :]
        tl.store(cell_tanh, t.to(cell_tanh_ptr.dtype.element_ty), mask=valid)
        if HAS_CLIP:
            cell_passed = cell_passed_ptr + d * s_passed_d + row[:, None] * s_passed_b + cols[None, :]
            tl.store(cell_passed, passed.to(tl.int8), mask=valid)


def _block(size: int, smallest: int, largest: int) -> int:
    return max(smallest, min(largest, triton.next_power_of_2(size)))


def gates_cell_forward(
    inputs,
    weight,
    gate_inputs,
    memory_in,
    memory_out,
    mask,
    cell_output,
    activations,
    cell_tanh,
    cell_passed,
    cell_clip,
):
    """`cell_forward(gate_inputs, inputs @ weight^T, ...)` as one kernel: the step's product `(2, B, K) @ (2, K, 4D)`
    (`weight` `(2, 4D, K)`, its last axis contiguous) with the elementwise step in its epilogue, so that the gates
    `(2, B, 4D)` are never written to memory and read back. Products of 16-bit operands accumulate in float32 (a GPU's
    float32 operands would be rounded to TF32: not for float32 models)."""
    if not INTERPRETED and weight.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"gates_cell_forward multiplies 16-bit operands on a GPU, got {weight.dtype}.")
    save = activations is not None
    rows, depth = inputs.shape[1], inputs.shape[2]
    dim = memory_in.shape[-1]
    saved = (
        (activations, cell_tanh, cell_passed if cell_passed is not None else cell_tanh) if save else (memory_in,) * 3
    )
    block_m, block_n, block_k = _block(rows, 16, 128), _block(dim, 16, 32), _block(depth, 16, 64)
    grid = (2, triton.cdiv(rows, block_m), triton.cdiv(dim, block_n))
    _gates_cell_forward_kernel[grid](
        inputs,
        weight,
        gate_inputs,
        memory_in,
        memory_out,
        mask,
        cell_output,
        *saved,
        rows,
        dim,
        depth,
        *_strides(inputs, weight),
        *_strides(gate_inputs, memory_in, memory_out),
        *mask.stride(),
        *_strides(cell_output, *saved),
        0.0 if cell_clip is None else cell_clip,
        HAS_CLIP=cell_clip is not None,
        SAVE=save,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        OPERANDS_IN_FLOAT32=INTERPRETED,
        num_warps=8 if block_m >= 128 else 4,
        num_stages=3,
    )
