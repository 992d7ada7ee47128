"""Adagrad, bilm-tf's optimizer, with its step fused into one pass per parameter.

`torch.optim.Adagrad` updates a parameter in six passes over memory on a GPU (accumulate `g^2`, square root, add
epsilon, divide, scale, add), a noticeable share of a training step of the original ELMo (145 million parameters with
the softmax); on CPUs its single-tensor step also reads and writes each tensor several times. Blocks whose gradient is
all zero (most rows of a word softmax trained with a sampled softmax) are skipped: Adagrad leaves them unchanged anyway.
`Adagrad` here reads the parameter, its gradient and its accumulator once and writes the parameter and the accumulator
once, with the same operations in the same order as PyTorch's (`p + (-lr) * (g / (sqrt(s + g * g) + eps))`, correctly
rounded square root and division): a Triton kernel on CUDA tensors, a compiled loop on float32 CPU tensors
(`cpu_kernels.py`). Results differ from PyTorch's only where one contracts a multiply and an add into one rounding and
the other does not, a unit in the last place. Same arguments, same state (a checkpoint of either loads into the other);
everything the fused step does not cover (other dtypes on CPUs, sparse gradients, `lr_decay`, `weight_decay`,
`maximize`) runs PyTorch's own step.

Gradient clipping joins the same pass: `Adagrad.clip_grad_norm_` computes the global norm as
`torch.nn.utils.clip_grad_norm_` does and the next step multiplies each gradient by the clipping factor as it reads
it, with the same rounding, instead of clipping writing every gradient once more (`hf-elmo train` clips so).
"""

import torch

from ..cpu_kernels import adagrad_step as compiled_adagrad_step
from ..cpu_kernels import available as compiled_loops_available
from ..triton_support import INTERPRETED, tl, triton

_BLOCK = 4096

if triton is not None:

    @triton.jit
    def _adagrad_kernel(param_ptr, grad_ptr, sum_ptr, scale_ptr, n, lr, eps, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        valid = offsets < n
        # Times the clipping factor (else 1), rounded as clipping's own multiplication rounds it.
        grad = tl.load(grad_ptr + offsets, mask=valid, other=0.0).to(tl.float32) * tl.load(scale_ptr)
        # A zero gradient leaves both the accumulator and the parameter exactly as they are: a block of zeros (the
        # rows of the word softmax that a sampled-softmax step did not touch) needs nothing read or written.
        if tl.max(tl.abs(grad), axis=0) == 0.0:
            return
        total = tl.load(sum_ptr + offsets, mask=valid, other=1.0) + grad * grad
        tl.store(sum_ptr + offsets, total, mask=valid)
        param = tl.load(param_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        param = param + (-lr) * tl.div_rn(grad, tl.sqrt_rn(total) + eps)
        tl.store(param_ptr + offsets, param.to(param_ptr.dtype.element_ty), mask=valid)


def _triton_step(param, grad, total, lr, eps, scale):
    n = param.numel()
    _adagrad_kernel[(triton.cdiv(n, _BLOCK),)](param, grad, total, scale, n, lr, eps, BLOCK=_BLOCK)


class Adagrad(torch.optim.Adagrad):
    """`torch.optim.Adagrad` whose step is one pass per parameter, a Triton kernel on CUDA tensors and a compiled
    loop on float32 CPU tensors (see the module docstring); same arguments and state. `clip_grad_norm_` clips the
    gradients inside that pass instead of in one of its own. `triton_on_cpu`: the Triton kernel also on CPU tensors
    (under Triton's interpreter, `TRITON_INTERPRET=1`: for tests), instead of the compiled loop."""

    def __init__(self, *args, triton_on_cpu: bool = False, **kwargs):
        self.triton_on_cpu = triton_on_cpu
        self._uncounted_steps: dict[torch.Tensor, int] = {}
        self._clip: tuple[torch.Tensor, list] | None = None  # from `clip_grad_norm_`, for the next step
        self._ones: dict[torch.device, torch.Tensor] = {}
        super().__init__(*args, **kwargs)

    def _gradients(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (param, param.grad) for group in self.param_groups for param in group["params"] if param.grad is not None
        ]

    def clip_grad_norm_(self, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` of this optimizer's parameters (2-norm), deferred: returns the same total
        norm (a 0-d tensor) and the next `step` makes the same update, but multiplies the gradients by the clipping
        factor `min(max_norm / (norm + eps), 1)` in its own pass over them instead of in a pass of their own (for
        the original model, 145 million gradients read and written once less per step). Until then `.grad` holds
        the gradients unclipped; the next `step` must follow with the gradients unchanged (else it raises).

        `eps=1e-6` is PyTorch's; `eps=0` is TensorFlow's `clip_by_global_norm` (bilm-tf's), `min(max_norm / norm,
        1)`, which a clip at another scale (`hf-elmo train` clips the gradient of the mean loss, not of window x
        loss) reproduces exactly."""
        pairs = self._gradients()
        total = torch.nn.utils.get_total_norm([grad for _, grad in pairs], 2.0)
        # The factor as `torch.nn.utils.clip_grads_with_norm_` computes it, operation for operation (a zero norm
        # without eps: max_norm / 0 = inf, clamped to 1).
        factor = torch.clamp(float(max_norm) / (total + eps), max=1.0)
        self._clip = (factor, [(param, grad, grad._version) for param, grad in pairs])
        return total

    @property
    def clip_pending(self) -> bool:
        """Whether `clip_grad_norm_` ran since the last `step`, which will apply its factor."""
        return self._clip is not None

    def _take_clip_factor(self) -> torch.Tensor | None:
        """The pending clipping factor, after checking that the gradients are those it was computed for."""
        if self._clip is None:
            return None
        factor, clipped = self._clip
        self._clip = None
        now = {param: grad for param, grad in self._gradients()}
        if len(now) != len(clipped) or any(now.get(p) is not g or g._version != v for p, g, v in clipped):
            raise RuntimeError(
                "Adagrad.step: the gradients changed after clip_grad_norm_ (another backward pass, zeroed or "
                "replaced); call clip_grad_norm_ right before step."
            )
        return factor

    def _scale_for(self, param: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
        """The factor a fused step multiplies `param`'s gradient by: the clipping factor on its device for float32
        gradients; 1 where there is none, or where the gradient was clipped first in its own dtype."""
        device = param.device
        if device not in self._ones:
            self._ones[device] = torch.ones((), dtype=torch.float32, device=device)
        if factor is None:
            return self._ones[device]
        factor = factor.to(device)
        if param.grad.dtype == torch.float32:
            return factor
        param.grad.mul_(factor)  # as clipping rounds it: in the gradient's dtype
        return self._ones[device]

    def zero_grad(self, set_to_none: bool = True):
        self._clip = None
        super().zero_grad(set_to_none)

    def _fused_step(self, param: torch.Tensor):
        """The one-pass step for `param`'s device, or None where there is none: Triton's on CUDA tensors (and on CPU
        tensors under Triton's interpreter, where tests ask for it), the compiled loop on float32 CPU tensors."""
        if param.is_cuda and triton is not None and not INTERPRETED:
            return _triton_step
        if param.is_cpu and self.triton_on_cpu and triton is not None and INTERPRETED:
            return _triton_step
        if param.is_cpu and param.dtype == torch.float32 and compiled_loops_available(param):
            return compiled_adagrad_step
        return None

    def _can_fuse(self, group: dict) -> bool:
        if group["lr_decay"] or group["weight_decay"] or group["maximize"]:
            return False
        if group.get("differentiable") or group.get("foreach") is False:
            return False
        for param in group["params"]:
            if param.grad is None:
                continue
            state = self.state[param]
            if (
                self._fused_step(param) is None
                or param.grad.is_sparse
                or not (param.is_contiguous() and param.grad.is_contiguous() and state["sum"].is_contiguous())
                or state["sum"].dtype != torch.float32
            ):
                return False
        return True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        factor = self._take_clip_factor()
        if not all(self._can_fuse(group) for group in self.param_groups):
            if factor is not None:
                for _, grad in self._gradients():
                    grad.mul_(factor.to(grad.device))
            self._count_steps()
            super().step()  # the closure, if any, has run
            return loss
        for group in self.param_groups:
            lr, eps = float(group["lr"]), float(group["eps"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                # Counted here and added to the state's step tensors when the state is read: updating 40 scalar
                # tensors per step would cost the host more than the whole update costs the GPU.
                self._uncounted_steps[param] = self._uncounted_steps.get(param, 0) + 1
                scale = self._scale_for(param, factor)
                self._fused_step(param)(param, param.grad, state["sum"], lr, eps, scale)
                # Written through pointers: counted as the in-place changes they are (versions are what caches of
                # derived values look at, as autograd does).
                torch.autograd.graph.increment_version((param, state["sum"]))
        return loss

    def _count_steps(self):
        for param, count in self._uncounted_steps.items():
            self.state[param]["step"] += count
        self._uncounted_steps = {}

    def state_dict(self):
        self._count_steps()
        return super().state_dict()

    def load_state_dict(self, state_dict):
        self._uncounted_steps = {}
        super().load_state_dict(state_dict)
