"""The fused Adagrad against a float64 computation of Adagrad and against `torch.optim.Adagrad` (the kernel runs
interpreted on CPU tensors without a GPU, compiled on a GPU), and the same state."""

import pytest
import torch

from hf_elmo import adagrad, cpu_kernels
from hf_elmo.adagrad import Adagrad

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, params=["Triton kernel", "compiled CPU loop"])
def fused_calls(request, monkeypatch):
    """Which one-pass step runs: Triton's (interpreted on CPU tensors without a GPU) or the compiled CPU loop (CPU
    tensors only). Returns the list of parameters it was called for."""
    name = "_triton_step" if request.param == "Triton kernel" else "compiled_adagrad_step"
    if request.param == "Triton kernel":
        if adagrad.triton is None or (DEVICE == "cpu" and not adagrad._INTERPRETED):
            pytest.skip("needs Triton")
        monkeypatch.setattr(Adagrad, "_FUSE_ON_CPU", DEVICE == "cpu")
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
