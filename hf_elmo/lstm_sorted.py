"""The time loops of ELMo's LSTM (projected, clipped state) on CPUs, forward and backward, one layer at a time.

Rows come sorted by length, longest first, so the rows still running at a time step are a prefix of the
batch. Every per-position tensor is kept *packed*: the running rows of step 0, then those of step 1, and so
on (`PackedSteps`), so each step's rows are one contiguous block, no padding is computed or stored, and the
state a step starts from is a prefix of the block the step before wrote. The backward direction reads each row
from its last real position back (`PackedSteps.pack(..., reverse=True)`), so at step `i` both directions run the
same rows: a layer's directions are stacked, `(K, N, ...)` with `K` directions. The input products of all steps
are one product before the loop; each step writes its results once, in place, into the whole-sequence buffers
that its backward reads (activations, cell, its tanh, the cell output). In float32 the time loop itself is one
compiled call each way (`cpu_kernels.py`: each direction on a thread of its own); otherwise (other dtypes, no
compiler) it is a dozen PyTorch operations per step for all directions, each step one batched product and one
elementwise operation. Under autograd a layer is one `torch.autograd.Function` whose backward walks time once for
the gradients that must be sequential (state and gates) and then forms each weight gradient of all steps with one
batched product. Layers with very large steps run one direction after the other instead, and at inference the
directions run on threads of their own (`cpu_threads.py`).

Same arithmetic as the straightforward per-step formulation up to float rounding; the tests keep both equal
(values within 1e-5, gradients within 1e-4 relative).
"""

from dataclasses import dataclass, replace
from functools import partial

import torch

from .char_cnn_fast import distinct_rows
from .cpu_kernels import backward_sequence as compiled_backward
from .cpu_kernels import forward_sequence as compiled_forward
from .cpu_threads import can_run_concurrently, run_concurrently
from .onednn_linear import matmul_nt


@dataclass(frozen=True)
class PackedSteps:
    """Where the running rows of each time step of a length-sorted, time-major `(T, B)` batch are.

    Position `k` of a packed `(N, ...)` tensor is row `k - offsets[t]` at step `t`, for
    `offsets[t] <= k < offsets[t] + batch_sizes[t]`. Step `t` of a row of length `L` is its position `t`, or
    `L - 1 - t` for a direction that reads rows backwards.
    """

    batch_sizes: list[int]
    """`T` ints: rows still running at each step (non-increasing)."""
    offsets: list[int]
    """`T` ints: where each step's block starts."""
    padded_index: torch.Tensor
    padded_index_reversed: torch.Tensor
    """`(N,)`: `position * B + row` of each packed step in the flattened `(T * B)` padded layout, read forwards
    or backwards."""
    final: torch.Tensor
    """`(R,)`: the packed position of the last step of each of the `R = batch_sizes[0]` rows that run at all."""
    entering: torch.Tensor
    """`(N - R,)`: the packed position of the step before each step after the first."""

    @classmethod
    def from_batch_sizes(cls, batch_sizes: list[int], batch_size: int, device: torch.device) -> "PackedSteps":
        num_steps = len(batch_sizes)
        sizes = torch.tensor(batch_sizes or [0], dtype=torch.long)  # a step of no rows stands in for no steps
        offsets = torch.cumsum(sizes, 0) - sizes
        total = int(sizes.sum())
        step = torch.repeat_interleave(torch.arange(num_steps), sizes)  # (N,)
        row = torch.arange(total) - offsets[step]
        lengths = (sizes[None, :] > torch.arange(batch_size)[:, None]).sum(dim=1)  # (B,)
        rows = torch.arange(batch_size)
        running = lengths > 0  # a prefix: rows of length 0 come last
        final = offsets[lengths[running] - 1] + rows[running]
        later = step > 0
        entering = offsets[step[later] - 1] + row[later]
        to_device = partial(torch.Tensor.to, device=device)
        return cls(
            list(batch_sizes),
            offsets.tolist(),
            to_device(step * batch_size + row),
            to_device((lengths[row] - 1 - step) * batch_size + row),
            to_device(final),
            to_device(entering),
        )

    @property
    def num_positions(self) -> int:
        return self.offsets[-1] + self.batch_sizes[-1] if self.batch_sizes else 0

    def pack(self, padded: torch.Tensor, reverse: bool = False) -> torch.Tensor:
        """`(T, B, ...)` -> `(N, ...)`."""
        index = self.padded_index_reversed if reverse else self.padded_index
        return padded.reshape(-1, *padded.shape[2:]).index_select(0, index)

    def unpack(self, packed: torch.Tensor, batch_size: int, reverse: bool = False) -> torch.Tensor:
        """`(N, ...)` -> `(T, B, ...)`, zeros where a row is not running."""
        padded = packed.new_zeros(len(self.batch_sizes) * batch_size, *packed.shape[1:])
        padded.index_copy_(0, self.padded_index_reversed if reverse else self.padded_index, packed)
        return padded.view(len(self.batch_sizes), batch_size, *packed.shape[1:])

    def final_state(self, packed: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
        """Each row's final state `(K, B, X)` from the packed states `(K, N, X)` and the initial ones `(K, B, X)`."""
        return torch.cat([packed.index_select(1, self.final), initial[:, len(self.final) :]], dim=1)

    def entering_state(self, packed: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
        """The state `(K, N, X)` each step starts from: step 0 from the initial states, later ones from the step
        before."""
        return torch.cat([initial[:, : len(self.final)], packed.index_select(1, self.entering)], dim=1)

    def split(self, stacked: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`(K, N, ...)` -> each step's `(K, n, ...)` view."""
        return stacked.split(self.batch_sizes, dim=1)


@dataclass(frozen=True)
class LstmSettings:
    cell_clip: float | None
    proj_clip: float | None
    forget_bias: float
    """Added to the forget gate's bias at run time (TensorFlow's `LSTMCell(forget_bias=...)`), 0 for none."""
    compiled: bool = False
    """Whether the time loops run compiled (`paths.lstm_kernels = "compiled"`, float32 CPU tensors)."""
    onednn: object = None
    """The products that go to oneDNN (`paths.onednn`, an `OnednnProducts`), None for none."""
    threads: str = "single"
    """`paths.threads`: whether the directions of an inference pass may run on threads of their own."""
    distinct_inputs: tuple | None = None
    """At inference, where every direction reads the same inputs `(T, B, P_in)` with rows repeated (the first
    layer's token embeddings: a word, a residue, padding): the distinct rows `(U, P_in)` and each position's among
    them `(T, B)`, so that the input products are formed once per distinct row."""


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


# Under autograd the directions run stacked, except where a step's products are large: there one direction after the
# other, each product over both intra-op threads (through oneDNN where it is faster), is faster than the stacked
# product, which gives each thread one direction's weights to stream from memory. Per row and step, the products take 5
# D P multiply-adds: the original size trains its encoder faster one direction at a time, the mid-size model faster
# stacked. (For the per-step PyTorch operations, two Python threads, one per direction, were slower in every case:
# each step is a dozen operations whose dispatch holds the GIL, and the threads wait for each other. The compiled loop
# runs stacked directions on threads of their own without Python.)
_MIN_STEP_MULTIPLY_ADDS_ONE_AT_A_TIME = 1 << 22


def _large_steps(cell_dim: int, projection_dim: int) -> bool:
    return 5 * cell_dim * projection_dim >= _MIN_STEP_MULTIPLY_ADDS_ONE_AT_A_TIME


_TENSORS_PER_DIRECTION = 7  # x, hidden, memory, W_x, b, W_h, W_p


def _run_layer(tensors, reverse, steps, settings):
    directions = range(len(reverse))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        _, hidden, memory = tensors[:3]
        groups = (
            tuple((k,) for k in directions) if _large_steps(memory.shape[1], hidden.shape[1]) else (tuple(directions),)
        )
        return _LstmLayer.apply(tuple(reverse), steps, settings, groups, *tensors)
    concurrent = len(reverse) > 1 and can_run_concurrently(tensors[0], settings.threads)
    groups = [(k,) for k in directions] if concurrent else [tuple(directions)]
    if concurrent and settings.onednn is not None:
        settings = replace(settings, onednn=settings.onednn.beside_other_threads())
    calls = [partial(_forward, *_stack(tensors, group, reverse), steps, settings, save=False) for group in groups]
    results = run_concurrently(*calls) if concurrent else [call() for call in calls]
    return [t for result in results for direction in result[0] for t in direction]


def _stack(tensors, group, reverse):
    """The inputs of the directions in `group`: lists of `x`, hidden, memory, `W_x`, `b`, `W_h`, `W_p` and
    `reverse`, one entry per direction."""
    per_direction = [tensors[_TENSORS_PER_DIRECTION * k : _TENSORS_PER_DIRECTION * (k + 1)] for k in group]
    return (*(list(column) for column in zip(*per_direction)), [reverse[k] for k in group])


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(tensors)` to read from: no copy of a single tensor (the original size's weights are 32 MiB)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


def _tanh_from_sigmoid_(sigmoid_of_double: torch.Tensor, minus_one: torch.Tensor) -> torch.Tensor:
    """`tanh(x) = 2 sigmoid(2x) - 1`, in place on `sigmoid(2x)`, in one operation (`minus_one`: a 0-d tensor)."""
    return torch.add(minus_one, sigmoid_of_double, alpha=2, out=sigmoid_of_double)


def _front(buffer: torch.Tensor, K: int, n: int) -> torch.Tensor:
    """A contiguous `(K, n, width)` view of the front of `buffer` `(K, B, width)` (one step's rows)."""
    width = buffer.shape[2]
    return buffer.view(-1)[: K * n * width].view(K, n, width)


def _batched_product(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, onednn=None):
    """`torch.bmm`; for one direction a plain product, which spreads over the intra-op threads (a batched product
    spreads only its batch over them), through oneDNN where `onednn` (`OnednnProducts`) takes it."""
    if x.shape[0] == 1:
        if out is None:
            return matmul_nt(x[0], weight[0].t(), onednn=onednn).unsqueeze(0)
        matmul_nt(x[0], weight[0].t(), out=out[0], onednn=onednn)
        return out
    return torch.bmm(x, weight, out=out)


def _weight_gradient(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`grad^T x` for `(K, N, O)` and `(K, N, I)` -> `(K, O, I)`: PyTorch's own product, which reads the transposed
    operand in place (oneDNN copies it first, slower for the original size's `W_h`). (MKL forms
    `(x^T grad)^T` faster, but in the transposed layout, which autograd then copies into the weights' layout: as slow
    in all.)"""
    if grad.shape[0] == 1:
        return torch.mm(grad[0].t(), x[0]).unsqueeze(0)
    return torch.bmm(grad.transpose(1, 2), x)


def _bmm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, add=False, scratch=None, onednn=None):
    """`out (+)= x @ weight` for `(K, n, I)` and `(K, I, O)` into `out` `(K, n, O)`, through `scratch` `(K, n, O)`
    where `out` is not contiguous (a batched product into a strided `out`, or in place, runs the directions one
    after the other; into a contiguous buffer, side by side on the intra-op threads).

    A product of one row runs as a matrix-vector kernel whose rounding can depend on the weights' memory
    alignment; multiplying the row twice keeps results independent of it."""
    if x.shape[1] == 1:
        product = _batched_product(x.expand(-1, 2, -1), weight, onednn=onednn)[:, :1]
    elif out.is_contiguous() and not add:
        return _batched_product(x, weight, out=out, onednn=onednn)
    else:
        product = _batched_product(x, weight, out=scratch, onednn=onednn)
    return out.add_(product) if add else out.copy_(product)


def _torch_forward_step(
    hidden_in,
    state_weight_t,
    gates_in,
    scratch,
    act,
    memory_in,
    raw_c,
    cell,
    tanh_c,
    cell_out,
    cell_clip,
    cell_block,
    fold_doubling,
    minus_one,
    onednn,
):
    """`cpu_kernels.forward_step` as PyTorch operations, after adding the state product into `gates_in`
    `(K, n, 4D)`; `minus_one` (a 0-d tensor) for tanh from sigmoid, with the cell block's doubling folded into the
    inputs or not; products through oneDNN where `onednn` takes them."""
    gates = _bmm(hidden_in, state_weight_t, gates_in, add=True, scratch=scratch, onednn=onednn)
    input_gate, forget_gate, cell_input, output_gate = act.chunk(4, dim=2)
    if minus_one is not None:  # one sigmoid over all four blocks, the cell block at twice its input
        if not fold_doubling:
            gates[..., cell_block].mul_(2)
        torch.sigmoid(gates, out=act)
        _tanh_from_sigmoid_(cell_input, minus_one)
    else:
        torch.tanh(gates[..., cell_block], out=cell_input)
        torch.sigmoid(gates[..., : cell_block.start], out=act[..., : cell_block.start])
        torch.sigmoid(gates[..., cell_block.stop :], out=output_gate)
    torch.mul(forget_gate, memory_in, out=raw_c).addcmul_(input_gate, cell_input)
    if cell_clip is not None:
        torch.clamp(raw_c, -cell_clip, cell_clip, out=cell)
    if minus_one is not None:
        _tanh_from_sigmoid_(torch.sigmoid(torch.mul(cell, 2, out=tanh_c), out=tanh_c), minus_one)
    else:
        torch.tanh(cell, out=tanh_c)
    torch.mul(output_gate, tanh_c, out=cell_out)


def _torch_forward_loop(
    steps,
    activations,
    hidden0,
    memory0,
    state_weight_t,
    projection_weight_t,
    raw_cells,
    cells,
    cell_tanh,
    cell_outputs,
    raw_outputs,
    outputs,
    save,
    cell_clip,
    proj_clip,
    fold_doubling,
    minus_one,
    onednn,
):
    """`cpu_kernels.forward_sequence` as PyTorch operations, a dozen per step (same arguments; the weights
    transposed, `(K, P, 4D)` and `(K, D, P)`; products through oneDNN where `onednn` takes them)."""
    K, batch_size, projection_dim = hidden0.shape
    cell_dim = cells.shape[2]
    cell_block = slice(2 * cell_dim, 3 * cell_dim)
    new = partial(activations.new_empty, K)
    gate_products, projected = new(batch_size, 4 * cell_dim), new(batch_size, projection_dim)  # one step's rows
    output_steps, act_steps = steps.split(outputs), steps.split(activations)
    if save:
        tanh_steps, cell_output_steps = steps.split(cell_tanh), steps.split(cell_outputs)
        cell_steps, raw_cell_steps, raw_output_steps = (
            steps.split(cells),
            steps.split(raw_cells),
            steps.split(raw_outputs),
        )
    else:
        scratch_gates = new(batch_size, 4 * cell_dim)
    for t in range(len(steps.batch_sizes)):
        n = steps.batch_sizes[t]
        if n == 0:
            continue
        hidden_in = hidden0[:, :n] if t == 0 else output_steps[t - 1][:, :n]
        if save:
            memory_in = memory0[:, :n] if t == 0 else cell_steps[t - 1][:, :n]
            act = act_steps[t]
            tanh_c, cell_out, raw_c, raw_h = tanh_steps[t], cell_output_steps[t], raw_cell_steps[t], raw_output_steps[t]
            cell = cell_steps[t]
        else:
            memory_in = raw_c = cell = cells[:, :n]  # updated in place
            act = scratch_gates[:, :n]
            tanh_c, cell_out, raw_h = cell_tanh[:, :n], cell_outputs[:, :n], output_steps[t]
        _torch_forward_step(
            hidden_in,
            state_weight_t,
            act_steps[t],
            _front(gate_products, K, n),
            act,
            memory_in,
            raw_c,
            cell,
            tanh_c,
            cell_out,
            cell_clip,
            cell_block,
            fold_doubling=fold_doubling,
            minus_one=minus_one,
            onednn=onednn,
        )
        new_hidden = _bmm(cell_out, projection_weight_t, raw_h, scratch=_front(projected, K, n), onednn=onednn)
        if proj_clip is not None:
            torch.clamp(new_hidden, -proj_clip, proj_clip, out=output_steps[t])


def _forward(
    xs, hiddens, memories, input_weights, biases, state_weights, projection_weights, reverse, steps, settings, save
):
    """The directions of one layer, stacked (`K` of them, each argument a list with one entry per direction).
    Returns per direction (outputs `(T, B, P)`, final hidden `(B, P)`, final memory `(B, D)`), and with `save`
    the stacked packed tensors the backward reads."""
    batch_size = xs[0].shape[1]
    K = len(xs)
    cell_dim = state_weights[0].shape[0] // 4
    projection_dim = projection_weights[0].shape[0]
    total = steps.num_positions
    cell_clip, proj_clip = settings.cell_clip, settings.proj_clip
    cell_block = slice(2 * cell_dim, 3 * cell_dim)
    compiled = settings.compiled
    # PyTorch's CPU tanh is several times slower than its sigmoid; tanh(x) = 2 sigmoid(2x) - 1 has an absolute
    # error of a few units in the last place in float32 and float64, too coarse in 16-bit types.
    tanh_by_sigmoid = not compiled and xs[0].device.type == "cpu" and xs[0].dtype in (torch.float32, torch.float64)
    # Stacked directions: the cell block's weights and bias doubled in the stacked copies, so that the products
    # give the doubled input that one sigmoid over all four blocks needs, with no step of its own (doubling is
    # exact: the same bits). One direction reads its weights in place and doubles each step's cell block instead:
    # copying a large layer's weights costs more than that step.
    fold_doubling = tanh_by_sigmoid and K > 1
    stack = torch.stack if fold_doubling else _stacked
    input_weight = stack(input_weights)
    # The compiled loop reads each direction's weights where they are (and keeps their packed panels).
    state_weight = None if compiled else stack(state_weights)
    bias = torch.stack(biases)
    # Added at run time, as TensorFlow's LSTMCell does: here once, into the input products.
    bias[:, cell_dim : 2 * cell_dim] += settings.forget_bias
    if fold_doubling:
        for tensor in (input_weight, bias, state_weight):
            tensor[:, cell_block] *= 2
    if tanh_by_sigmoid:
        minus_one = xs[0].new_full((), -1.0)
    hidden0, memory0 = _stacked(hiddens), _stacked(memories)  # (K, B, P), (K, B, D)
    # The input-to-gate products of all steps are one matrix product per direction; only W_h h is sequential.
    # Each step adds its W_h h into its block and activates it there (with `save`).
    activations = xs[0].new_empty(K, total, 4 * cell_dim)
    if settings.distinct_inputs is not None and not save:  # once per distinct input row, then gathered
        distinct, index = settings.distinct_inputs
        distinct = distinct.to(activations.dtype)  # autocast's dtype: equal rows stay equal
        table = torch.baddbmm(bias.unsqueeze(1), distinct.expand(K, *distinct.shape), input_weight.transpose(1, 2))
        for k, backwards in enumerate(reverse):
            torch.index_select(table[k], 0, steps.pack(index, backwards), out=activations[k])
    else:
        packed_x = torch.stack([steps.pack(x, backwards) for x, backwards in zip(xs, reverse)])  # (K, N, P_in)
        if K == 1:  # through oneDNN where that is faster, which writes a result of its own, then copied
            matmul_nt(packed_x[0], input_weight[0], bias[0], out=activations[0], onednn=settings.onednn)
        else:  # into the buffer, without a copy
            torch.baddbmm(bias.unsqueeze(1), packed_x, input_weight.transpose(1, 2), out=activations)
    new = partial(activations.new_empty, K)

    outputs = new(total, projection_dim)  # each step's new hidden state, after the clip
    if save:
        cell_tanh, cell_outputs = new(total, cell_dim), new(total, cell_dim)
        cells = new(total, cell_dim)  # each step's new memory, after the clip
        # Before the clips: where their values passed through is where gradients do.
        raw_cells = new(total, cell_dim) if cell_clip is not None else cells
        raw_outputs = new(total, projection_dim) if proj_clip is not None else outputs
    else:
        # Without a backward only the memory is kept, updated in place row-prefix by row-prefix: a row that stops
        # keeps its final memory. The rest of a step goes to buffers of one step's rows, which stay in cache.
        cells = raw_cells = memory_state = memory0.clone(memory_format=torch.contiguous_format)
        cell_tanh, cell_outputs = new(batch_size, cell_dim), new(batch_size, cell_dim)
        raw_outputs = outputs
    if compiled:
        compiled_forward(
            steps.batch_sizes,
            [w.contiguous() for w in state_weights],
            [w.contiguous() for w in projection_weights],
            cell_clip,
            proj_clip,
            save,
            activations,
            hidden0.contiguous(),
            memory0.contiguous(),
            raw_cells if save and cell_clip is not None else None,
            cells,
            cell_tanh,
            cell_outputs,
            raw_outputs if save and proj_clip is not None else None,
            outputs,
        )
    else:
        _torch_forward_loop(
            steps,
            activations,
            hidden0,
            memory0,
            state_weight.transpose(1, 2),
            _stacked(projection_weights).transpose(1, 2),
            raw_cells,
            cells,
            cell_tanh,
            cell_outputs,
            raw_outputs,
            outputs,
            save,
            cell_clip,
            proj_clip,
            fold_doubling,
            minus_one if tanh_by_sigmoid else None,
            settings.onednn,
        )

    final_hidden = steps.final_state(outputs, hidden0)
    if save:
        final_memory = steps.final_state(cells, memory0)
    else:
        final_memory = memory_state
    results = [
        (steps.unpack(outputs[k], batch_size, backwards), final_hidden[k], final_memory[k])
        for k, backwards in enumerate(reverse)
    ]
    if not save:
        return results, None
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
    return results, saved


def _gate_derivatives_(saved, memory0, steps, cell_clip):
    """What each step's sequential gradients multiply by, for all steps at once (elementwise, so that the backward
    loop is two products and a few multiplications per step), written over the saved activations, which become the
    gate gradients step by step: d(gates) = [g i(1-i), c_in f(1-f), i(1-g^2), tanh(c) o(1-o)] times d(cell) (the
    first three) or d(cell output) (the last), and d(cell) = d(cell output) o (1 - tanh(c)^2) + d(next cell).

    Returns per step: the gate blocks `(K, n, 4, D)`, `o (1 - tanh(c)^2)`, the forget gate (d(previous cell) =
    d(cell) f) and where the cell clip passed the cell through, as 0/1 (None without a clip), each `(K, n, D)`."""
    activations, cell_tanh = saved["activations"], saved["cell_tanh"]
    K, total, gate_dim = activations.shape
    memory_in = steps.entering_state(saved["cells"], memory0)
    input_gate, forget_gate, cell_input, output_gate = activations.chunk(4, dim=2)
    forget = forget_gate.clone()
    cell_factor = torch.mul(cell_tanh, cell_tanh).neg_().add_(1).mul_(output_gate)
    output_gate.mul_(torch.rsub(output_gate, 1)).mul_(cell_tanh)
    forget_gate.mul_(torch.rsub(forget_gate, 1)).mul_(memory_in)
    cell_derivative = torch.mul(cell_input, cell_input).neg_().add_(1).mul_(input_gate)
    input_gate.mul_(torch.rsub(input_gate, 1)).mul_(cell_input)
    cell_input.copy_(cell_derivative)
    if cell_clip is not None:
        passed = steps.split((saved["raw_cells"].abs() <= cell_clip).to(activations.dtype))
    else:
        passed = [None] * len(steps.batch_sizes)
    blocks = steps.split(activations.view(K, total, 4, gate_dim // 4))
    return blocks, steps.split(cell_factor), steps.split(forget), passed


def _torch_backward_step(grad_gates, grad_cell_output, grad_memory, grad_cell, blocks, cell_factor, forget, passed):
    """`cpu_kernels.backward_step` as PyTorch operations on one step's factors from `_gate_derivatives_`;
    `grad_cell` `(K, n, D)`: scratch."""
    torch.addcmul(grad_memory, grad_cell_output, cell_factor, out=grad_cell)
    if passed is not None:
        grad_cell.mul_(passed)
    three_blocks = blocks[:, :, :3]
    torch.mul(grad_cell[:, :, None, :], three_blocks, out=three_blocks)
    blocks[:, :, 3].mul_(grad_cell_output)
    torch.mul(grad_cell, forget, out=grad_memory)


def _torch_backward_loop(
    saved,
    memory0,
    state_weight,
    projection_weight,
    steps,
    settings,
    grad_outputs,
    grad_projected,
    grad_hidden,
    grad_memory,
):
    """`cpu_kernels.backward_sequence` as PyTorch operations, a few per step (same arguments)."""
    K, total, _ = saved["activations"].shape
    derivative_steps = _gate_derivatives_(saved, memory0, steps, settings.cell_clip)
    if settings.proj_clip is not None:
        # Where the clip passed values through, as 0/1 in the gradients' dtype (a boolean factor would be converted
        # at every step).
        hidden_passed = (saved["raw_outputs"].abs() <= settings.proj_clip).to(grad_outputs.dtype)
        hidden_passed_steps = steps.split(hidden_passed)
        # (d(h) + d(output)) p = d(output) p + d(h) p for p in {0, 1}: one operation a step instead of two.
        grad_outputs = grad_outputs * hidden_passed
    grad_output_steps = steps.split(grad_outputs)
    grad_gate_steps, grad_projected_steps = steps.split(saved["activations"]), steps.split(grad_projected)
    grad_cell_outputs, grad_cells = torch.empty_like(grad_memory), torch.empty_like(grad_memory)  # one step's rows
    grad_hidden_products = torch.empty_like(grad_hidden)
    for t in range(len(steps.batch_sizes) - 1, -1, -1):
        n = steps.batch_sizes[t]
        if n == 0:
            continue
        if settings.proj_clip is not None:
            grad_h = torch.addcmul(
                grad_output_steps[t], grad_hidden[:, :n], hidden_passed_steps[t], out=grad_projected_steps[t]
            )
        else:
            grad_h = torch.add(grad_hidden[:, :n], grad_output_steps[t], out=grad_projected_steps[t])
        grad_cell_output = _bmm(  # (K, n, D)
            grad_h, projection_weight, _front(grad_cell_outputs, K, n), onednn=settings.onednn
        )
        _torch_backward_step(
            grad_gate_steps[t],
            grad_cell_output,
            grad_memory[:, :n],
            grad_cells[:, :n],
            *(factor[t] for factor in derivative_steps),
        )
        _bmm(
            grad_gate_steps[t],
            state_weight,
            grad_hidden[:, :n],
            scratch=_front(grad_hidden_products, K, n),
            onednn=settings.onednn,
        )


def _backward(
    saved,
    hiddens,
    memories,
    input_weights,
    state_weights,
    projection_weights,
    reverse,
    steps,
    settings,
    grad_outputs,
    grad_hiddens,
    grad_memories,
):
    """Gradients of the stacked directions (lists with one entry per direction; a gradient may be None): per
    direction, of its input `(T, B, P_in)`, initial hidden and memory, and of `W_x`, `b`, `W_h`, `W_p`."""
    activations, cell_tanh = saved["activations"], saved["cell_tanh"]
    K, total, _ = activations.shape
    batch_size = hiddens[0].shape[0]
    hidden0, memory0 = _stacked(hiddens), _stacked(memories)

    def stacked(grads, like):
        return torch.stack([torch.zeros_like(like[0]) if g is None else g for g in grads])

    grad_hidden = stacked(grad_hiddens, hiddens)  # carried back through time, row-prefix by row-prefix
    grad_memory = stacked(grad_memories, memories)
    packed_grad_outputs = torch.stack(
        [
            hidden0.new_zeros(total, hidden0.shape[2]) if g is None else steps.pack(g, backwards)
            for g, backwards in zip(grad_outputs, reverse)
        ]
    )  # (K, N, P)

    dtype = activations.dtype
    grad_gates = activations  # = gradient of the gate inputs, once the loop has run
    grad_projected = torch.empty_like(packed_grad_outputs)  # of each unclipped W_p m
    state_weight, projection_weight = _stacked(state_weights), _stacked(projection_weights)
    if settings.compiled:
        compiled_backward(
            steps.batch_sizes,
            state_weight.contiguous(),
            projection_weight.contiguous(),
            settings.cell_clip,
            settings.proj_clip,
            activations,
            memory0.contiguous(),
            saved.get("raw_cells"),
            saved["cells"],
            cell_tanh,
            saved.get("raw_outputs"),
            packed_grad_outputs,
            grad_projected,
            grad_hidden,
            grad_memory,
        )
    else:
        _torch_backward_loop(
            saved,
            memory0,
            state_weight,
            projection_weight,
            steps,
            settings,
            packed_grad_outputs,
            grad_projected,
            grad_hidden,
            grad_memory,
        )

    grad_inputs = _batched_product(grad_gates, _stacked(input_weights), onednn=settings.onednn)  # (K, N, P_in)
    # Both from one product: d[W_x | W_h] = d(gates)^T [x | h_in]. The bias's gradient is a sum of its own: as a
    # column of ones in the product it made the product's width odd, which BLAS forms far slower.
    input_dim, projection_dim = saved["packed_x"].shape[2], hidden0.shape[2]
    operands = torch.empty(K, total, input_dim + projection_dim, dtype=dtype, device=activations.device)
    operands[..., :input_dim] = saved["packed_x"]
    operands[..., input_dim:] = steps.entering_state(saved["outputs"], hidden0)
    grads = _weight_gradient(grad_gates, operands)  # (K, 4D, P_in + P)
    grad_biases = grad_gates.sum(dim=1)  # (K, 4D)
    grad_projection_weight = _weight_gradient(grad_projected, saved["cell_outputs"])  # (K, P, D)
    return [
        (
            steps.unpack(grad_inputs[k], batch_size, backwards),
            grad_hidden[k],
            grad_memory[k],
            grads[k, :, :input_dim],
            grad_biases[k],
            grads[k, :, input_dim:],
            grad_projection_weight[k],
        )
        for k, backwards in enumerate(reverse)
    ]


class _LstmLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, reverse, steps, settings, groups, *tensors):
        results = [_forward(*_stack(tensors, group, reverse), steps, settings, save=True) for group in groups]
        ctx.reverse, ctx.steps, ctx.settings, ctx.groups = reverse, steps, settings, groups
        ctx.names = [list(saved) for _, saved in results]
        # Per direction its hidden, memory, W_x, W_h and W_p, then per group its saved tensors.
        to_save = [tensors[_TENSORS_PER_DIRECTION * k + i] for k in range(len(reverse)) for i in (1, 2, 3, 5, 6)]
        for _, saved in results:
            to_save += saved.values()
        ctx.save_for_backward(*to_save)
        return tuple(t for directions, _ in results for direction in directions for t in direction)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        saved_tensors = ctx.saved_tensors
        per_direction = [saved_tensors[5 * k : 5 * k + 5] for k in range(len(ctx.reverse))]
        position = 5 * len(ctx.reverse)
        results = []
        for group, names in zip(ctx.groups, ctx.names):
            values = saved_tensors[position : position + len(names)]
            position += len(names)
            columns = [list(column) for column in zip(*(per_direction[k] for k in group))]
            results.append(
                _backward(
                    dict(zip(names, values)),
                    *columns,
                    [ctx.reverse[k] for k in group],
                    ctx.steps,
                    ctx.settings,
                    *([grads[3 * k + i] for k in group] for i in range(3)),
                )
            )
        return (None, None, None, None, *[g for result in results for direction in result for g in direction])


def sorted_forward(bilstm, inputs, masks, states, paths):
    """`ElmoBiLstm.forward`'s computation on `paths.lstm = "sorted"`: the rows sorted by length, each step multiplying
    only the rows still running; directions whose rows run equally long steps are stacked into one call.
    Arguments and results as `ElmoBiLstm.directions_forward`; `paths` resolved."""
    sorts = [_sort_by_length(masks[0])]
    sorts.append(sorts[0] if masks[1] is masks[0] else _sort_by_length(masks[1]))
    time_major, hidden, memory = [], [], []
    for k, (order, _) in enumerate(sorts):
        x, h, c = inputs[k], *states[k]
        if order is not None:
            x, h, c = x[order], h[:, order], c[:, order]
        shared = k == 1 and inputs[1] is inputs[0] and sorts[1] is sorts[0]
        # Time-major, so that one step's rows are contiguous (and the input products fold into one matrix product).
        time_major.append(time_major[0] if shared else x.transpose(0, 1).contiguous())
        hidden.append(h)
        memory.append(c)
    batch_sizes = [sizes for _, sizes in sorts]
    steps = [PackedSteps.from_batch_sizes(sizes, len(mask), mask.device) for sizes, mask in zip(batch_sizes, masks)]
    # Both directions in one call where they can be stacked (on two threads, forward and backward, where there
    # are two); directions whose rows differ in length run one after the other.
    groups = [(0, 1)] if batch_sizes[0] == batch_sizes[1] else [(0,), (1,)]
    first = bilstm.forward_layers[0]
    compiled = paths.lstm_kernels == "compiled"
    settings = LstmSettings(
        first.cell_clip, first.proj_clip, first.forget_bias or 0.0, compiled, paths.onednn, paths.threads
    )
    outputs, finals = [], [([], []), ([], [])]
    inference = not torch.is_grad_enabled() or not any(
        t.requires_grad for t in (*inputs, *(p for p in bilstm.parameters()))
    )
    for index, layers in enumerate(zip(bilstm.forward_layers, bilstm.backward_layers)):
        # bilm-tf wraps every cell, residual included, in input dropout.
        layer_in = [bilstm.dropout(x) for x in time_major]
        layer_settings = settings
        if index == 0 and inference and groups == [(0, 1)] and layer_in[1] is layer_in[0]:
            layer_settings = replace(settings, distinct_inputs=_distinct_rows(layer_in[0]))
        results = {}
        for group in groups:
            group_results = lstm_layer(
                [layer_in[k] for k in group],
                [(hidden[k][index], memory[k][index]) for k in group],
                [_weights(layers[k]) for k in group],
                [k == 1 for k in group],
                steps[group[0]],
                layer_settings,
            )
            results.update(zip(group, group_results))
        time_major = [
            results[k][0] + layer_in[k] if bilstm.use_skip_connections and index > 0 else results[k][0]
            for k in range(2)
        ]
        outputs.append(time_major)
        for k in range(2):
            finals[k][0].append(results[k][1])
            finals[k][1].append(results[k][2])
    # Back to the callers' row order, batch-major.
    restores = [_inverse(order) for order, _ in sorts]
    outputs = [[_take(out.transpose(0, 1), restore, 0) for out, restore in zip(layer, restores)] for layer in outputs]
    finals = [tuple(_take(torch.stack(t), restore, 1) for t in final) for final, restore in zip(finals, restores)]
    return outputs, finals


# Fewer repeats than this share of the positions do not pay for finding them.
_MAX_DISTINCT_SHARE = 0.75

_BITS_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _distinct_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(T, B, F)` -> its distinct rows `(U, F)` (equal bits: NaN rows equal, -0.0 and 0.0 not) and each position's
    index among them `(T, B)`, or None where more than `_MAX_DISTINCT_SHARE` of the rows are distinct."""
    bits = _BITS_OF.get(x.element_size())
    if bits is None or not x.numel():
        return None
    distinct, index = distinct_rows(x.reshape(-1, x.shape[-1]).contiguous().view(bits))
    if len(distinct) > _MAX_DISTINCT_SHARE * len(index):
        return None
    return distinct.view(x.dtype), index.view(x.shape[:-1])


def _weights(layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An `ElmoLstmLayer`'s `(W_x (4D, P), b (4D,), W_h (4D, P), W_p (P, D))`."""
    return (
        layer.input_linearity.weight,
        layer.state_linearity.bias,
        layer.state_linearity.weight,
        layer.state_projection.weight,
    )


def _sort_by_length(mask: torch.BoolTensor) -> tuple[torch.LongTensor | None, list[int]]:
    """`(B, T)` right-padded mask -> the rows' order by length, longest first (`None` where they already are), and
    the `T` numbers of rows running at each step."""
    lengths, order = mask.sum(dim=1).sort(descending=True, stable=True)
    steps = torch.arange(mask.shape[1], device=mask.device)
    batch_sizes = (lengths[None, :] > steps[:, None]).sum(dim=1).tolist()
    if bool((order == torch.arange(len(order), device=order.device)).all()):
        order = None  # already sorted: skip the gathers
    return order, batch_sizes


def _take(tensor: torch.Tensor, index: torch.LongTensor | None, dim: int) -> torch.Tensor:
    return tensor if index is None else tensor.index_select(dim, index)


def _inverse(order: torch.LongTensor | None) -> torch.LongTensor | None:
    if order is None:
        return None
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return inverse
