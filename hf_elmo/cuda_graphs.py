"""Replaying a function and its gradient as CUDA graphs, so that the host issues two launches instead of hundreds.

`CapturedFunction` captures `fn(*inputs) -> tuple of tensors` once on the GPU, and the gradients of its outputs
with respect to a module's trainable parameters once more, each as a CUDA graph; `replay` runs them under autograd
like the function itself. What a replay needs from the caller: tensors of the captured shapes, dtypes and devices;
parameters still at the addresses they had (an optimizer's in-place update keeps them there); and no other
forward pass through the same captured function before the backward pass of the last one (its saved tensors live
in the graph's memory): `pending.busy` says when one is outstanding, so that the caller runs the function directly
instead. Random numbers (dropout, sampling) are drawn anew at each replay. A parameter's `.grad` after a replayed
backward pass is the replay's own buffer, as with `torch.cuda.make_graphed_callables`: it holds until the next
replayed backward pass, which adds to it where it is still set; a copy of it outlives that.
"""

import functools
import weakref
from collections.abc import Callable

import torch


def capture_graph(fn: Callable, pool, warmup: Callable | None = None):
    """Runs `warmup()` (default: `fn()`) once on a side stream (compiles kernels and creates library handles
    outside the capture), then captures `fn()` as a CUDA graph in memory `pool`: `(graph, fn's result)`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # The warm-up draws no random numbers of the caller's: a run that captures at another step (a resumed one)
    # draws the same sequence as one that does not.
    random_state = torch.cuda.get_rng_state()
    with torch.cuda.stream(side):
        (warmup or fn)()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.set_rng_state(random_state)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        result = fn()
    return graph, result


class PendingBackward:
    """The forward replay of a captured computation whose backward replay has not run yet: its saved tensors live in
    the graph's memory, which another forward replay would overwrite. `start` marks a forward replay and returns
    its token (kept by the autograd context: a pass that is dropped unfinished frees its token and the mark);
    `finish(token)` checks that no other forward replay came since."""

    def __init__(self):
        self._token = None  # weak reference

    @property
    def busy(self) -> bool:
        return self._token is not None and self._token() is not None

    def start(self) -> "_Token":
        token = _Token()
        self._token = weakref.ref(token)
        return token

    def finish(self, token: "_Token") -> None:
        if self._token is None or self._token() is not token:
            raise RuntimeError(
                "This captured computation ran forward again since the pass being differentiated; its saved tensors "
                'are gone. Run backward once per forward pass, or turn CUDA graphs off (paths.cuda_graphs="off").'
            )
        self._token = None


class _Token:
    """Marks a forward replay until its backward replay has run."""


class CapturedFunction:
    """`fn(*inputs)` and the gradient of its outputs with respect to the trainable parameters of `module`, as two
    CUDA graphs.

    `fn` must read the parameters through `module`, return a tuple of tensors, not wait for the GPU (no `.item()`,
    no shapes that depend on values) and read no tensors other than `inputs` and the parameters that could change
    between calls.
    """

    def __init__(self, fn: Callable, inputs: tuple[torch.Tensor, ...], module: torch.nn.Module):
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.inputs = tuple(t.detach().clone() for t in inputs)
        self.pending = PendingBackward()
        pool = torch.cuda.graph_pool_handle()

        def forward():
            return through_aliases(module, named, lambda: fn(*self.inputs))

        def warmup():
            outputs, aliases = forward()
            differentiable = [o for o in outputs if o.requires_grad]
            torch.autograd.grad(
                differentiable, aliases, [torch.ones_like(o) for o in differentiable], allow_unused=True
            )

        self.forward_graph, (self.outputs, aliases) = capture_graph(forward, pool, warmup)
        self.differentiable = [k for k, o in enumerate(self.outputs) if o.requires_grad]
        self.grad_outputs = [torch.zeros_like(self.outputs[k]) for k in self.differentiable]

        def gradients():
            return torch.autograd.grad(
                [self.outputs[k] for k in self.differentiable], aliases, self.grad_outputs, allow_unused=True
            )

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            self.grads = gradients()
        self.backward_graph = graph

    def replay(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`fn(*inputs)`, differentiable with respect to the parameters."""
        return _Replay.apply(self, len(inputs), *inputs, *self.params)


def through_aliases(module: torch.nn.Module, named: list[tuple[str, torch.Tensor]], fn: Callable):
    """`fn()` with each of `named`'s parameters of `module` replaced by a view of itself made here: `(fn's result,
    the views)`. A captured backward pass then ends at views made on the capturing stream: ending at the
    parameters themselves, autograd would make the stream where their gradient accumulators were made (the default
    stream, by any earlier step whose graph is still alive) wait for the capture, which CUDA refuses."""
    aliases = [p.view_as(p) for _, p in named]
    with torch.nn.utils.stateless._reparametrize_module(module, {name: a for (name, _), a in zip(named, aliases)}):
        return fn(), aliases


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, captured: CapturedFunction, num_inputs: int, *tensors):
        for static, given in zip(captured.inputs, tensors[:num_inputs]):
            static.copy_(given)
        captured.forward_graph.replay()
        ctx.captured, ctx.num_inputs = captured, num_inputs
        ctx.token = captured.pending.start()
        outputs = tuple(o.clone() for o in captured.outputs)
        for k, output in enumerate(outputs):
            if k not in captured.differentiable:
                ctx.mark_non_differentiable(output)
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outputs):
        captured = ctx.captured
        captured.pending.finish(ctx.token)
        # A parameter's .grad may be a buffer of the last replay (see `_handed_out`): where gradients add up over
        # several passes (or were zeroed in place), it keeps its values before this replay overwrites them.
        for param, static in zip(captured.params, captured.grads):
            if static is not None and param.grad is not None and _same_memory(param.grad, static):
                param.grad = param.grad.clone()
        for static, k in zip(captured.grad_outputs, captured.differentiable):
            if grad_outputs[k] is None:
                static.zero_()
            else:
                static.copy_(grad_outputs[k])
        captured.backward_graph.replay()
        return (None, None, *([None] * ctx.num_inputs), *_handed_out(captured))


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _handed_out(captured: CapturedFunction) -> tuple[torch.Tensor | None, ...]:
    """The replay's gradients as the backward pass returns them: the replay's own buffers (as new tensors, which
    autograd takes as the parameters' .grad without a copy, or adds to theirs) where they go into .grad, copies
    where the caller receives them (`torch.autograd.grad`), who may keep them past the next replay. One copy of
    every gradient less per step: 1.2 GB of memory traffic for the original model."""
    grads = []
    for param, static in zip(captured.params, captured.grads):
        if static is None:
            grads.append(None)
        else:
            grads.append(static.detach() if _goes_into_grad(param) else static.clone())
    return tuple(grads)


def _goes_into_grad(param: torch.Tensor) -> bool:
    """Whether this backward pass accumulates into `param.grad` (PyTorch's own test, as `register_multi_grad_hook`
    uses it; where it is missing, assume not)."""
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if will_execute is None:
        return False
    try:
        return bool(will_execute(torch.autograd.graph.get_gradient_edge(param).node))
    except (RuntimeError, AttributeError, TypeError):
        return False


class CaptureCache:
    """Captured computations by key: a key is captured the second time it is asked for (one-off shapes run
    directly), up to `max_entries`; further keys run directly. Copies and pickles of a model get an empty cache
    (graphs belong to the tensors they were captured with)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self.entries: dict = {}
        self.seen: dict = {}

    def get_or_capture(self, key, capture: Callable):
        """The entry for `key`, captured now by `capture()` if it is due; None where the caller runs directly (also
        while an enclosing computation is being captured, which cannot replay a graph)."""
        if torch.cuda.is_current_stream_capturing():
            return None
        entry = self.entries.get(key)
        if entry is not None:
            return entry
        if len(self.seen) > 10_000:  # keys that never recur (inference over varied batches)
            self.seen.clear()
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] < 2 or len(self.entries) >= self.max_entries:
            return None
        entry = self.entries[key] = capture()
        return entry

    def clear(self):
        self.entries.clear()
        self.seen.clear()

    def __getstate__(self):
        return {"max_entries": self.max_entries}

    def __setstate__(self, state):
        self.__init__(state["max_entries"])

    def __deepcopy__(self, memo):
        return CaptureCache(self.max_entries)


def replay_training_step(model, input_ids, mask, labels, state, *, split_directions: bool, paths):
    """`ElmoForBiLM._training_step_sums` of a training batch whose resolved `paths.training_step` is "captured",
    replayed from CUDA graphs: a step of a GPU-sized batch is otherwise a few thousand operations that the host
    issues more slowly than the GPU runs them. A batch shape seen for the first time, one beyond the cache's
    entries, or a step while the last replay's backward pass is outstanding runs the same function directly."""
    state = tuple(state) if state is not None else ()
    elmo = model.elmo
    autocast = torch.is_autocast_enabled("cuda")
    key = (
        tuple(input_ids.shape),
        input_ids.dtype,
        labels.dtype,
        input_ids.device,
        autocast,
        torch.get_autocast_dtype("cuda"),
        tuple(p.data_ptr() for p in model.parameters() if p.requires_grad),
        model.dropout.p,
        elmo.encoder.dropout.p,
        torch.backends.cuda.matmul.allow_tf32,
        paths,
        elmo.warm_hidden.data_ptr() if elmo.config.warm_state else None,  # the start state a graph reads
        tuple((tuple(t.shape), t.dtype) for t in state),
        split_directions,
    )
    step = functools.partial(model._training_step_sums, split_directions=split_directions)

    def capture():
        # The autocast cache would hand the graph casts of the weights made before it, never updated.
        with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=autocast, cache_enabled=False):
            return CapturedFunction(step, (input_ids, mask, labels, *state), model)

    captured = model._captured_steps.get_or_capture(key, capture)
    if captured is None or captured.pending.busy:
        return step(input_ids, mask, labels, *state)
    return captured.replay(input_ids, mask, labels, *state)
