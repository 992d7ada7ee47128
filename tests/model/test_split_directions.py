"""`split_directions=True`: the forward LSTM stack reads only the first half of the rows and the backward stack only
the second (continuous streams, where the two directions read different token sequences).

Each path (reference, CPU length-sorted, static shapes with PyTorch or interpreted Triton steps) against the float64
NumPy reference run sentence by sentence (`reference_elmo.py`): the half a row's direction reads holds what that
direction computes for the row; the other half is exactly 0, and keeps exactly the start state. Gradients and the
biLM loss against the same model run over every row without the split.
"""

import numpy as np
import pytest
import torch
from conftest import reference_from
from reference_elmo import bilm as reference_bilm
from test_fast_path import encode, one_thread  # noqa: F401
from test_fast_path import small_config as fast_path_config

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoModel, ElmoPaths, triton_support

TRITON_ON_CPU = triton_support.triton is not None and triton_support.INTERPRETED
PATHS = ["reference", "sorted", "static", *(["static, triton"] if TRITON_ON_CPU else [])]

FORWARD_ROWS = [["The", "cat", "sat", "."], ["Hi", "there"], ["x" * 60, "naïve", "日本語"]]
# The backward rows: each forward row's words reversed (rows as long as the forward ones: the sorted path stacks
# both directions), or rows of other lengths (it runs them one after the other).
BATCHES = {
    "halves of equal lengths": FORWARD_ROWS + [row[::-1] for row in FORWARD_ROWS],
    "halves of other lengths": FORWARD_ROWS + [["a", "b", "c", "d", "e"], ["cat"], ["😀", "the"]],
}


def configured(model, path):
    if path == "reference":
        model.config.paths = ElmoPaths.reference().to_dict()
    else:
        kernels = {"sorted": "auto", "static": "torch", "static, triton": "triton"}[path]
        model.config.paths = {"lstm": path.split(",")[0], "lstm_kernels": kernels, "cuda_graphs": "off"}
    return model


def run_split(model: ElmoModel, **inputs):
    """`model`'s layers with `split_directions`, through the biLM head over it (`ElmoForBiLM` holds the split)."""
    head = ElmoForBiLM(ElmoConfig(**{**model.config.to_dict(), "vocab_size": 2})).train(model.training)
    head.elmo = model
    return head(**inputs, split_directions=True)


def random_weights(model, scale):
    """Weights of magnitude `scale / sqrt(fan_in)` (large enough for both clips of `fast_path_config` to trigger)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(
                torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale / param.shape[-1] ** 0.5
            )
    return model


def random_state(model, batch_size, requires_grad=False):
    generator = torch.Generator().manual_seed(1)
    state = model.initial_state(batch_size)
    for t in state:
        t.uniform_(-0.3, 0.3, generator=generator)
    return tuple(t.requires_grad_(requires_grad) for t in state)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("path", PATHS)
def test_each_direction_reads_its_half_of_the_rows(path, batch):
    if path == "static, triton" and batch != "halves of other lengths":
        pytest.skip("interpreted Triton is slow: one batch suffices")
    config = fast_path_config()
    model = configured(random_weights(ElmoModel(config), scale=1.0).eval(), path)
    sentences = BATCHES[batch]
    inputs = encode(sentences)
    start = random_state(model, len(sentences))
    with torch.no_grad():
        out = run_split(model, **inputs, state=start, use_cache=True, output_hidden_states=True)
    P, D, half = config.projection_dim, config.cell_dim, len(sentences) // 2
    weights = model.state_dict()
    for row, words in enumerate(sentences):
        n = len(words) + 2
        row_start = tuple(t[:, row].numpy() for t in start)
        layers, (hidden, memory) = reference_bilm(weights, config, inputs["input_ids"][row, :n].numpy(), row_start)
        read, unread = (slice(0, P), slice(P, 2 * P)) if row < half else (slice(P, 2 * P), slice(0, P))
        for actual, expected in zip(out.hidden_states, layers):
            np.testing.assert_allclose(actual[row, :n, read].numpy(), expected[:, read], atol=1e-5)
            assert torch.all(actual[row, :, unread] == 0), "the half a row's direction does not read must be 0"
            assert torch.all(actual[row, n:] == 0), "padded positions must be 0"
        for final, expected, first, width in zip(out.state, (hidden, memory), start, (P, D)):
            read, unread = (
                (slice(0, width), slice(width, None)) if row < half else (slice(width, None), slice(0, width))
            )
            np.testing.assert_allclose(final[:, row, read].numpy(), expected[:, read], atol=1e-5)
            assert torch.equal(final[:, row, unread], first[:, row, unread]), "an unread half keeps its start state"


@pytest.mark.parametrize("path", [path for path in PATHS if path != "static, triton"])
def test_gradients_equal_those_of_every_row_run_without_the_split(path):
    """The split runs half of the rows per direction; a loss on the halves it computes has the gradients (weights and
    start state) of the same loss on a run over every row, whose other halves the loss does not read."""
    config = fast_path_config()
    model = configured(random_weights(ElmoModel(config).float(), scale=1.0).train(), path)
    reference = reference_from(model)
    sentences = BATCHES["halves of other lengths"]
    inputs = encode(sentences)
    start = random_state(model, len(sentences), requires_grad=True)
    reference_start = tuple(t.detach().clone().requires_grad_() for t in start)
    out = run_split(model, **inputs, state=start, use_cache=True, output_hidden_states=True)
    reference_layers, reference_state = reference(inputs["input_ids"], inputs["attention_mask"], reference_start)
    half = len(sentences) // 2
    generator = torch.Generator().manual_seed(2)

    def read_halves(t, rows_dim):
        """The forward half of the first rows and the backward half of the others."""
        width = t.shape[-1] // 2
        first, second = t.narrow(rows_dim, 0, half), t.narrow(rows_dim, half, half)
        return torch.cat([first[..., :width].flatten(), second[..., width:].flatten()])

    split_read = [read_halves(t, 0) for t in out.hidden_states] + [read_halves(t, 1) for t in out.state]
    reference_read = [read_halves(t, 0) for t in reference_layers] + [read_halves(t, 1) for t in reference_state]
    weights = [torch.randn(t.shape, generator=generator) for t in split_read]
    sum((w * t).sum() for w, t in zip(weights, split_read)).backward()
    sum((w * t).sum() for w, t in zip(weights, reference_read)).backward()
    pairs = [(name, p.grad, dict(reference.named_parameters())[name].grad) for name, p in model.named_parameters()]
    pairs += [(f"start state {k}", a.grad, b.grad) for k, (a, b) in enumerate(zip(start, reference_start))]
    for name, grad, reference_grad in pairs:
        scale = reference_grad.abs().max()
        assert scale > 0, name
        assert (grad - reference_grad).abs().max() <= 1e-4 * scale, name


def stream_labels(num_rows, num_positions, vocab_size):
    """Forward targets on the first half of the rows, backward targets on the second, -100 elsewhere."""
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, vocab_size, (num_rows, num_positions, 2), generator=generator)
    labels[: num_rows // 2, :, 1] = -100
    labels[num_rows // 2 :, :, 0] = -100
    return labels


@pytest.mark.parametrize("path", ["sorted", "static"])
def test_bilm_loss_and_gradients_equal_those_without_the_split(path):
    config = ElmoConfig(**{**fast_path_config().to_dict(), "vocab_size": 40, "num_softmax_samples": 0})
    model = ElmoForBiLM(config).train()
    random_weights(model, scale=1.0)
    configured(model.elmo, path)
    unsplit = ElmoForBiLM(config).train()
    unsplit.load_state_dict(model.state_dict())
    configured(unsplit.elmo, path)
    sentences = BATCHES["halves of other lengths"]
    inputs = encode(sentences)
    labels = stream_labels(*inputs["attention_mask"].shape, config.vocab_size)
    labels[~inputs["attention_mask"].bool()] = -100
    split_out = model(**inputs, labels=labels, split_directions=True)
    unsplit_out = unsplit(**inputs, labels=labels)
    for name in ("loss", "forward_loss", "backward_loss"):
        torch.testing.assert_close(getattr(split_out, name), getattr(unsplit_out, name), rtol=1e-6, atol=1e-6)
    split_out.loss.backward()
    unsplit_out.loss.backward()
    for (name, param), other in zip(model.named_parameters(), unsplit.parameters()):
        scale = other.grad.abs().max()
        assert scale > 0, name
        assert (param.grad - other.grad).abs().max() <= 1e-4 * scale, name


def test_split_errors():
    config = ElmoConfig(**{**fast_path_config().to_dict(), "vocab_size": 40})
    model = ElmoForBiLM(config)
    odd = encode(BATCHES["halves of equal lengths"][:5])
    with pytest.raises(ValueError, match="split_directions needs an even batch .* got 5 rows"):
        model(**odd, split_directions=True)
    inputs = encode(BATCHES["halves of equal lengths"])
    labels = stream_labels(*inputs["attention_mask"].shape, config.vocab_size)
    labels[0, 1, 1] = 7  # a backward target on a row only the forward LM reads
    with pytest.raises(ValueError, match=r"labels\[:B/2, :, 1\] and labels\[B/2:, :, 0\] must be -100"):
        model(**inputs, labels=labels, split_directions=True)


def test_the_captured_stream_step_computes_what_the_direct_step_does():
    """A stream step on a GPU is captured as CUDA graphs around `_training_step_sums` with the carried start state
    (`cuda_graphs.py`; the replay itself is tested on a GPU in `test_lstm_static.py`): that function gives the direct
    step's loss sums, final state and gradients, and its final state takes no gradient."""
    config = ElmoConfig(**{**fast_path_config().to_dict(), "vocab_size": 40, "num_softmax_samples": 0})
    model = ElmoForBiLM(config).train()
    random_weights(model, scale=1.0)
    configured(model.elmo, "static")
    sentences = BATCHES["halves of equal lengths"]
    inputs = encode(sentences)
    labels = stream_labels(*inputs["attention_mask"].shape, config.vocab_size)
    labels[~inputs["attention_mask"].bool()] = -100
    start = random_state(model.elmo, len(sentences))
    direct = model(**inputs, labels=labels, state=start, use_cache=True, split_directions=True)
    direct.loss.backward()
    direct_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    mask = model.elmo.check_inputs(inputs["input_ids"], inputs["attention_mask"], state=start)
    sums, counts, hidden, memory = model._training_step_sums(
        inputs["input_ids"], mask, labels, *start, split_directions=True
    )
    assert not hidden.requires_grad and not memory.requires_grad
    torch.testing.assert_close(sums.sum() / counts.sum(), direct.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close((hidden, memory), direct.state, rtol=0, atol=1e-6)
    (sums.sum() / counts.sum()).backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, direct_grads[name], rtol=1e-5, atol=1e-7, msg=name)
