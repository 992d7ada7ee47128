"""The fused Adagrad against a float64 computation of Adagrad and against `torch.optim.Adagrad` (the kernel runs
interpreted on CPU tensors without a GPU, compiled on a GPU), and the same state."""

from functools import partialmethod

import pytest
import torch

from hf_elmo import cpu_kernels
from hf_elmo.training import adagrad
from hf_elmo.training.adagrad import Adagrad

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, params=["Triton kernel", "compiled CPU loop"])
def fused_calls(request, monkeypatch):
    """Which one-pass step runs: Triton's (interpreted on CPU tensors without a GPU) or the compiled CPU loop (CPU
    tensors only). Returns the list of parameters it was called for."""
    name = "_triton_step" if request.param == "Triton kernel" else "compiled_adagrad_step"
    if request.param == "Triton kernel":
        if adagrad.triton is None or (DEVICE == "cpu" and not adagrad.INTERPRETED):
            pytest.skip("needs Triton")
        monkeypatch.setattr(Adagrad, "__init__", partialmethod(Adagrad.__init__, triton_on_cpu=DEVICE == "cpu"))
    elif DEVICE != "cpu":
        pytest.skip("the compiled loop runs on CPU tensors")
    elif not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("the compiled CPU loops do not build here")
    calls, step = [], getattr(adagrad, name)
    monkeypatch.setattr(adagrad, name, lambda param, *args: (calls.append(param), step(param, *args)))
    return calls


def parameters(seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(37, 5), (4097,), (3, 2, 7), (1,)]  # one larger than a block, odd sizes
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(DEVICE)) for shape in shapes]


def run(optimizer_class, steps=5, **kwargs):
    params = parameters()
    optimizer = optimizer_class(params, lr=0.2, initial_accumulator_value=0.3, **kwargs)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        for index, param in enumerate(params):
            # the last parameter gets no gradient every other step (skipped, as PyTorch skips it)
            param.grad = None if index == 3 and step % 2 else torch.randn(param.shape, generator=generator).to(DEVICE)
            if index == 1 and step == 2:
                param.grad[:4096] = 0  # a whole block of zeros (skipped by the kernel)
        if step == 3:
            optimizer.param_groups[0]["lr"] = 0.05  # a scheduler's change takes effect
        optimizer.step()
    return params, optimizer


def float64_adagrad(steps=5):
    """`run`'s updates in float64: `s += g^2; p -= lr g / (sqrt(s) + 1e-10)`."""
    params = [p.detach().double().cpu() for p in parameters()]
    sums = [torch.full_like(p, 0.3) for p in params]
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        lr = 0.05 if step >= 3 else 0.2
        for index, (param, total) in enumerate(zip(params, sums)):
            if index == 3 and step % 2:
                continue
            grad = torch.randn(param.shape, generator=generator).double()
            if index == 1 and step == 2:
                grad[:4096] = 0
            total += grad * grad
            param -= lr * grad / (total.sqrt() + 1e-10)
    return params, sums


def test_fused_step_is_adagrad_to_float32_rounding(fused_calls):
    fused_params, fused = run(Adagrad)
    assert len(fused_calls) == 18  # 5 steps of 4 parameters, the last one without a gradient at two of them
    torch_params, reference = run(torch.optim.Adagrad)
    exact_params, exact_sums = float64_adagrad()
    for a, b, exact, exact_sum in zip(fused_params, torch_params, exact_params, exact_sums):
        # as close to float64 as PyTorch's own step, and a few units in the last place from it
        fused_error = (a.detach().cpu().double() - exact).abs().max()
        assert fused_error <= 2 * max((b.detach().cpu().double() - exact).abs().max(), 1e-7)
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
        assert torch.allclose(fused.state[a]["sum"].cpu().double(), exact_sum, rtol=1e-6)
    for a, b in zip(fused.state_dict()["state"].values(), reference.state_dict()["state"].values()):
        assert torch.equal(a["step"], b["step"])


def test_fused_step_counts_its_writes_as_in_place_changes(fused_calls):
    """A step writes its parameters in place, as PyTorch's does: their versions grow (what caches of derived values,
    such as the CPU loop's packed panels of frozen weights, look at)."""
    params = parameters()
    optimizer = Adagrad(params, lr=0.2)
    for param in params:
        param.grad = torch.ones_like(param)
    before = [param._version for param in params]
    optimizer.step()
    assert fused_calls and all(param._version > version for param, version in zip(params, before))


def test_state_loads_into_either_optimizer():
    _, fused = run(Adagrad, steps=2)
    params, reference = run(torch.optim.Adagrad, steps=2)
    continued = torch.optim.Adagrad(params, lr=0.2)
    continued.load_state_dict(fused.state_dict())
    for param in params:
        assert torch.allclose(continued.state[param]["sum"], reference.state[param]["sum"], rtol=1e-6)


def test_options_the_fused_step_does_not_cover_run_pytorchs_step():
    for kwargs in ({"weight_decay": 0.01}, {"lr_decay": 0.1}, {"maximize": True}):
        fused_params, _ = run(Adagrad, **kwargs)
        torch_params, _ = run(torch.optim.Adagrad, **kwargs)
        for a, b in zip(fused_params, torch_params):
            assert torch.equal(a, b), kwargs


def test_closure_runs_once():
    params = parameters()
    optimizer = Adagrad(params, lr=0.1)
    calls = []

    def closure():
        calls.append(1)
        for param in params:
            param.grad = torch.ones_like(param)
        return torch.tensor(3.0)

    assert optimizer.step(closure).item() == 3.0
    assert len(calls) == 1


def clipped_run(clip, optimizer_class=Adagrad, steps=4, **kwargs):
    """`run` with the gradients clipped before each step by `clip(optimizer, params, max_norm)`: the norms are about
    10 to 60, so steps 0 and 2 clip (max norm 5) and steps 1 and 3 do not (max norm 1,000)."""
    params = parameters()
    optimizer = optimizer_class(params, lr=0.2, initial_accumulator_value=0.3, **kwargs)
    generator = torch.Generator().manual_seed(2)
    norms = []
    for step in range(steps):
        for index, param in enumerate(params):
            param.grad = None if index == 3 and step % 2 else torch.randn(param.shape, generator=generator).to(DEVICE)
            if index == 1 and step == 2:
                param.grad[:4096] = 0
        norms.append(clip(optimizer, params, 5.0 if step % 2 == 0 else 1000.0))
        optimizer.step()
    return params, optimizer, norms


def torch_clip(optimizer, params, max_norm):
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def deferred_clip(optimizer, params, max_norm):
    return optimizer.clip_grad_norm_(max_norm)


def assert_same_run(a, b, same_code: bool):
    """The same norms (one function computes them) and, where `same_code`, the same parameters and accumulators to
    the bit; else (the compiled or Triton step against PyTorch's, whose compilers may fuse multiply-adds
    differently) within the rounding of a few float32 operations per step: the accumulator adds positive squares, a
    step's update is a product, a square root and a quotient."""
    (params_a, optimizer_a, norms_a), (params_b, optimizer_b, norms_b) = a, b
    for norm_a, norm_b in zip(norms_a, norms_b, strict=True):
        assert torch.equal(norm_a, norm_b)
    close = torch.equal if same_code else lambda x, y: torch.allclose(x, y, rtol=1e-6, atol=1e-7)
    for param_a, param_b in zip(params_a, params_b):
        assert close(param_a, param_b)
        assert close(optimizer_a.state[param_a]["sum"], optimizer_b.state[param_b]["sum"])


def test_clipping_inside_the_step_equals_clipping_before_it(fused_calls):
    """Same norms, parameters and accumulators to the bit as `torch.nn.utils.clip_grad_norm_` before the same fused
    step, and to float32 rounding as before PyTorch's Adagrad."""
    deferred = clipped_run(deferred_clip)
    assert len(fused_calls) == 14  # every step fused: 4 steps of 4 parameters, 2 without a gradient
    assert norms_clip_and_do_not_clip(deferred[2])
    assert_same_run(deferred, clipped_run(torch_clip), same_code=True)
    assert_same_run(deferred, clipped_run(torch_clip, torch.optim.Adagrad), same_code=False)


def norms_clip_and_do_not_clip(norms):
    return all(norms[k] > 5.0 for k in (0, 2)) and all(norms[k] < 1000.0 for k in (1, 3))


def test_clipping_with_pytorchs_step_equals_clipping_before_it():
    """Where the fused step does not apply (here: weight decay), PyTorch's step on the gradients clipped first."""
    deferred = clipped_run(deferred_clip, weight_decay=0.01)
    assert norms_clip_and_do_not_clip(deferred[2])
    assert_same_run(deferred, clipped_run(torch_clip, torch.optim.Adagrad, weight_decay=0.01), same_code=True)


def test_clipping_must_be_right_before_the_step(fused_calls):
    params = parameters()
    optimizer = Adagrad(params, lr=0.2)
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.clip_grad_norm_(1.0)
    params[0].grad.add_(1.0)  # e.g. another backward pass accumulating into it
    with pytest.raises(RuntimeError, match="the gradients changed after clip_grad_norm_"):
        optimizer.step()
    # zero_grad drops a pending clip: the next step uses its gradients as they are
    optimizer.clip_grad_norm_(1.0)
    optimizer.zero_grad()
    before = [p.detach().clone() for p in params]
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.step()
    unclipped = torch.optim.Adagrad([torch.nn.Parameter(p) for p in before], lr=0.2)
    for param in unclipped.param_groups[0]["params"]:
        param.grad = torch.ones_like(param)
    unclipped.step()
    for a, b in zip(params, unclipped.param_groups[0]["params"]):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
