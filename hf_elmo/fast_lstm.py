"""The time loop of one direction of ELMo's LSTM (projected, clipped state), forward and backward.

Rows come sorted by length, longest first, so the rows still running at a time step are a prefix of the
batch: each step multiplies only that prefix and no step computes anything that is masked away; the state
and the outputs are updated in place. Under autograd the loop runs inside one
`torch.autograd.Function` whose backward walks time once, computing only the gradients that must be
sequential (state and gates), and then forms the weight gradients of all steps with one matrix product
each instead of one small product per step.

Same arithmetic as the straightforward per-step formulation up to float rounding; the tests keep both
equal (values within 1e-5, gradients within 1e-4 relative).
"""

import torch

from .onednn_linear import matmul_nt, matmul_nt_add


def lstm_direction(
    gate_inputs: torch.Tensor,
    hidden: torch.Tensor,
    memory: torch.Tensor,
    state_weight: torch.Tensor,
    projection_weight: torch.Tensor,
    batch_sizes: list[int],
    reverse: bool,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs one direction over a length-sorted, time-major batch.

    Args:
        gate_inputs: `(T, B, 4D)`, `W_x x_t + b` for every step, gates in the order `[input, forget, cell, output]`.
        hidden: `(B, P)` and memory `(B, D)`: the state each row starts from.
        state_weight: `W_h` `(4D, P)`; projection_weight: `W_p` `(P, D)`.
        batch_sizes: `T` ints, the number of rows still running at each step (rows sorted longest first).
        reverse: walk from the last step down to 0 (a row then starts at its own last real step).
        cell_clip, proj_clip: clip values, `None` for none.

    Returns:
        outputs `(T, B, P)` (0 where a row is not running), final hidden `(B, P)` and memory `(B, D)`.
    """
    args = (gate_inputs, hidden, memory, state_weight, projection_weight)
    device_type = gate_inputs.device.type
    if torch.is_autocast_enabled(device_type):
        # Autocast does not reach products written into preallocated buffers: cast once, run in that dtype.
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            return lstm_direction(*(t.to(dtype) for t in args), batch_sizes, reverse, cell_clip, proj_clip)
    if torch.is_grad_enabled() and any(t.requires_grad for t in args):
        return _LstmDirection.apply(*args, batch_sizes, reverse, cell_clip, proj_clip)
    outputs, hidden, memory, _ = _run(*args, batch_sizes, reverse, cell_clip, proj_clip, save_for_backward=False)
    return outputs, hidden, memory


def _time_steps(num_steps: int, reverse: bool) -> range:
    return range(num_steps - 1, -1, -1) if reverse else range(num_steps)


def _run(
    gate_inputs,
    hidden,
    memory,
    state_weight,
    projection_weight,
    batch_sizes,
    reverse,
    cell_clip,
    proj_clip,
    save_for_backward,
):
    """`lstm_direction` without autograd; with `save_for_backward`, also the per-step tensors its backward needs."""
    num_steps, batch_size, gate_dim = gate_inputs.shape
    cell_dim = gate_dim // 4
    outputs = gate_inputs.new_zeros(num_steps, batch_size, projection_weight.shape[0])
    # The carried state, updated in place row-prefix by row-prefix (contiguous copies).
    hidden = hidden.clone(memory_format=torch.contiguous_format)
    memory = memory.clone(memory_format=torch.contiguous_format)
    saved = None
    if save_for_backward:
        # Per step: the state it started from, its gate activations, tanh of its clipped cell and where the
        # clips passed values through. Rows not running at a step stay zero and add nothing to the gradients.
        saved = {
            "hidden_in": gate_inputs.new_zeros(num_steps, batch_size, hidden.shape[1]),
            "memory_in": gate_inputs.new_zeros(num_steps, batch_size, cell_dim),
            "activations": gate_inputs.new_zeros(num_steps, batch_size, gate_dim),
            "cell_tanh": gate_inputs.new_zeros(num_steps, batch_size, cell_dim),
        }
        if cell_clip is not None:
            saved["cell_passed"] = torch.zeros(
                num_steps, batch_size, cell_dim, dtype=torch.bool, device=gate_inputs.device
            )
        if proj_clip is not None:
            saved["hidden_passed"] = torch.zeros(
                num_steps, batch_size, hidden.shape[1], dtype=torch.bool, device=gate_inputs.device
            )
    cell_output = torch.zeros_like(memory)
    # A product of one row runs as a matrix-vector kernel whose rounding can depend on the weights' memory
    # alignment; multiplying at least two rows (the extra one discarded) keeps results independent of it.
    min_rows = min(2, batch_size)
    # PyTorch's CPU tanh is about ten times slower than its sigmoid; tanh(x) = 2 sigmoid(2x) - 1 has an absolute
    # error of a few units in the last place in float32 and float64, too coarse in 16-bit types.
    tanh_by_sigmoid = gate_inputs.device.type == "cpu" and gate_inputs.dtype in (torch.float32, torch.float64)
    cell_block = slice(2 * cell_dim, 3 * cell_dim)
    for t in _time_steps(num_steps, reverse):
        n = batch_sizes[t]
        if n == 0:
            continue
        rows = max(n, min_rows)
        if saved is not None:
            saved["hidden_in"][t, :n] = hidden[:n]
            saved["memory_in"][t, :n] = memory[:n]
        gates = matmul_nt_add(hidden[:rows], state_weight, gate_inputs[t, :rows])[:n]
        activations = saved["activations"][t, :n] if saved is not None else torch.empty_like(gates)
        cell_tanh = saved["cell_tanh"][t, :n] if saved is not None else torch.empty_like(memory[:n])
        if tanh_by_sigmoid:  # one sigmoid over all four blocks, the cell block at twice its input
            gates[:, cell_block].mul_(2)
            torch.sigmoid(gates, out=activations)
            activations[:, cell_block].mul_(2).sub_(1)
        else:
            torch.sigmoid(gates, out=activations)
            torch.tanh(gates[:, cell_block], out=activations[:, cell_block])
        input_gate, forget_gate, cell_input, output_gate = activations.chunk(4, dim=1)
        cell = memory[:n]
        cell.mul_(forget_gate).addcmul_(input_gate, cell_input)
        if cell_clip is not None:
            if saved is not None:
                torch.le(cell.abs(), cell_clip, out=saved["cell_passed"][t, :n])
            cell.clamp_(-cell_clip, cell_clip)
        if tanh_by_sigmoid:
            torch.sigmoid(torch.mul(cell, 2, out=cell_tanh), out=cell_tanh).mul_(2).sub_(1)
        else:
            torch.tanh(cell, out=cell_tanh)
        torch.mul(output_gate, cell_tanh, out=cell_output[:n])
        new_hidden = matmul_nt(cell_output[:rows], projection_weight)[:n]
        if proj_clip is not None:
            if saved is not None:
                torch.le(new_hidden.abs(), proj_clip, out=saved["hidden_passed"][t, :n])
            new_hidden.clamp_(-proj_clip, proj_clip)
        outputs[t, :n] = new_hidden
        hidden[:n] = new_hidden
    return outputs, hidden, memory, saved


class _LstmDirection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_inputs, hidden, memory, state_weight, projection_weight, batch_sizes, reverse, *clips):
        args = (gate_inputs, hidden, memory, state_weight, projection_weight, batch_sizes, reverse, *clips)
        outputs, final_hidden, final_memory, saved = _run(*args, save_for_backward=True)
        ctx.names = list(saved)
        ctx.save_for_backward(state_weight, projection_weight, *saved.values())
        ctx.batch_sizes, ctx.reverse = batch_sizes, reverse
        return outputs, final_hidden, final_memory

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_outputs, grad_hidden, grad_memory):
        state_weight, projection_weight, *tensors = ctx.saved_tensors
        saved = dict(zip(ctx.names, tensors))
        activations, cell_tanh = saved["activations"], saved["cell_tanh"]
        cell_dim = cell_tanh.shape[-1]
        grad_hidden, grad_memory = grad_hidden.clone(), grad_memory.clone()  # carried back through time
        grad_gates = torch.zeros_like(activations)  # = gradient of gate_inputs
        grad_projected = torch.zeros_like(grad_outputs)  # gradient of each step's unclipped W_p m
        for t in _time_steps(grad_outputs.shape[0], not ctx.reverse):
            n = ctx.batch_sizes[t]
            if n == 0:
                continue
            grad_h = torch.add(grad_hidden[:n], grad_outputs[t, :n], out=grad_projected[t, :n])
            if "hidden_passed" in saved:
                grad_h.mul_(saved["hidden_passed"][t, :n])
            grad_cell_output = matmul_nt(grad_h, projection_weight.t())  # (n, D)
            input_gate, forget_gate, cell_input, output_gate = activations[t, :n].chunk(4, dim=1)
            grad_input, grad_forget, grad_cell_input, grad_output = grad_gates[t, :n].chunk(4, dim=1)
            tanh_c = cell_tanh[t, :n]
            grad_cell = grad_cell_output * output_gate
            grad_cell.mul_(1 - tanh_c * tanh_c).add_(grad_memory[:n])
            if "cell_passed" in saved:
                grad_cell.mul_(saved["cell_passed"][t, :n])
            # Each gate's gradient times the derivative of its non-linearity, written from the activations.
            torch.mul(grad_cell_output, tanh_c, out=grad_output).mul_(output_gate * (1 - output_gate))
            torch.mul(grad_cell, cell_input, out=grad_input).mul_(input_gate * (1 - input_gate))
            torch.mul(grad_cell, saved["memory_in"][t, :n], out=grad_forget).mul_(forget_gate * (1 - forget_gate))
            torch.mul(grad_cell, input_gate, out=grad_cell_input).mul_(1 - cell_input * cell_input)
            torch.mul(grad_cell, forget_gate, out=grad_memory[:n])
            grad_hidden[:n] = matmul_nt(grad_gates[t, :n], state_weight.t())
        grad_state_weight = grad_projection_weight = None
        if ctx.needs_input_grad[3]:
            grad_state_weight = matmul_nt(grad_gates.flatten(0, 1).t(), saved["hidden_in"].flatten(0, 1).t())
        if ctx.needs_input_grad[4]:
            cell_outputs = activations[..., 3 * cell_dim :] * cell_tanh
            grad_projection_weight = matmul_nt(grad_projected.flatten(0, 1).t(), cell_outputs.flatten(0, 1).t())
        return grad_gates, grad_hidden, grad_memory, grad_state_weight, grad_projection_weight, None, None, None, None
