"""One bidirectional LSTM layer of ELMo as a static-shape time loop: the path for GPUs.

Both directions of a layer step together: at step `s` the forward LSTM reads position `s` and the backward
LSTM position `T - 1 - s`, so a step is one batched product for the two directions' `W_h h`, one fused
elementwise kernel (gates, clipped cell, `o * tanh(c)`), one batched product for the projections and one
fused kernel for the clipped state and the outputs. Tensors are kept in this *step order*: direction 1's
time axis is reversed, which is also the order the next layer's backward LSTM reads, so nothing is flipped
between layers. Rows are never dropped from the batch: a row whose mask is 0 at a step keeps its state and
outputs 0, which makes every shape depend only on `(T, B)`. That lets a layer's whole forward and backward
time loops be captured once as CUDA graphs and replayed with one launch each (`CapturedLayers`), instead of
some 80 launches per layer and direction from Python.

The elementwise kernels are Triton kernels on CUDA (`gpu_lstm_kernels.py`) and PyTorch operations elsewhere
(the `_torch` functions below, same arithmetic): the CPU test suite runs both against the straightforward
reference. Matrix products follow PyTorch's settings: float32 products stay float32 unless the user allows
TF32 (`torch.backends.cuda.matmul.allow_tf32 = True`).
"""

import dataclasses
import math
import operator
from dataclasses import dataclass

import torch

from .cuda_graphs import CaptureCache, PendingBackward, capture_graph
from .triton_support import INTERPRETED, triton

if triton is not None:  # Triton ships with PyTorch's CUDA builds; the PyTorch steps need none.
    from .lstm_triton import cell_backward, cell_forward, gates_cell_forward, hidden_backward, hidden_forward

    _TRITON_STEPS = (cell_forward, hidden_forward, hidden_backward, cell_backward)
else:
    _TRITON_STEPS = gates_cell_forward = None


@dataclass(frozen=True)
class LayerSettings:
    """What a layer's computation depends on besides its tensors."""

    cell_clip: float | None
    proj_clip: float | None
    forget_bias: float
    dtype: torch.dtype
    """The dtype of the products (the autocast dtype under autocast); the cell state is kept in float32 (float64
    for float64)."""
    kernels: str
    """`"triton"` or `"torch"`: which implementation of the elementwise steps (`paths.lstm_kernels`)."""
    joint_product: bool | None = None
    """Whether each step multiplies its input together with its state (`joint_input_product`); None: by batch size."""
    fused_gates: bool | None = None
    """Whether each step's product and elementwise kernel are one Triton kernel (`gpu_lstm_kernels.gates_cell_forward`)
    where that applies (Triton kernels, 16-bit products); None: as a captured layer finds faster, else not."""


def _memory_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --- the elementwise steps in PyTorch operations (the Triton kernels compute the same) -------------------------


def _cell_forward_torch(
    gate_inputs, gates, memory_in, memory_out, mask, cell_output, activations, cell_tanh, cell_passed, cell_clip
):
    """One step's gates, `gate_inputs + gates` `(2, B, 4D)` (`W_x x + b` and `W_h h`, pre-activation, blocks
    `[input, forget, cell, output]`) and cell state `memory_in` `(2, B, D)` -> the new cell state into
    `memory_out` and `o * tanh(c)` into `cell_output` (0 where `mask` `(2, B)` is 0; the state is then kept).
    With `activations` `(2, B, 4D)`, also saves the activated gates, `tanh(c)` `(2, B, D)` and where the cell clip
    passed values (`cell_passed`, int8)."""
    compute = _memory_dtype(memory_in.dtype)
    i, f, g, o = (gate_inputs.to(compute) + gates.to(compute)).chunk(4, dim=-1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    previous = memory_in.to(compute)
    memory = f * previous + i * g
    if cell_clip is not None:
        passed = memory.abs() <= cell_clip
        memory = memory.clamp(-cell_clip, cell_clip)
    t = torch.tanh(memory)
    keep = mask.bool()[..., None]
    memory_out.copy_(torch.where(keep, memory, previous))
    cell_output.copy_(torch.where(keep, o * t, 0.0))
    if activations is not None:
        activations.copy_(torch.cat([i, f, g, o], dim=-1))
        cell_tanh.copy_(t)
        if cell_clip is not None:
            cell_passed.copy_(passed)


def _hidden_forward_torch(projected, hidden_in, hidden_out, output, mask, hidden_passed, proj_clip):
    """One step's projection `W_p (o * tanh c)` `(2, B, P)` -> the clipped state into `hidden_out` (where `mask`
    is 1, else `hidden_in`) and into `output` (0 where `mask` is 0); `hidden_passed` (int8): where the clip
    passed values."""
    hidden = projected
    if proj_clip is not None:
        if hidden_passed is not None:
            hidden_passed.copy_(hidden.abs() <= proj_clip)
        hidden = hidden.clamp(-proj_clip, proj_clip)
    keep = mask.bool()[..., None]
    hidden_out.copy_(torch.where(keep, hidden, hidden_in))
    output.copy_(torch.where(keep, hidden, 0.0))


def _hidden_backward_torch(grad_from_next, mask_next, grad_hidden, grad_output, hidden_passed, mask, grad_projected):
    """Gradient of a step's state: `grad_from_next` `(2, B, P)` (through the next step's gates, used where
    `mask_next` is 1) or the carried `grad_hidden` (updated in place), plus `grad_output` of the step's output;
    -> `grad_projected`, the gradient of the step's unclipped projection (0 where `mask` is 0)."""
    compute = _memory_dtype(grad_hidden.dtype)
    grad = torch.where(mask_next.bool()[..., None], grad_from_next.to(compute), grad_hidden.to(compute))
    grad_hidden.copy_(grad)
    grad = grad + grad_output.to(compute)
    if hidden_passed is not None:
        grad = grad * hidden_passed
    grad_projected.copy_(torch.where(mask.bool()[..., None], grad, 0.0))


def _cell_backward_torch(
    grad_cell_output, grad_memory, activations, cell_tanh, memory_in, cell_passed, mask, grad_gates
):
    """Gradient of `o * tanh(c)` `(2, B, D)` and the carried cell gradient `grad_memory` (updated in place) ->
    the gates' pre-activation gradient `grad_gates` `(2, B, 4D)` (0 where `mask` is 0)."""
    compute = _memory_dtype(grad_memory.dtype)
    i, f, g, o = activations.to(compute).chunk(4, dim=-1)
    t, previous, carried = cell_tanh.to(compute), memory_in.to(compute), grad_memory.to(compute)
    grad_cell_output = grad_cell_output.to(compute)
    grad_cell = carried + grad_cell_output * o * (1 - t * t)
    if cell_passed is not None:
        grad_cell = grad_cell * cell_passed
    grads = torch.cat(
        [
            grad_cell * g * i * (1 - i),
            grad_cell * previous * f * (1 - f),
            grad_cell * i * (1 - g * g),
            grad_cell_output * t * o * (1 - o),
        ],
        dim=-1,
    )
    ran = mask.bool()[..., None]
    grad_gates.copy_(torch.where(ran, grads, 0.0))
    grad_memory.copy_(torch.where(ran, grad_cell * f, carried))


_TORCH_STEPS = (_cell_forward_torch, _hidden_forward_torch, _hidden_backward_torch, _cell_backward_torch)


def _steps(kernels: str):
    return _TRITON_STEPS if kernels == "triton" else _TORCH_STEPS


# --- one layer, both directions: the time loops -----------------------------------------------------------------


def _stacked(forward_weight: torch.Tensor, backward_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The two directions' weights as one `(2, ...)` tensor in `dtype` (stacked and cast in one pass)."""
    stacked = forward_weight.new_empty(2, *forward_weight.shape, dtype=dtype)
    stacked[0], stacked[1] = forward_weight, backward_weight
    return stacked


def _k_splits(rows: int, cols: int, depth: int) -> int:
    """How many slices to cut the K axis of a `(2, rows, depth) @ (2, depth, cols)` product into: a step's product
    has few output tiles (e.g. 128 x 512 from K = 16,384), which alone would leave most of a GPU idle."""
    tiles = 2 * -(-rows // 128) * -(-cols // 128)
    splits = 1
    while tiles * splits < 264 and depth % (2 * splits) == 0 and depth // (2 * splits) >= 512:
        splits *= 2
    return splits


def _step_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.bmm(a, b)` for one step's `(2, M, K) @ (2, K, N)`, split along K into slices multiplied side by side
    and then summed when the output is too small to fill a GPU (`_k_splits`), as the backward product of a step of
    the original model (128 x 16,384 times 16,384 x 512) is."""
    _, rows, depth = a.shape
    cols = b.shape[-1]
    # Only float32 products: for 16-bit ones the library already picks kernels that fill the GPU.
    splits = _k_splits(rows, cols, depth) if a.is_cuda and a.dtype == torch.float32 else 1
    if splits == 1:
        return torch.bmm(a, b)
    chunk = depth // splits
    result = a.new_empty(2, rows, cols)
    for d in range(2):
        slices = torch.bmm(a[d].view(rows, splits, chunk).transpose(0, 1), b[d].view(splits, chunk, cols))
        torch.sum(slices, dim=0, out=result[d])
    return result


def joint_input_product(batch_size: int, input_dim: int) -> bool:
    """Whether a layer multiplies each step's input together with its state, `[x_s | h] @ [W_x | W_h]^T`, instead of
    all steps' inputs in one product beforehand. That product's result `(2, T, B, 4D)` is written once and read again
    by the steps, `2 B 4D` values per direction and step, where multiplying `x_s` at each step reads `W_x` again,
    `4D x input_dim` values: from `B >= input_dim` the joint product moves half as much memory or less (and the
    `(2, T, B, 4D)` buffer, 5 GiB for the original model at batch 4,096 in bfloat16, is never allocated)."""
    return batch_size >= input_dim


def _fuses_gates(settings: LayerSettings) -> bool:
    """Whether the step's product and elementwise kernel run as one kernel (float32 only under Triton's interpreter,
    where products are exact; a GPU's would be TF32)."""
    return bool(
        settings.fused_gates
        and settings.kernels == "triton"
        and triton is not None
        and (settings.dtype in (torch.bfloat16, torch.float16) or INTERPRETED)
    )


def _layer_forward(inputs, mask, hidden0, memory0, params, settings: LayerSettings, save: bool):
    """Runs one layer over step-ordered inputs.

    Args:
        inputs: `(2, T, B, P)` in step order (direction 1 reversed in time), in `settings.dtype`.
        mask: `(2, T + 1, B)` uint8 in step order, 1 where a row is real; the extra last step is all 0.
        hidden0: `(2, B, P)` and memory0 `(2, B, D)`: each row's state before its first step.
        params: per direction `(W_x, b, W_h, W_p)` pairs, as `ElmoLstmLayer` holds them: `W_x` `(4D, P)`, `b`
            `(4D,)`, `W_h` `(4D, P)`, `W_p` `(P, D)`, each a `(forward, backward)` tuple.
        save: keep what the backward pass needs.

    Returns:
        `(outputs (2, T, B, P), final hidden (2, B, P), final memory (2, B, D), saved)`; `saved` is a dict of the
        per-step tensors, or None.
    """
    cell_forward, hidden_forward, _, _ = _steps(settings.kernels)
    dtype = settings.dtype
    input_weight, bias, state_weight, projection_weight = (_stacked(*pair, dtype) for pair in params)
    _, num_steps, batch_size, input_dim = inputs.shape
    projection_dim = state_weight.shape[2]
    cell_dim = state_weight.shape[1] // 4
    if settings.forget_bias:  # TensorFlow's LSTMCell adds it at run time
        bias = bias.clone()
        bias[:, cell_dim : 2 * cell_dim] += settings.forget_bias
    joint = settings.joint_product
    if joint is None:
        joint = joint_input_product(batch_size, input_dim)
    if joint:
        # Step s multiplies slot s, `[x_s | h_(s-1)]`, and writes h_s into slot s + 1: the state slots are views.
        steps_in = inputs.new_empty(2, num_steps + 1, batch_size, input_dim + projection_dim)
        steps_in[:, :num_steps, :, :input_dim] = inputs
        hidden = steps_in[..., input_dim:]
        products_in = steps_in
        gate_weight = torch.cat([input_weight, state_weight], dim=2)  # (2, 4D, input_dim + P)
        # The bias joins in the elementwise step, read as a row repeated over steps and batch.
        gate_inputs = bias[:, None, None, :].expand(2, num_steps, batch_size, 4 * cell_dim)
    else:
        # The input products of all steps are one product per direction; only W_h h is sequential. A direction's
        # bias joins its product's epilogue (a bias broadcast over a batched product is copied out first).
        flat_inputs = inputs.reshape(2, num_steps * batch_size, input_dim)
        gate_inputs = inputs.new_empty(2, num_steps * batch_size, 4 * cell_dim)
        for d in range(2):
            torch.addmm(bias[d], flat_inputs[d], input_weight[d].t(), out=gate_inputs[d])
        gate_inputs = gate_inputs.view(2, num_steps, batch_size, 4 * cell_dim)
        # Step s reads slot s and writes slot s + 1: with `save`, every step's state stays for the backward pass.
        hidden = inputs.new_empty(2, num_steps + 1 if save else 2, batch_size, projection_dim)
        products_in, gate_weight = hidden, state_weight
    memory_dtype = _memory_dtype(dtype)
    outputs = inputs.new_empty(2, num_steps, batch_size, projection_dim)
    memory = inputs.new_empty(2, num_steps + 1 if save else 2, batch_size, cell_dim, dtype=memory_dtype)
    hidden[:, 0] = hidden0
    memory[:, 0] = memory0
    saved = None
    if save:
        saved = {
            "activations": inputs.new_empty(2, num_steps, batch_size, 4 * cell_dim),
            "cell_tanh": inputs.new_empty(2, num_steps, batch_size, cell_dim),
            "cell_output": inputs.new_empty(2, num_steps, batch_size, cell_dim),
            "cell_passed": None,
            "hidden_passed": None,
        }
        if settings.cell_clip is not None:
            saved["cell_passed"] = inputs.new_empty(2, num_steps, batch_size, cell_dim, dtype=torch.int8)
        if settings.proj_clip is not None:
            saved["hidden_passed"] = inputs.new_empty(2, num_steps, batch_size, projection_dim, dtype=torch.int8)
    else:
        cell_output = inputs.new_empty(2, batch_size, cell_dim)
    gate_weight_t, projection_weight_t = gate_weight.transpose(1, 2), projection_weight.transpose(1, 2)
    fused = _fuses_gates(settings)
    for s in range(num_steps):
        # Slots: every step's (T + 1) or two used in turn.
        now, after = s % memory.shape[1], (s + 1) % memory.shape[1]
        hidden_now, hidden_after = s % hidden.shape[1], (s + 1) % hidden.shape[1]
        step_in = products_in[:, s % products_in.shape[1]]
        if save:
            step_saved = [saved[k][:, s] if saved[k] is not None else None for k in ("activations", "cell_tanh")]
            step_saved.append(saved["cell_passed"][:, s] if saved["cell_passed"] is not None else None)
            cell_output = saved["cell_output"][:, s]
        else:
            step_saved = [None, None, None]
        if fused:
            gates_cell_forward(
                step_in,
                gate_weight,
                gate_inputs[:, s],
                memory[:, now],
                memory[:, after],
                mask[:, s],
                cell_output,
                *step_saved,
                settings.cell_clip,
            )
        else:
            # The gate inputs are added in the elementwise step: as the product's addend they would be copied first.
            gates = torch.bmm(step_in, gate_weight_t)
            cell_forward(
                gate_inputs[:, s],
                gates,
                memory[:, now],
                memory[:, after],
                mask[:, s],
                cell_output,
                *step_saved,
                settings.cell_clip,
            )
        projected = _step_bmm(cell_output, projection_weight_t)
        hidden_passed = saved["hidden_passed"][:, s] if save and saved["hidden_passed"] is not None else None
        hidden_forward(
            projected,
            hidden[:, hidden_now],
            hidden[:, hidden_after],
            outputs[:, s],
            mask[:, s],
            hidden_passed,
            settings.proj_clip,
        )
    if save:
        weights = (input_weight, state_weight, projection_weight)
        saved.update(hidden=hidden, memory=memory, inputs=inputs, weights=weights)
    return outputs, hidden[:, num_steps % hidden.shape[1]], memory[:, num_steps % memory.shape[1]], saved


def _layer_backward(grad_outputs, grad_hidden_final, grad_memory_final, mask, saved, settings: LayerSettings):
    """Gradients of `_layer_forward`: `(grad_inputs (2, T, B, P), grad_hidden0 (2, B, P), grad_memory0 (2, B, D),
    and per direction pair the gradients of W_x (2, 4D, P), b (2, 4D), W_h (2, 4D, P), W_p (2, P, D))`."""
    _, _, hidden_backward, cell_backward = _steps(settings.kernels)
    dtype = settings.dtype
    input_weight, state_weight, projection_weight = saved["weights"]
    _, num_steps, batch_size, projection_dim = grad_outputs.shape
    cell_dim = state_weight.shape[1] // 4
    memory_dtype = _memory_dtype(dtype)
    hidden, memory, activations, cell_tanh = saved["hidden"], saved["memory"], saved["activations"], saved["cell_tanh"]
    grad_outputs = grad_outputs.to(dtype)
    grad_hidden = grad_hidden_final.to(memory_dtype, copy=True)
    grad_memory = grad_memory_final.to(memory_dtype, copy=True)
    grad_gates = grad_outputs.new_empty(2, num_steps, batch_size, 4 * cell_dim)
    grad_projected = grad_outputs.new_empty(2, num_steps, batch_size, projection_dim)
    grad_from_next = grad_hidden.new_zeros(2, batch_size, projection_dim)  # read only where the next step ran
    for s in range(num_steps - 1, -1, -1):
        hidden_passed = saved["hidden_passed"][:, s] if saved["hidden_passed"] is not None else None
        hidden_backward(
            grad_from_next,
            mask[:, s + 1],
            grad_hidden,
            grad_outputs[:, s],
            hidden_passed,
            mask[:, s],
            grad_projected[:, s],
        )
        grad_cell_output = torch.bmm(grad_projected[:, s], projection_weight)
        cell_passed = saved["cell_passed"][:, s] if saved["cell_passed"] is not None else None
        cell_backward(
            grad_cell_output,
            grad_memory,
            activations[:, s],
            cell_tanh[:, s],
            memory[:, s],
            cell_passed,
            mask[:, s],
            grad_gates[:, s],
        )
        grad_from_next = _step_bmm(grad_gates[:, s], state_weight)
    grad_hidden0 = torch.where(mask[:, 0, :, None].bool(), grad_from_next.to(memory_dtype), grad_hidden)
    flat_gates = grad_gates.view(2, num_steps * batch_size, 4 * cell_dim)
    flat_gates_t = flat_gates.transpose(1, 2)
    inputs = saved["inputs"]
    grad_inputs = torch.bmm(flat_gates, input_weight).view(2, num_steps, batch_size, projection_dim)
    grad_input_weight = torch.bmm(flat_gates_t, inputs.reshape(2, num_steps * batch_size, projection_dim))
    grad_bias = flat_gates.sum(dim=1, dtype=memory_dtype)
    grad_state_weight = torch.bmm(flat_gates_t, hidden[:, :num_steps].reshape(2, num_steps * batch_size, -1))
    grad_projection_weight = torch.bmm(
        grad_projected.view(2, num_steps * batch_size, projection_dim).transpose(1, 2),
        saved["cell_output"].view(2, num_steps * batch_size, cell_dim),
    )
    return (
        grad_inputs,
        grad_hidden0,
        grad_memory,
        (grad_input_weight, grad_bias, grad_state_weight, grad_projection_weight),
    )


# --- running a layer: directly, or by replaying captured CUDA graphs -----------------------------------------


class _EagerLayer:
    """Runs the time loops operation by operation (any device)."""

    def __init__(self, settings: LayerSettings):
        self.settings = settings

    def forward(self, inputs, mask, hidden0, memory0, params, save):
        return _layer_forward(inputs, mask, hidden0, memory0, params, self.settings, save)

    def backward(self, grad_outputs, grad_hidden, grad_memory, mask, saved):
        return _layer_backward(grad_outputs, grad_hidden, grad_memory, mask, saved, self.settings)


def _fused_gates_faster(inputs, mask, hidden0, memory0, params, settings: LayerSettings, save: bool) -> bool:
    """Whether this layer's forward pass at these shapes runs faster on the GPU with each step's product and
    elementwise kernel fused (`gates_cell_forward`) than as a library product and a Triton kernel: the best of three
    timed passes each, alternating, after one of each to compile and warm up. False where fusing does not apply."""
    candidates = {fused: dataclasses.replace(settings, fused_gates=fused) for fused in (True, False)}
    if not _fuses_gates(candidates[True]):
        return False
    best = {True: math.inf, False: math.inf}
    for round_ in range(4):
        for fused, candidate in candidates.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _layer_forward(inputs, mask, hidden0, memory0, params, candidate, save)
            end.record()
            end.synchronize()
            if round_:
                best[fused] = min(best[fused], start.elapsed_time(end))
    return best[True] < best[False]


class _CapturedLayer:
    """The time loops of one layer at one `(T, B)`, captured once as CUDA graphs and replayed.

    The graphs read the parameters where they are (an optimizer updates them in place); inputs and incoming
    gradients are copied into the graphs' own buffers, outputs copied out of them. The tensors saved for the
    backward pass live in the graph's buffers, so a second forward pass before the first one's backward pass
    would overwrite them: `pending` tells when one is outstanding, and the caller then runs directly instead.
    """

    def __init__(self, inputs, mask, hidden0, memory0, params, settings: LayerSettings, save: bool):
        self.pending = PendingBackward()
        self.inputs, self.mask = inputs.clone(), mask.clone()
        self.hidden0, self.memory0 = hidden0.clone(), memory0.clone()
        if settings.fused_gates is None:
            fused = _fused_gates_faster(self.inputs, self.mask, self.hidden0, self.memory0, params, settings, save)
            settings = dataclasses.replace(settings, fused_gates=fused)
        self.settings, self.save = settings, save

        def warmup():
            outputs, hidden, memory, saved = self._forward(params)
            if save:
                _layer_backward(
                    torch.zeros_like(outputs),
                    torch.zeros_like(hidden),
                    torch.zeros_like(memory),
                    self.mask,
                    saved,
                    settings,
                )

        pool = torch.cuda.graph_pool_handle()
        self.forward_graph, forward = capture_graph(lambda: self._forward(params), pool, warmup)
        self.outputs, self.hidden, self.memory, self.saved = forward
        if save:
            self.grad_outputs = torch.zeros_like(self.outputs)
            self.grad_hidden, self.grad_memory = torch.zeros_like(self.hidden), torch.zeros_like(self.memory)
            self.backward_graph, self.grads = capture_graph(
                lambda: _layer_backward(
                    self.grad_outputs, self.grad_hidden, self.grad_memory, self.mask, self.saved, settings
                ),
                pool,
                warmup=lambda: None,
            )

    def _forward(self, params):
        return _layer_forward(self.inputs, self.mask, self.hidden0, self.memory0, params, self.settings, self.save)

    def forward(self, inputs, mask, hidden0, memory0, params, save):
        for static, given in (
            (self.inputs, inputs),
            (self.mask, mask),
            (self.hidden0, hidden0),
            (self.memory0, memory0),
        ):
            static.copy_(given)
        self.forward_graph.replay()
        return self.outputs.clone(), self.hidden.clone(), self.memory.clone(), self.saved

    def backward(self, grad_outputs, grad_hidden, grad_memory, mask, saved):
        for static, given in (
            (self.grad_outputs, grad_outputs),
            (self.grad_hidden, grad_hidden),
            (self.grad_memory, grad_memory),
        ):
            static.copy_(given)
        self.backward_graph.replay()
        # Handed out as they are: the caller copies them (into its dtypes) before the next replay can overwrite them.
        return self.grads


class CapturedLayers(CaptureCache):
    """Per layer of a model, CUDA graphs of the shapes it runs (see `CaptureCache`): training runs one shape;
    inference with shapes that keep changing runs mostly directly, which a GPU does fast enough."""

    def __init__(self, max_entries: int = 8):
        super().__init__(max_entries)

    def runner(self, layer: int, inputs, mask, hidden0, memory0, params, settings: LayerSettings, save: bool):
        flat = [p for pair in params for p in pair]
        key = (
            layer,
            tuple(inputs.shape),
            inputs.device,
            settings,
            save,
            tuple(p.data_ptr() for p in flat),
            tuple(p.dtype for p in flat),
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        )
        runner = self.get_or_capture(
            key, lambda: _CapturedLayer(inputs, mask, hidden0, memory0, params, settings, save)
        )
        if runner is None or (save and runner.pending.busy):
            return _EagerLayer(settings)
        return runner

    def __deepcopy__(self, memo):
        return CapturedLayers(self.max_entries)


class _BidirectionalLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner, settings, inputs, mask, hidden0, memory0, *weights):
        params = _pairs(weights)
        outputs, hidden, memory, saved = runner.forward(inputs, mask, hidden0, memory0, params, save=True)
        ctx.runner, ctx.settings, ctx.saved, ctx.mask = runner, settings, saved, mask
        ctx.dtypes = (inputs.dtype, hidden0.dtype, memory0.dtype, *(w.dtype for w in weights))
        ctx.save_for_backward(*weights)
        if isinstance(runner, _CapturedLayer):
            ctx.token = runner.pending.start()
        return outputs, hidden, memory

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_outputs, grad_hidden, grad_memory):
        weights = ctx.saved_tensors
        runner = ctx.runner
        autocast_off = torch.autocast(weights[0].device.type, enabled=False)
        if isinstance(runner, _CapturedLayer):
            runner.pending.finish(ctx.token)
        with autocast_off:
            grad_inputs, grad_hidden0, grad_memory0, weight_grads = runner.backward(
                grad_outputs, grad_hidden, grad_memory, ctx.mask, ctx.saved
            )
        ctx.saved = None
        per_weight = [g[direction] for g in weight_grads for direction in (0, 1)]
        grads = (grad_inputs, grad_hidden0, grad_memory0, *per_weight)
        # New tensors, also where the dtype stays: autograd may keep a returned gradient as a parameter's .grad, and
        # a captured layer's next replay overwrites its own.
        input_grads = [g.to(dtype, copy=True) for g, dtype in zip(grads, ctx.dtypes)]
        input_grads.insert(1, None)  # the mask
        return (None, None, *input_grads)


def _pairs(weights):
    """`(W_x f, W_x b, b f, b b, W_h f, W_h b, W_p f, W_p b)` -> four `(forward, backward)` pairs."""
    return tuple(zip(weights[0::2], weights[1::2]))


def bidirectional_layer(
    inputs: torch.Tensor,
    mask: torch.Tensor,
    hidden0: torch.Tensor,
    memory0: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    settings: LayerSettings,
    captured: CapturedLayers | None = None,
    layer_index: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both directions of one LSTM layer over step-ordered inputs, with autograd.

    Args:
        inputs: `(2, T, B, P)`: direction 0 in time order, direction 1 reversed in time (step order).
        mask: `(2, T + 1, B)` uint8, 1 at real positions, in step order; the last step all 0.
        hidden0, memory0: `(2, B, P)` and `(2, B, D)`, the states the rows start from.
        weights: `(W_x, W_x, b, b, W_h, W_h, W_p, W_p)` of the forward then backward direction (`ElmoLstmLayer`'s
            `input_linearity.weight`, `state_linearity.bias`, `state_linearity.weight`, `state_projection.weight`).
        settings: clips, forget bias, product dtype and elementwise implementation.
        captured: where CUDA graphs of this model's layers are kept (None: never capture); `layer_index` names
            the layer in it.

    Returns:
        outputs `(2, T, B, P)` in step order (0 at padding), final hidden `(2, B, P)` and memory `(2, B, D)`, in
        the dtypes of `inputs`, `hidden0` and `memory0`.
    """
    in_dtypes = (inputs.dtype, hidden0.dtype, memory0.dtype)
    dtype = settings.dtype
    with torch.autocast(inputs.device.type, enabled=False):  # the dtypes are chosen here, once
        inputs, hidden0 = inputs.to(dtype), hidden0.to(dtype)
        memory0 = memory0.to(_memory_dtype(dtype))
        save = torch.is_grad_enabled() and any(t.requires_grad for t in (inputs, hidden0, memory0, *weights))
        params = _pairs(weights)
        runner = _EagerLayer(settings)
        if captured is not None and inputs.is_cuda:
            with torch.no_grad():
                runner = captured.runner(layer_index, inputs, mask, hidden0, memory0, params, settings, save)
        if save:
            outputs, hidden, memory = _BidirectionalLayer.apply(
                runner, settings, inputs, mask, hidden0, memory0, *weights
            )
        else:
            outputs, hidden, memory, _ = runner.forward(inputs, mask, hidden0, memory0, params, save=False)
        return outputs.to(in_dtypes[0]), hidden.to(in_dtypes[1]), memory.to(in_dtypes[2])


def static_forward(bilstm, inputs, masks, states, paths):
    """`ElmoBiLstm.forward`'s computation on `paths.lstm = "static"`: both directions of a layer stepped together over
    the whole batch with masks. Arguments and results as `ElmoBiLstm.directions_forward`."""
    batch_size, num_steps, _ = inputs[0].shape
    device = inputs[0].device
    first = bilstm.forward_layers[0]
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    else:
        dtype = first.state_linearity.weight.dtype
    # Step order: direction 1 runs over reversed time, so step s of both directions is one batched step.
    stacked = torch.stack([inputs[0].transpose(0, 1), inputs[1].transpose(0, 1).flip(0)])  # (2, T, B', P)
    step_mask = torch.zeros(2, num_steps + 1, batch_size, dtype=torch.uint8, device=device)
    step_mask[0, :num_steps] = masks[0].t()
    step_mask[1, :num_steps] = masks[1].t().flip(0)
    settings = LayerSettings(
        first.cell_clip,
        first.proj_clip,
        first.forget_bias or 0.0,
        dtype,
        "triton" if paths.lstm_kernels.startswith("triton") else "torch",
        {"joint": True, "separate": False}.get(paths.joint_input_product),
        {"triton_fused": True, "triton_unfused": False}.get(paths.lstm_kernels),
    )
    captured = bilstm.captured if paths.cuda_graphs == "on" else None
    # Attributes, not `get_parameter`: a captured training step reads the parameters through views of them.
    weights_of = operator.attrgetter(
        "input_linearity.weight", "state_linearity.bias", "state_linearity.weight", "state_projection.weight"
    )
    outputs, finals = [], [([], []), ([], [])]
    for index, layers in enumerate(zip(bilstm.forward_layers, bilstm.backward_layers)):
        weights = tuple(weight for pair in zip(*map(weights_of, layers)) for weight in pair)
        # bilm-tf wraps every cell, residual included, in input dropout.
        layer_in = bilstm.dropout(stacked)
        hidden0 = torch.stack([states[0][0][index], states[1][0][index]])  # (2, B', P)
        memory0 = torch.stack([states[0][1][index], states[1][1][index]])
        layer_out, layer_hidden, layer_memory = bidirectional_layer(
            layer_in, step_mask, hidden0, memory0, weights, settings, captured, index
        )
        if bilstm.use_skip_connections and index > 0:
            layer_out = layer_out + layer_in
        stacked = layer_out
        outputs.append([layer_out[0].transpose(0, 1), layer_out[1].flip(0).transpose(0, 1)])
        for k in range(2):
            finals[k][0].append(layer_hidden[k])
            finals[k][1].append(layer_memory[k])
    return outputs, [(torch.stack(hidden), torch.stack(memory)) for hidden, memory in finals]
