"""The time loops of ELMo's LSTM (projected, clipped state) on CPUs, forward and backward, one layer at a time.

Rows come sorted by length, longest first, so the rows still running at a time step are a prefix of the
batch. Every per-position tensor is kept *packed*: the running rows of step 0, then those of step 1, and so
on (`PackedSteps`), so each step's rows are one contiguous block, no padding is computed or stored, and the
state a step starts from is a prefix of the block the step before wrote. Each step writes its results once,
in place, into the whole-sequence buffers that its backward reads (activations, cell, its tanh, the cell
output), with no per-step copies. Under autograd a layer is one `torch.autograd.Function` whose backward
walks time once for the gradients that must be sequential (state and gates) and then forms each weight
gradient of all steps with one matrix product. The directions of a layer are independent: on two or more
intra-op threads each runs on a thread of its own, forward and backward (`cpu_threads.py`).

Same arithmetic as the straightforward per-step formulation up to float rounding; the tests keep both equal
(values within 1e-5, gradients within 1e-4 relative).
"""

from dataclasses import dataclass
from functools import partial

import torch

from .cpu_threads import can_run_concurrently, run_concurrently
from .onednn_linear import matmul_nt, matmul_nt_add, matmul_tn, uses_onednn


@dataclass(frozen=True)
class PackedSteps:
    """Where the running rows of each time step of a length-sorted, time-major `(T, B)` batch are.

    Position `k` of a packed `(N, ...)` tensor is row `k - offsets[t]` at step `t`, for
    `offsets[t] <= k < offsets[t] + batch_sizes[t]`.
    """

    batch_sizes: list[int]
    """`T` ints: rows still running at each step (non-increasing)."""
    offsets: list[int]
    """`T` ints: where each step's block starts."""
    padded_index: torch.Tensor
    """`(N,)`: `t * B + row` of each packed position in the flattened `(T * B)` padded layout."""
    final_forward: torch.Tensor
    final_reverse: torch.Tensor
    """`(B,)`: where each row's final state is in `cat([packed (N, ...), initial (B, ...)])`: its last real step
    (forward) or step 0 (reverse), or its initial state for a row of length 0."""
    entering_forward: torch.Tensor
    entering_reverse: torch.Tensor
    """`(N,)`: where the state each position starts from is in `cat([packed, initial])`."""

    @classmethod
    def from_batch_sizes(cls, batch_sizes: list[int], batch_size: int, device: torch.device) -> "PackedSteps":
        num_steps = len(batch_sizes)
        sizes = torch.tensor(batch_sizes or [0], dtype=torch.long)  # a step of no rows stands in for no steps
        offsets = torch.cumsum(sizes, 0) - sizes
        total = int(sizes.sum())
        step = torch.repeat_interleave(torch.arange(num_steps), sizes)  # (N,)
        row = torch.arange(total) - offsets[step]
        initial = total + row  # a row's own initial state
        lengths = (sizes[None, :] > torch.arange(batch_size)[:, None]).sum(dim=1)  # (B,)
        rows = torch.arange(batch_size)
        last_step = (lengths - 1).clamp(min=0)
        final_forward = torch.where(lengths > 0, offsets[last_step] + rows, total + rows)
        final_reverse = torch.where(lengths > 0, rows, total + rows)  # step 0's block starts at 0
        # Forward: step t starts from step t - 1's block. Reverse: from step t + 1's, where the row ran there.
        entering_forward = torch.where(step > 0, offsets[(step - 1).clamp(min=0)] + row, initial)
        next_step = (step + 1).clamp(max=num_steps - 1)
        ran_next = (step + 1 < num_steps) & (row < sizes[next_step])
        entering_reverse = torch.where(ran_next, offsets[next_step] + row, initial)
        to_device = partial(torch.Tensor.to, device=device)
        return cls(
            list(batch_sizes),
            offsets.tolist(),
            to_device(step * batch_size + row),
            to_device(final_forward),
            to_device(final_reverse),
            to_device(entering_forward),
            to_device(entering_reverse),
        )

    @property
    def num_positions(self) -> int:
        return self.offsets[-1] + self.batch_sizes[-1] if self.batch_sizes else 0

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """`(T, B, ...)` -> `(N, ...)`."""
        return padded.reshape(-1, *padded.shape[2:]).index_select(0, self.padded_index)

    def unpack(self, packed: torch.Tensor, batch_size: int) -> torch.Tensor:
        """`(N, ...)` -> `(T, B, ...)`, zeros where a row is not running."""
        padded = packed.new_zeros(len(self.batch_sizes) * batch_size, *packed.shape[1:])
        padded.index_copy_(0, self.padded_index, packed)
        return padded.view(len(self.batch_sizes), batch_size, *packed.shape[1:])


@dataclass(frozen=True)
class LstmSettings:
    cell_clip: float | None
    proj_clip: float | None
    forget_bias: float
    """Added to the forget gate's bias at run time (TensorFlow's `LSTMCell(forget_bias=...)`), 0 for none."""


def lstm_layer(
    inputs: list[torch.Tensor],
    states: list[tuple[torch.Tensor, torch.Tensor]],
    weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    reverse: list[bool],
    steps: PackedSteps,
    settings: LstmSettings,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Runs the directions of one LSTM layer over a length-sorted, time-major batch.

    Args:
        inputs: per direction, `(T, B, P_in)`.
        states: per direction, `(hidden (B, P), memory (B, D))`: the state each row starts from.
        weights: per direction, `(W_x (4D, P_in), b (4D,), W_h (4D, P), W_p (P, D))`, gates in the order
            `[input, forget, cell, output]`.
        reverse: per direction, whether it walks from each row's last real step down to 0.
        steps: the batch's running rows per step.

    Returns:
        per direction, outputs `(T, B, P)` (0 where a row is not running), final hidden `(B, P)` and memory `(B, D)`.
    """
    tensors = [t for x, state, w in zip(inputs, states, weights) for t in (x, *state, *w)]
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type):
        # Autocast does not reach products written into preallocated buffers: cast once, run in that dtype.
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            results = _run_layer([t.to(dtype) for t in tensors], reverse, steps, settings)
    else:
        results = _run_layer(tensors, reverse, steps, settings)
    return [tuple(results[3 * k : 3 * k + 3]) for k in range(len(reverse))]


# Under autograd, the directions go to threads of their own only where a step's products are large enough: each
# step is a dozen operations whose Python dispatch holds the GIL, so with small products the two threads mostly wait
# for each other, and one thread with both intra-op threads per operation is faster. Per row and step, the products
# take 5 D P multiply-adds: the mid-size model (D 512, P 64: 164K) trains 9% faster without the threads, the small
# preset (1024, 128: 655K) 7% faster with them, the original (4096, 512) the same either way (AMD EPYC Zen 3,
# 2 threads, alternating runs).
_MIN_STEP_MULTIPLY_ADDS_FOR_THREADS = 1 << 18


def _run_layer(tensors, reverse, steps, settings):
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        _, hidden, memory = _direction(tensors, 0)[:3]
        large_steps = 5 * memory.shape[1] * hidden.shape[1] >= _MIN_STEP_MULTIPLY_ADDS_FOR_THREADS
        concurrent = len(reverse) > 1 and large_steps and can_run_concurrently(tensors[0], training=True)
        return _LstmLayer.apply(tuple(reverse), steps, settings, concurrent, *tensors)
    calls = [
        partial(_forward_direction, *_direction(tensors, k), steps, backwards, settings, save=False)
        for k, backwards in enumerate(reverse)
    ]
    concurrent = len(calls) > 1 and can_run_concurrently(tensors[0])
    return [t for result in _run_all(calls, concurrent) for t in result[:3]]


_TENSORS_PER_DIRECTION = 7  # x, hidden, memory, W_x, b, W_h, W_p


def _direction(tensors, k):
    return tensors[_TENSORS_PER_DIRECTION * k : _TENSORS_PER_DIRECTION * (k + 1)]


def _run_all(calls, concurrent: bool):
    return run_concurrently(*calls) if concurrent else [call() for call in calls]


def _tanh_from_sigmoid_(sigmoid_of_double: torch.Tensor, minus_one: torch.Tensor) -> torch.Tensor:
    """`tanh(x) = 2 sigmoid(2x) - 1`, in place on `sigmoid(2x)`, in one operation (`minus_one`: a 0-d tensor)."""
    return torch.add(minus_one, sigmoid_of_double, alpha=2, out=sigmoid_of_double)


def _step_product(x: torch.Tensor, weight: torch.Tensor):
    """The product function for one direction's per-step products of at most `x`'s rows by `weight.T`: the
    library is chosen once per call, not at every step (where the check costs as much as a small operation)."""
    return _product if uses_onednn(x, weight) else _aten_product


def _aten_product(x: torch.Tensor, weight: torch.Tensor, addend: torch.Tensor | None = None, out=None) -> torch.Tensor:
    """`_product` through PyTorch's own kernels, always into `out` when given."""
    if x.shape[0] == 1:
        return _aten_product(x.expand(2, -1), weight, None if addend is None else addend.expand(2, -1))[:1]
    if addend is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(addend, x, weight.t(), out=out)


def _product(x: torch.Tensor, weight: torch.Tensor, addend: torch.Tensor | None = None, out=None) -> torch.Tensor:
    """`addend + x @ weight.T` of a step's rows, into `out` where PyTorch multiplies; a product that goes to oneDNN
    (large ones, `onednn_linear.py`) comes back as a new tensor instead of being copied: use the result.

    A product of one row runs as a matrix-vector kernel whose rounding can depend on the weights' memory
    alignment; multiplying the row twice keeps results independent of it."""
    if x.shape[0] == 1:
        return _product(x.expand(2, -1), weight, None if addend is None else addend.expand(2, -1))[:1]
    if addend is None:
        return matmul_nt(x, weight, out=out, copy_to_out=False)
    return matmul_nt_add(x, weight, addend, out=out, copy_to_out=False)


def _forward_direction(x, hidden, memory, input_weight, bias, state_weight, projection_weight, steps, reverse,
                       settings, save):  # fmt: skip
    """One direction over the batch. Returns outputs `(T, B, P)`, final hidden `(B, P)` and memory `(B, D)`, and
    with `save` the packed tensors the backward reads."""
    num_steps, batch_size = x.shape[:2]
    cell_dim = state_weight.shape[0] // 4
    projection_dim = projection_weight.shape[0]
    total = steps.num_positions
    cell_clip, proj_clip = settings.cell_clip, settings.proj_clip
    cell_block = slice(2 * cell_dim, 3 * cell_dim)
    # PyTorch's CPU tanh is several times slower than its sigmoid; tanh(x) = 2 sigmoid(2x) - 1 has an absolute
    # error of a few units in the last place in float32 and float64, too coarse in 16-bit types.
    tanh_by_sigmoid = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
    if settings.forget_bias or tanh_by_sigmoid:
        bias = bias.clone()
        # Added at run time, as TensorFlow's LSTMCell does: here once, into the input products.
        bias[cell_dim : 2 * cell_dim] += settings.forget_bias
    if tanh_by_sigmoid:
        # The cell block's weights and bias doubled, so that the products give the doubled input that one sigmoid
        # over all four blocks needs, with no step of its own; doubling is exact, the products the same bit for bit.
        input_weight, state_weight = input_weight.clone(), state_weight.clone()
        for tensor in (input_weight, state_weight, bias):
            tensor[cell_block] *= 2
        minus_one = x.new_full((), -1.0)
    step_product = _step_product(hidden, state_weight)
    projection_product = _step_product(memory, projection_weight)
    packed_x = steps.pack(x)  # (N, P_in)
    # The input-to-gate products of all steps are one matrix product; only W_h h is sequential. Each step adds
    # its W_h h into its block and activates it in place: the buffer ends up holding the gate activations.
    activations = matmul_nt(packed_x, input_weight, bias)  # (N, 4D)
    new = partial(x.new_empty)

    outputs = new(total, projection_dim)  # each step's new hidden state, after the clip
    if save:
        cell_tanh, cell_outputs = new(total, cell_dim), new(total, cell_dim)
        cells = new(total, cell_dim)  # each step's new memory, after the clip
        # Before the clips: where their values passed through is where gradients do.
        raw_cells = new(total, cell_dim) if cell_clip is not None else cells
        raw_outputs = new(total, projection_dim) if proj_clip is not None else outputs
        hidden_state = memory_state = None
    else:
        # Without a backward only the state is kept, updated in place row-prefix by row-prefix: a row that stops
        # keeps its final state, a row that starts (reverse direction) finds its initial one.
        hidden_state = hidden.clone(memory_format=torch.contiguous_format)
        memory_state = memory.clone(memory_format=torch.contiguous_format)
        scratch_tanh, scratch_outputs = new(batch_size, cell_dim), new(batch_size, cell_dim)
        # Activations go to a buffer of one step's rows, which stays in cache, rather than over the gate inputs.
        scratch_gates = new(batch_size, 4 * cell_dim)

    # Each step's rows of every buffer, as views made once (indexing per step costs more than the step's arithmetic
    # on small models).
    sizes = steps.batch_sizes
    act_steps = activations.split(sizes)
    gate_steps = [block.split(sizes) for block in activations.split(cell_dim, dim=1)]  # input, forget, cell, output
    output_steps = outputs.split(sizes)
    if save:
        tanh_steps, cell_output_steps = cell_tanh.split(sizes), cell_outputs.split(sizes)
        cell_steps, raw_cell_steps, raw_output_steps = cells.split(sizes), raw_cells.split(sizes), raw_outputs.split(sizes)

    previous = None  # the step before
    for t in range(num_steps - 1, -1, -1) if reverse else range(num_steps):
        n = sizes[t]
        if n == 0:
            continue
        if save:
            if previous is None:
                hidden_in, memory_in = hidden[:n], memory[:n]
            elif sizes[previous] >= n:
                hidden_in, memory_in = output_steps[previous][:n], cell_steps[previous][:n]
            else:  # reverse: rows that start here join those that ran the step before
                ran = sizes[previous]
                hidden_in = torch.cat([output_steps[previous], hidden[ran:n]])
                memory_in = torch.cat([cell_steps[previous], memory[ran:n]])
            tanh_c, cell_out, raw_c, raw_h = tanh_steps[t], cell_output_steps[t], raw_cell_steps[t], raw_output_steps[t]
        else:
            hidden_in, memory_in = hidden_state[:n], memory_state[:n]
            tanh_c, cell_out = scratch_tanh[:n], scratch_outputs[:n]
            raw_c = memory_in  # updated in place
        previous = t

        gates = step_product(hidden_in, state_weight, act_steps[t], out=act_steps[t])  # in place, or new from oneDNN
        if save:
            act = act_steps[t]
            input_gate, forget_gate, cell_input, output_gate = (block_steps[t] for block_steps in gate_steps)
        else:
            act = scratch_gates[:n]
            input_gate, forget_gate, cell_input, output_gate = act.chunk(4, dim=1)
        if tanh_by_sigmoid:  # one sigmoid over all four blocks, the cell block at twice its input
            torch.sigmoid(gates, out=act)
            _tanh_from_sigmoid_(cell_input, minus_one)
        else:
            torch.tanh(gates[:, cell_block], out=cell_input)
            torch.sigmoid(gates[:, : 2 * cell_dim], out=act[:, : 2 * cell_dim])
            torch.sigmoid(gates[:, 3 * cell_dim :], out=output_gate)
        torch.mul(forget_gate, memory_in, out=raw_c).addcmul_(input_gate, cell_input)
        if cell_clip is not None:
            cell = cell_steps[t] if save else raw_c
            torch.clamp(raw_c, -cell_clip, cell_clip, out=cell)
        else:
            cell = raw_c
        if tanh_by_sigmoid:
            _tanh_from_sigmoid_(torch.sigmoid(torch.mul(cell, 2, out=tanh_c), out=tanh_c), minus_one)
        else:
            torch.tanh(cell, out=tanh_c)
        torch.mul(output_gate, tanh_c, out=cell_out)
        target = raw_h if save else output_steps[t]
        new_hidden = projection_product(cell_out, projection_weight, out=target)
        if proj_clip is not None:
            torch.clamp(new_hidden, -proj_clip, proj_clip, out=output_steps[t])
            if new_hidden is not target and save:
                target.copy_(new_hidden)  # the backward reads where the clip passed values through
        elif new_hidden is not target:
            target.copy_(new_hidden)
        if not save:
            hidden_state[:n] = output_steps[t]

    padded_outputs = steps.unpack(outputs, batch_size)
    if not save:
        return padded_outputs, hidden_state, memory_state, None
    final = steps.final_reverse if reverse else steps.final_forward
    final_hidden = torch.cat([outputs, hidden]).index_select(0, final)
    final_memory = torch.cat([cells, memory]).index_select(0, final)
    saved = {
        "packed_x": packed_x,
        "activations": activations,
        "cell_tanh": cell_tanh,
        "cell_outputs": cell_outputs,
        "cells": cells,
        "outputs": outputs,
    }
    if cell_clip is not None:
        saved["raw_cells"] = raw_cells
    if proj_clip is not None:
        saved["raw_outputs"] = raw_outputs
    return padded_outputs, final_hidden, final_memory, saved


def _backward_direction(saved, hidden, memory, input_weight, state_weight, projection_weight, steps, reverse,
                        settings, grad_outputs, grad_hidden, grad_memory, needs):  # fmt: skip
    """Gradients of one direction: of its input `(T, B, P_in)`, initial hidden and memory, and of `W_x`, `b`,
    `W_h`, `W_p` (None where `needs` says they are not needed)."""
    activations, cell_tanh = saved["activations"], saved["cell_tanh"]
    total, gate_dim = activations.shape
    cell_dim = gate_dim // 4
    num_steps, batch_size = len(steps.batch_sizes), hidden.shape[0]
    dtype, device = activations.dtype, activations.device

    def zeros_if_none(grad, like):
        return torch.zeros_like(like) if grad is None else grad.clone(memory_format=torch.contiguous_format)

    grad_hidden = zeros_if_none(grad_hidden, hidden)  # carried back through time, row-prefix by row-prefix
    grad_memory = zeros_if_none(grad_memory, memory)
    if grad_outputs is None:
        grad_outputs = torch.zeros(num_steps, batch_size, hidden.shape[1], dtype=dtype, device=device)

    # What each step's sequential gradients multiply by, for all steps at once (elementwise, so that the loop below
    # is two products and a few multiplications per step), written over the activations, which become the gate
    # gradients step by step: d(gates) = [g i(1-i), c_in f(1-f), i(1-g^2), tanh(c) o(1-o)] times d(cell) (the
    # first three) or d(cell output) (the last), and d(cell) = d(cell output) o (1 - tanh(c)^2) + d(next cell).
    entering = steps.entering_reverse if reverse else steps.entering_forward
    memory_in = torch.cat([saved["cells"], memory]).index_select(0, entering)
    input_gate, forget_gate, cell_input, output_gate = activations.chunk(4, dim=1)
    forget = forget_gate.clone()  # d(previous cell) = d(cell) f
    cell_factor = torch.mul(cell_tanh, cell_tanh).neg_().add_(1).mul_(output_gate)
    output_gate.mul_(torch.rsub(output_gate, 1)).mul_(cell_tanh)
    forget_gate.mul_(torch.rsub(forget_gate, 1)).mul_(memory_in)
    cell_derivative = torch.mul(cell_input, cell_input).neg_().add_(1).mul_(input_gate)
    input_gate.mul_(torch.rsub(input_gate, 1)).mul_(cell_input)
    cell_input.copy_(cell_derivative)
    del memory_in, cell_derivative
    # Where the clips passed values through, as 0/1 in the gradients' dtype (a boolean factor would be converted
    # at every step).
    if settings.cell_clip is not None:
        cell_passed = (saved["raw_cells"].abs() <= settings.cell_clip).to(dtype)
    if settings.proj_clip is not None:
        hidden_passed = (saved["raw_outputs"].abs() <= settings.proj_clip).to(dtype)
    grad_gates = activations  # = gradient of the gate inputs, once the loop has run
    grad_projected = torch.empty(total, hidden.shape[1], dtype=dtype, device=device)  # of each unclipped W_p m
    sizes = steps.batch_sizes
    grad_gate_steps = grad_gates.split(sizes)
    three_block_steps = grad_gates[:, : 3 * cell_dim].view(total, 3, cell_dim).split(sizes)
    last_block_steps = grad_gates[:, 3 * cell_dim :].split(sizes)
    grad_projected_steps, cell_factor_steps, forget_steps = (t.split(sizes) for t in (grad_projected, cell_factor, forget))
    if settings.cell_clip is not None:
        cell_passed_steps = cell_passed.split(sizes)
    if settings.proj_clip is not None:
        hidden_passed_steps = hidden_passed.split(sizes)
        # (d(h) + d(output)) p = d(output) p + d(h) p for p in {0, 1}: one operation a step instead of two.
        grad_output_steps = (steps.pack(grad_outputs) * hidden_passed).split(sizes)
    else:
        grad_output_steps = steps.pack(grad_outputs).split(sizes)
    projection_product = _step_product(grad_hidden, projection_weight.t())
    state_product = _step_product(activations[:batch_size], state_weight.t())
    grad_cell_outputs, grad_cells = torch.empty_like(grad_memory), torch.empty_like(grad_memory)  # one step's rows
    for t in range(num_steps) if reverse else range(num_steps - 1, -1, -1):
        n = sizes[t]
        if n == 0:
            continue
        if settings.proj_clip is not None:
            grad_h = torch.addcmul(grad_output_steps[t], grad_hidden[:n], hidden_passed_steps[t], out=grad_projected_steps[t])
        else:
            grad_h = torch.add(grad_hidden[:n], grad_output_steps[t], out=grad_projected_steps[t])
        grad_cell_output = projection_product(grad_h, projection_weight.t(), out=grad_cell_outputs[:n])  # (n, D)
        grad_cell = torch.addcmul(grad_memory[:n], grad_cell_output, cell_factor_steps[t], out=grad_cells[:n])
        if settings.cell_clip is not None:
            grad_cell.mul_(cell_passed_steps[t])
        torch.mul(grad_cell[:, None, :], three_block_steps[t], out=three_block_steps[t])
        last_block_steps[t].mul_(grad_cell_output)
        torch.mul(grad_cell, forget_steps[t], out=grad_memory[:n])
        carried = grad_hidden[:n]
        product = state_product(grad_gate_steps[t], state_weight.t(), out=carried)
        if product is not carried:
            carried.copy_(product)

    grad_input = grad_input_weight = grad_bias = grad_state_weight = grad_projection_weight = None
    if needs["input"]:
        grad_input = steps.unpack(matmul_nt(grad_gates, input_weight.t()), batch_size)
    if needs["input_weight"] or needs["state_weight"] or needs["bias"]:
        # All three from one pass over the gate gradients: d[W_x | W_h | b] = d(gates)^T [x | h_in | 1].
        input_dim, projection_dim = saved["packed_x"].shape[1], hidden.shape[1]
        operands = torch.empty(total, input_dim + projection_dim + 1, dtype=dtype, device=device)
        operands[:, :input_dim] = saved["packed_x"]
        operands[:, input_dim:-1] = torch.cat([saved["outputs"], hidden]).index_select(0, entering)
        operands[:, -1] = 1
        grads = matmul_tn(grad_gates, operands)
        grad_input_weight = grads[:, :input_dim].contiguous()
        grad_state_weight = grads[:, input_dim:-1].contiguous()
        grad_bias = grads[:, -1].contiguous()
    if needs["projection_weight"]:
        grad_projection_weight = matmul_tn(grad_projected, saved["cell_outputs"])
    return grad_input, grad_hidden, grad_memory, grad_input_weight, grad_bias, grad_state_weight, grad_projection_weight


_NEEDS = ("input", "hidden", "memory", "input_weight", "bias", "state_weight", "projection_weight")


class _LstmLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, reverse, steps, settings, concurrent, *tensors):
        calls = [
            partial(_forward_direction, *_direction(tensors, k), steps, backwards, settings, save=True)
            for k, backwards in enumerate(reverse)
        ]
        results = _run_all(calls, concurrent)
        ctx.reverse, ctx.steps, ctx.settings, ctx.concurrent = reverse, steps, settings, concurrent
        ctx.names = [list(result[3]) for result in results]
        to_save = []
        for k, result in enumerate(results):
            _, hidden, memory, input_weight, _, state_weight, projection_weight = _direction(tensors, k)
            to_save += [hidden, memory, input_weight, state_weight, projection_weight, *result[3].values()]
        ctx.save_for_backward(*to_save)
        return tuple(t for result in results for t in result[:3])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        saved_tensors = list(ctx.saved_tensors)
        calls = []
        for k, backwards in enumerate(ctx.reverse):
            names = ctx.names[k]
            weights_and_state, values = saved_tensors[:5], saved_tensors[5 : 5 + len(names)]
            del saved_tensors[: 5 + len(names)]
            flags = ctx.needs_input_grad[4 + _TENSORS_PER_DIRECTION * k : 4 + _TENSORS_PER_DIRECTION * (k + 1)]
            calls.append(
                partial(
                    _backward_direction, dict(zip(names, values)), *weights_and_state, ctx.steps, backwards,
                    ctx.settings, *grads[3 * k : 3 * k + 3], dict(zip(_NEEDS, flags)),
                )
            )  # fmt: skip
        results = _run_all(calls, ctx.concurrent)
        return (None, None, None, None, *[g for result in results for g in result])
