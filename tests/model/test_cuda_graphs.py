"""How a replayed computation hands its gradients to autograd (`cuda_graphs._Replay`), on the CPU: the two graphs
are stood in for by functions that write the same buffers a replay writes. The replays themselves are tested on a
GPU (`test_lstm_static.py`)."""

import pytest
import torch

from hf_elmo.cuda_graphs import CapturedFunction, PendingBackward


class _Graph:
    def __init__(self, run):
        self.replay = run


def fake_capture(params: list[torch.Tensor], example: torch.Tensor) -> CapturedFunction:
    """`(x * w1).sum() + (x * w2 ** 2).sum()`, with the buffers of a capture and graphs that fill them."""
    captured = CapturedFunction.__new__(CapturedFunction)
    captured.params, captured.pending = params, PendingBackward()
    captured.inputs = (example.clone(),)
    captured.outputs = (torch.zeros(()),)
    captured.differentiable = [0]
    captured.grad_outputs = [torch.zeros(())]
    captured.grads = tuple(torch.zeros_like(p) for p in params)
    w1, w2 = params
    (x,) = captured.inputs

    def forward():
        captured.outputs[0].copy_((x * w1).sum() + (x * w2**2).sum())

    def backward():
        g = captured.grad_outputs[0]
        captured.grads[0].copy_(g * x)
        captured.grads[1].copy_(g * x * 2 * w2)

    captured.forward_graph, captured.backward_graph = _Graph(forward), _Graph(backward)
    return captured


def expected_grads(x, w2):
    return [x.clone(), x * 2 * w2]


@pytest.fixture
def setup():
    params = [torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)]
    return params, fake_capture(params, torch.zeros(5))


def test_grads_become_the_replays_buffers_without_a_copy(setup):
    params, captured = setup
    x = torch.randn(5)
    captured.replay(x)[0].backward()
    for param, static, expected in zip(params, captured.grads, expected_grads(x, params[1].detach())):
        assert torch.equal(param.grad, expected)
        assert param.grad.untyped_storage().data_ptr() == static.untyped_storage().data_ptr()


@pytest.mark.parametrize("between", ["nothing", "zero_grad in place", "zero_grad to None"])
def test_gradients_add_up_over_passes(setup, between):
    """A second pass adds to .grad even where .grad is the buffer the second replay overwrites."""
    params, captured = setup
    w2 = params[1].detach()
    first, second = torch.randn(5), torch.randn(5)
    captured.replay(first)[0].backward()
    if between == "zero_grad in place":
        for p in params:
            p.grad.zero_()
    elif between == "zero_grad to None":
        for p in params:
            p.grad = None
    captured.replay(second)[0].backward()
    for k, param in enumerate(params):
        total = expected_grads(second, w2)[k]
        if between == "nothing":
            total = total + expected_grads(first, w2)[k]
        assert torch.allclose(param.grad, total, rtol=1e-6, atol=1e-7), k


def test_autograd_grad_gets_copies_that_outlive_the_next_replay(setup):
    params, captured = setup
    w2 = params[1].detach()
    first, second = torch.randn(5), torch.randn(5)
    grads = torch.autograd.grad(captured.replay(first)[0], params)
    captured.replay(second)[0].backward()
    for got, expected in zip(grads, expected_grads(first, w2)):
        assert torch.equal(got, expected)
    assert all(p.grad is not None for p in params)


def test_backward_with_inputs_leaves_the_other_grads_alone(setup):
    params, captured = setup
    x = torch.randn(5)
    captured.replay(x)[0].backward(inputs=[params[0]])
    assert torch.equal(params[0].grad, x) and params[1].grad is None


@pytest.mark.parametrize("lstm", ["static", "sorted"])
def test_through_aliases_gives_the_step_and_the_gradients_of_the_parameters(lstm):
    """A captured step differentiates with respect to views of the parameters made inside it (`through_aliases`):
    the same outputs, the parameters' own gradients, and the module's parameters back in place after it."""
    from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
    from hf_elmo.cuda_graphs import through_aliases

    config = ElmoConfig.from_preset("tiny", vocab_size=30, num_softmax_samples=0, dropout=0.0)
    torch.manual_seed(0)
    config.paths = {"lstm": lstm, "lstm_kernels": "torch", "window_max": "torch", "highway": "torch"}
    model = ElmoForBiLM(config).double().train()
    encoded = ElmoTokenizer()(
        [["a", "few", "words"], ["and", "more", "of", "them"]],
        is_split_into_words=True,
        padding=True,
        return_tensors="pt",
    )
    mask = encoded["attention_mask"]
    labels = torch.randint(0, 30, (*mask.shape, 2), generator=torch.Generator().manual_seed(1))
    labels[~mask.bool()] = -100
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]

    def step():
        return model._training_step_sums(encoded["input_ids"], mask, labels)

    direct = step()
    direct_grads = torch.autograd.grad(direct[0].sum(), [p for _, p in named], allow_unused=True)
    assert sum(g is not None for g in direct_grads) > len(named) // 2
    outputs, aliases = through_aliases(model, named, step)
    alias_grads = torch.autograd.grad(outputs[0].sum(), aliases, allow_unused=True)
    assert [a.data_ptr() for a in aliases] == [p.data_ptr() for _, p in named]
    for a, b in zip(outputs, direct):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for (name, _), a, b in zip(named, alias_grads, direct_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert all(p is q for (_, p), q in zip(named, [p for _, p in model.named_parameters() if p.requires_grad]))
