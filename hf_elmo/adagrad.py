"""Adagrad, bilm-tf's optimizer, with its step fused into one pass per parameter.

`torch.optim.Adagrad` updates a parameter in six passes over memory on a GPU (accumulate `g^2`, square root,
add epsilon, divide, scale, add), which for the original ELMo (145 million parameters with the softmax) took
2.8 ms of a 22 ms training step on an H100; on CPUs its single-tensor step takes 2.2 ms for the mid-size model's
2.3 million parameters where one pass takes 1.3 (two Zen 3 cores). Blocks whose gradient is all zero (most rows of
a word softmax trained with a sampled softmax) are skipped: Adagrad leaves them unchanged anyway. `Adagrad` here
reads the parameter, its gradient and its accumulator once and writes the parameter and the accumulator once, with
the same operations in the same order as PyTorch's (`p + (-lr) * (g / (sqrt(s + g * g) + eps))`, correctly
rounded square root and division): a Triton kernel on CUDA tensors, a compiled loop on float32 CPU tensors
(`cpu_kernels.py`). Results differ from PyTorch's only where one contracts a multiply and an add into one rounding
and the other does not, a unit in the last place. Same arguments, same state (a checkpoint of either loads into the
other); everything the fused step does not cover (other dtypes on CPUs, sparse gradients, `lr_decay`,
`weight_decay`, `maximize`) runs PyTorch's own step.
"""

import os

import torch

from .cpu_kernels import adagrad_step as compiled_adagrad_step
from .cpu_kernels import available as compiled_loops_available

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

# Whether the kernel below was defined for Triton's interpreter (then it runs on CPU tensors, for the tests).
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCK = 4096

if triton is not None:

    @triton.jit
    def _adagrad_kernel(param_ptr, grad_ptr, sum_ptr, n, lr, eps, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        valid = offsets < n
        grad = tl.load(grad_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        # A zero gradient leaves both the accumulator and the parameter exactly as they are: a block of zeros (the
        # rows of the word softmax that a sampled-softmax step did not touch) needs nothing read or written.
        if tl.max(tl.abs(grad), axis=0) == 0.0:
            return
        total = tl.load(sum_ptr + offsets, mask=valid, other=1.0) + grad * grad
        tl.store(sum_ptr + offsets, total, mask=valid)
        param = tl.load(param_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        param = param + (-lr) * tl.div_rn(grad, tl.sqrt_rn(total) + eps)
        tl.store(param_ptr + offsets, param.to(param_ptr.dtype.element_ty), mask=valid)


def _triton_step(param, grad, total, lr, eps):
    n = param.numel()
    _adagrad_kernel[(triton.cdiv(n, _BLOCK),)](param, grad, total, n, lr, eps, BLOCK=_BLOCK)


class Adagrad(torch.optim.Adagrad):
    """`torch.optim.Adagrad` whose step is one pass per parameter, a Triton kernel on CUDA tensors and a compiled
    loop on float32 CPU tensors (see the module docstring); same arguments and state."""

    # Tests set this to run the kernel on CPU tensors under Triton's interpreter.
    _FUSE_ON_CPU = False

    def __init__(self, *args, **kwargs):
        self._uncounted_steps: dict[torch.Tensor, int] = {}
        super().__init__(*args, **kwargs)

    def _fused_step(self, param: torch.Tensor):
        """The one-pass step for `param`'s device, or None where there is none: Triton's on CUDA tensors (and on CPU
        tensors under Triton's interpreter, where tests ask for it), the compiled loop on float32 CPU tensors."""
        if param.is_cuda and triton is not None and not _INTERPRETED:
            return _triton_step
        if param.is_cpu and self._FUSE_ON_CPU and triton is not None and _INTERPRETED:
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
        if not all(self._can_fuse(group) for group in self.param_groups):
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
                self._fused_step(param)(param, param.grad, state["sum"], lr, eps)
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
