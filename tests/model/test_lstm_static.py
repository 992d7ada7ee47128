"""The GPU path of `ElmoModel`: both directions of a layer stepped together over the whole batch with masks
(`gpu_lstm.py`), its Triton kernels (`gpu_lstm_kernels.py`, interpreted on CPU tensors), CUDA graph replay, the
character CNN over every token, the sampled softmax drawn on the device and a loss without data-dependent
shapes. Checked against the straightforward reference path (`ElmoPaths.reference()`), against the original
implementations' outputs, and against float64.

On a machine with a CUDA GPU the same tests also run on it; the CUDA graph tests run only there.
"""

import random

import numpy as np
import pytest
import torch
from conftest import FIXTURE_SETS, fixture_batches, reference_from
from test_fast_path import SENTENCES, assert_same_outputs, encode, one_thread, random_model, run_fast, small_config  # noqa: F401
from transformers import AutoModel

from hf_elmo import lstm_static, triton_support
from hf_elmo.sampled_softmax import (
    _draws_for_unique_sample,
    expected_count,
    first_distinct,
    sample_log_uniform_candidates,
    sample_log_uniform_candidates_on_device,
)

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")

# Triton's kernels run on CPU tensors only when defined for its interpreter (the suite does so without a GPU).
TRITON_ON_CPU = triton_support.triton is not None and triton_support.INTERPRETED
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (device, elementwise steps): on CPUs both implementations, on a GPU its default (Triton); "triton fused": each
# step's product in the Triton kernel too (`gates_cell_forward`; on a GPU for 16-bit products only).
PATHS = [
    ("cpu", "torch"),
    *([("cpu", "triton"), ("cpu", "triton fused")] if TRITON_ON_CPU else []),
    *([("cuda", None)] if "cuda" in DEVICES else []),
]
# Batches below and at `small_config`'s projection width (6): the layers multiply each step's state alone, after one
# product of all steps' inputs, or each step's input and state together (`lstm_static.joint_input_product`).
BATCHES = {"state product": SENTENCES, "joint product": SENTENCES + [["one", "more", "row"]]}


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the steps that ran as one fused Triton kernel (`gates_cell_forward`)."""
    calls = []
    fused = lstm_static.gates_cell_forward
    if fused is not None:
        monkeypatch.setattr(lstm_static, "gates_cell_forward", lambda *args: (calls.append(1), fused(*args)))
    return calls


@pytest.fixture(params=list(BATCHES))
def sentences(request):
    rows = BATCHES[request.param]
    assert lstm_static.joint_input_product(len(rows), small_config().projection_dim) == (
        request.param == "joint product"
    )
    return rows


def static(model, kernels=None, device="cpu", graphs=False):
    """`model` on `device`, running the static-shape path (and the per-token character CNN)."""
    model = model.to(device)
    lstm_kernels = {"torch": "torch", "triton": "triton_unfused", "triton fused": "triton_fused"}.get(kernels, "auto")
    model.config.paths = {"char_cnn": "every_word", "lstm": "static", "lstm_kernels": lstm_kernels}
    set_graphs(model, graphs)
    return model


def set_graphs(model, graphs: bool):
    """CUDA graphs on or off for `model` (and its biLM's steps), its other paths unchanged."""
    model.config.paths = {**model.config.paths, "cuda_graphs": "on" if graphs else "off"}


def on(device, batch):
    return {k: v.to(device) for k, v in batch.items()}


def cpu(tensors):
    layers, state = tensors
    return [t.cpu() for t in layers], tuple(t.cpu() for t in state)


@pytest.mark.parametrize("device, kernels", PATHS)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"use_skip_connections": False, "num_layers": 2},
        {"cell_clip": None, "proj_clip": None},
        {"forget_bias": 1.0, "activation": "tanh"},
    ],
)
def test_values_match_reference_with_state_and_padding(overrides, kernels, device, sentences, fused_calls):
    interpreted = device == "cpu" and kernels in ("triton", "triton fused")
    if interpreted and (overrides not in ({}, {"cell_clip": None, "proj_clip": None}) or sentences is not SENTENCES):
        # Interpreted Triton is slow: every configuration family, on sentences of at most 3 words (the same rows,
        # so the same choice of input product).
        sentences = [words[:3] for words in sentences]
    config = small_config(**overrides)
    model = random_model(config)
    reference = reference_from(model)
    model = static(model, kernels, device)
    first, second = encode(sentences), encode(sentences[::-1])
    with torch.no_grad():
        fast = cpu(run_fast(model, on(device, first)))
        slow = reference(first["input_ids"], first["attention_mask"])
        assert_same_outputs(fast, slow, atol=1e-5)
        for layer in fast[0]:
            assert torch.all(layer[~first["attention_mask"].bool()] == 0), "padded positions must be exactly 0"
        carried = tuple(t.to(device) for t in fast[1])
        again = cpu(run_fast(model, on(device, second), carried))
        assert_same_outputs(again, reference(second["input_ids"], None, slow[1]), atol=1e-5)
    assert bool(fused_calls) == (kernels == "triton fused")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FIXTURE_SETS)
def test_fixture_models_reproduce_the_original_outputs(name, device, converted_dirs):
    """The original implementations' outputs, 10 batches with the state carried, at their test tolerance."""
    # On CPUs with the PyTorch steps: interpreting the Triton kernels for 10 batches takes minutes.
    model = static(AutoModel.from_pretrained(converted_dirs[name]).eval(), "torch" if device == "cpu" else None, device)
    state = None
    with torch.no_grad():
        for words, expected in fixture_batches(name):
            batch = on(device, encode(words))
            out = model(**batch, state=state, use_cache=True)
            state = out.state
            for row, rows_expected in enumerate(expected):
                actual = out.last_hidden_state[row, 1 : len(words[row]) + 1].cpu().numpy()
                np.testing.assert_allclose(actual, rows_expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device, kernels", PATHS)
def test_gradients_match_reference(kernels, device, sentences, fused_calls):
    """Every parameter's and the initial state's gradient, through clipping, padding and unsorted lengths."""
    model = random_model(small_config(forget_bias=1.0))
    reference = reference_from(model)
    model = static(model, kernels, device)
    batch = encode(sentences)
    generator = torch.Generator().manual_seed(1)
    state = [torch.empty(t.shape).uniform_(-0.3, 0.3, generator=generator) for t in model.initial_state(len(sentences))]
    fast_state = tuple(t.clone().to(device).requires_grad_() for t in state)
    reference_state = tuple(t.clone().requires_grad_() for t in state)
    layers, (hidden, memory) = run_fast(model, on(device, batch), fast_state)
    reference_layers, (reference_hidden, reference_memory) = reference(batch["input_ids"], None, reference_state)
    weights = [torch.randn(t.shape, generator=generator) for t in [*layers, hidden, memory]]
    sum((w.to(device) * t).sum() for w, t in zip(weights, [*layers, hidden, memory])).backward()
    sum((w * t).sum() for w, t in zip(weights, [*reference_layers, reference_hidden, reference_memory])).backward()
    reference_params = dict(reference.named_parameters())
    pairs = [(name, p.grad, reference_params[name].grad) for name, p in model.named_parameters()]
    pairs += [(f"state {k}", a.grad, b.grad) for k, (a, b) in enumerate(zip(fast_state, reference_state))]
    for name, fast_grad, reference_grad in pairs:
        scale = reference_grad.abs().max()
        assert scale > 0, name
        assert (fast_grad.cpu() - reference_grad).abs().max() <= 1e-4 * scale, name
    assert bool(fused_calls) == (kernels == "triton fused")


def test_float64_equals_reference_to_rounding(sentences):
    """In float64 the PyTorch steps compute the reference's function: values and gradients to 1e-12."""
    model = random_model(small_config()).double()
    reference = reference_from(model)
    model = static(model, "torch")
    batch = encode(sentences)
    layers, _ = run_fast(model, batch)
    reference_layers, _ = reference(batch["input_ids"])
    for a, b in zip(layers, reference_layers):
        assert (a - b).abs().max() <= 1e-12
    layers[-1].square().sum().backward()
    reference_layers[-1].square().sum().backward()
    reference_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        other = reference_params[name].grad
        if other is not None:
            assert (param.grad - other).abs().max() <= 1e-12 * max(other.abs().max(), 1.0), name


@pytest.mark.parametrize("joint", [True, False])
def test_joint_input_product_can_be_forced(joint, sentences, monkeypatch):
    """`paths.joint_input_product` overrides the choice by batch size (benchmarks compare both), and either way
    the layers compute the reference's function."""
    model = random_model(small_config()).double()
    reference = reference_from(model)
    model = static(model, "torch")
    model.config.paths = {**model.config.paths, "joint_input_product": "joint" if joint else "separate"}

    def no_choice(*args):
        raise AssertionError("chose by batch size although told which product to take")

    monkeypatch.setattr(lstm_static, "joint_input_product", no_choice)
    batch = encode(sentences)
    with torch.no_grad():
        layers, _ = run_fast(model, batch)
        reference_layers, _ = reference(batch["input_ids"])
    for a, b in zip(layers, reference_layers):
        assert (a - b).abs().max() <= 1e-12


def test_triton_steps_equal_torch_steps_in_bfloat16(fused_calls):
    """Under bfloat16 autocast the implementations of the steps agree (cell state in float32): PyTorch's, the Triton
    elementwise kernels, and those with each step's product in the kernel."""
    if not (TRITON_ON_CPU or torch.cuda.is_available()):
        pytest.skip("Triton is not installed")
    model = random_model(small_config())
    batch = on(TRITON_DEVICE, encode(SENTENCES))
    outputs = []
    for kernels in ("torch", "triton", "triton fused"):
        static(model, kernels, TRITON_DEVICE)
        with torch.autocast(TRITON_DEVICE, dtype=torch.bfloat16):
            layers, state = run_fast(model, batch)
        outputs.append([t.float().cpu() for t in [*layers, *state]])
        assert bool(fused_calls) == (kernels == "triton fused")
    for other in outputs[1:]:
        for a, b in zip(outputs[0], other):
            assert (a - b).abs().max() <= 2e-2


@pytest.mark.parametrize("device", DEVICES)
def test_character_cnn_over_every_token_equals_reference(device):
    config = small_config(filters=[[1, 3], [2, 4], [7, 5], [50, 2]])
    model = random_model(config)
    reference = reference_from(model)
    model = static(model, device=device)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 262, (9, 50), generator=generator)
    ids[:, 10:] = 0  # short words, with padding
    ids[3, :] = 7  # one character throughout
    ids[4, 20:] = 0
    with torch.no_grad():
        fast, slow = model.char_encoder(ids.to(device)).cpu(), reference.char_encoder(ids)
    assert (fast - slow).abs().max() <= 1e-5


# --- the sampled softmax drawn on the device -----------------------------------------------------------------------


def test_first_distinct_is_the_sequential_unique_sampler():
    rng = random.Random(0)
    for _ in range(50):
        vocab_size = rng.randint(2, 40)
        draws = [min(int(rng.paretovariate(0.7)) - 1, vocab_size - 1) for _ in range(rng.randint(1, 200))]
        distinct = list(dict.fromkeys(draws))
        num_samples = rng.randint(1, len(distinct))
        words, num_tries = first_distinct(torch.tensor(draws), num_samples, vocab_size)
        assert words.tolist() == distinct[:num_samples]
        assert int(num_tries) == draws.index(distinct[num_samples - 1]) + 1


@pytest.mark.parametrize("num_samples, vocab_size", [(64, 1000), (256, 2149), (900, 1000), (1000, 1000)])
def test_device_draws_always_hold_the_sample(num_samples, vocab_size):
    """The fixed number of draws holds the sample also when it is most or all of the vocabulary (a word never
    drawn would come back with more tries than draws), and is not many times what sequential sampling takes."""
    num_draws = _draws_for_unique_sample(num_samples, vocab_size)
    generator = torch.Generator().manual_seed(0)
    sequential_tries = []
    for _ in range(30):
        sampled, num_tries = sample_log_uniform_candidates_on_device(num_samples, vocab_size, "cpu", generator)
        assert len(set(sampled.tolist())) == num_samples and int(num_tries) <= num_draws
        sequential_tries.append(sample_log_uniform_candidates(num_samples, vocab_size, generator)[1])
    assert num_draws <= 10 * np.mean(sequential_tries)


def test_device_sampler_falls_back_when_too_many_draws_are_needed():
    assert sample_log_uniform_candidates_on_device(100_000, 100_000, "cpu") is None


def test_device_sampler_draws_like_the_sequential_sampler():
    """Same distribution: the mean number of draws and how often each word is in the sample agree with the
    sequential (TensorFlow's) sampler, within their sampling error."""
    num_samples, vocab_size, repeats = 40, 200, 400
    generator = torch.Generator().manual_seed(0)
    tries = {"device": [], "sequential": []}
    counts = {"device": torch.zeros(vocab_size), "sequential": torch.zeros(vocab_size)}
    for _ in range(repeats):
        sampled, num_tries = sample_log_uniform_candidates_on_device(num_samples, vocab_size, "cpu", generator)
        assert len(set(sampled.tolist())) == num_samples
        tries["device"].append(int(num_tries))
        counts["device"][sampled] += 1
        sampled, num_tries = sample_log_uniform_candidates(num_samples, vocab_size, generator)
        tries["sequential"].append(num_tries)
        counts["sequential"][sampled] += 1
    a, b = (np.array(tries[k], dtype=float) for k in ("device", "sequential"))
    assert abs(a.mean() - b.mean()) <= 4 * np.sqrt((a.var() + b.var()) / repeats)
    frequency = (counts["device"] - counts["sequential"]) / repeats
    assert frequency.abs().max() <= 4 * np.sqrt(2 * 0.25 / repeats)


def test_expected_count_with_a_tensor_number_of_tries():
    probability = torch.tensor([0.5, 0.01, 1e-6], dtype=torch.float64)
    for num_tries in (10, 17):
        assert torch.equal(
            expected_count(probability, 10, torch.tensor(num_tries)), expected_count(probability, 10, num_tries)
        )


# --- CUDA graphs -----------------------------------------------------------------------------------------------------


def _training_step(model, batch, graphs):
    set_graphs(model, graphs)
    model.zero_grad(set_to_none=True)
    model(**batch).last_hidden_state.square().sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_cuda
def test_graph_replay_equals_direct_run():
    model = static(random_model(small_config()), device="cuda", graphs=True).train()
    model.encoder.dropout.p = 0.0
    batch = on("cuda", encode(SENTENCES))
    direct = _training_step(model, batch, graphs=False)
    for _ in range(3):  # the second call captures, the third replays
        replayed = _training_step(model, batch, graphs=True)
    assert model.encoder.captured.entries, "nothing was captured"
    for name in direct:
        assert torch.allclose(replayed[name], direct[name], rtol=1e-5, atol=1e-7), name
    with torch.no_grad():
        for _ in range(3):
            replayed_out = model(**batch).last_hidden_state
        set_graphs(model, False)
        direct_out = model(**batch).last_hidden_state
    assert torch.allclose(replayed_out, direct_out, rtol=1e-5, atol=1e-7)


@needs_cuda
def test_graphs_accumulate_gradients_and_survive_two_forward_passes():
    """Two forward passes before one backward pass, and gradients accumulated over two batches, give the
    gradients of a direct run."""
    model = static(random_model(small_config()), device="cuda", graphs=True)
    first, second = on("cuda", encode(SENTENCES)), on("cuda", encode(SENTENCES[::-1]))
    for _ in range(2):  # capture
        _training_step(model, first, graphs=True)
    results = {}
    for graphs in (True, False):
        set_graphs(model, graphs)
        model.zero_grad(set_to_none=True)
        loss = model(**first).last_hidden_state.square().sum() + model(**first).last_hidden_state.abs().sum()
        loss.backward()
        model(**second).last_hidden_state.square().sum().backward()  # accumulates
        results[graphs] = {name: p.grad.clone() for name, p in model.named_parameters()}
    for name in results[False]:
        assert torch.allclose(results[True][name], results[False][name], rtol=1e-5, atol=1e-6), name


def _bilm_batch(vocab_size=30, seed=0):
    from hf_elmo import ElmoForBiLM  # noqa: F401

    batch = encode(SENTENCES)
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab_size, (*batch["attention_mask"].shape, 2), generator=generator)
    labels[~batch["attention_mask"].bool()] = -100
    labels[:, 0, 1] = -100
    return {**on("cuda", batch), "labels": labels.cuda()}


def _bilm_step(model, batch, graphs):
    set_graphs(model.elmo, graphs)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@needs_cuda
@pytest.mark.parametrize("autocast", [False, True])
def test_captured_training_step_equals_direct_step(autocast):
    """The whole training forward and backward of `ElmoForBiLM`, replayed from CUDA graphs, gives the loss and
    gradients of the step run operation by operation (full softmax and no dropout: nothing random)."""
    from hf_elmo import ElmoForBiLM

    config = small_config(vocab_size=30, num_softmax_samples=0, dropout=0.0)
    torch.manual_seed(0)
    model = ElmoForBiLM(config).cuda().train()
    static(model.elmo, device="cuda", graphs=True)
    batch = _bilm_batch()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        direct_loss, direct = _bilm_step(model, batch, graphs=False)
        for _ in range(3):  # the second call captures, the third replays
            loss, replayed = _bilm_step(model, batch, graphs=True)
    assert model._captured_steps.entries, "the step was not captured"
    tolerance = {"rtol": 2e-2, "atol": 1e-3} if autocast else {"rtol": 1e-5, "atol": 1e-6}
    assert torch.allclose(loss, direct_loss, **tolerance)
    for name in direct:
        assert torch.allclose(replayed[name], direct[name], **tolerance), name


@needs_cuda
def test_captured_stream_steps_equal_direct_steps():
    """Stream batches (`split_directions`, the state carried from step to step) replayed from CUDA graphs give the
    losses, final states and gradients of the steps run operation by operation."""
    from hf_elmo import ElmoForBiLM

    config = small_config(vocab_size=30, num_softmax_samples=0, dropout=0.0)
    torch.manual_seed(0)
    model = ElmoForBiLM(config).cuda().train()
    static(model.elmo, device="cuda", graphs=True)
    batch = _bilm_batch()
    batch = {k: v[:4] for k, v in batch.items()}  # an even batch: forward rows, then backward rows
    half = batch["labels"].shape[0] // 2
    batch["labels"][:half, :, 1] = -100
    batch["labels"][half:, :, 0] = -100
    results = {}
    for graphs in (False, True):
        set_graphs(model.elmo, graphs)
        state = tuple(t + 0.1 for t in model.elmo.initial_state(batch["labels"].shape[0]))
        for _ in range(4):  # the second step captures, the later ones replay
            model.zero_grad(set_to_none=True)
            out = model(**batch, state=state, use_cache=True, split_directions=True)
            out.loss.backward()
            state = tuple(t.detach() for t in out.state)  # carried as `StreamTrainer` carries it
        results[graphs] = (out.loss.detach(), state, {name: p.grad.clone() for name, p in model.named_parameters()})
    assert model._captured_steps.entries, "the stream step was not captured"
    (direct_loss, direct_state, direct), (loss, replayed_state, replayed) = results[False], results[True]
    assert torch.allclose(loss, direct_loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(replayed_state, direct_state):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    for name in direct:
        assert torch.allclose(replayed[name], direct[name], rtol=1e-5, atol=1e-6), name


@needs_cuda
def test_captured_training_step_draws_new_random_numbers():
    """Dropout and the sampled softmax draw anew at every replay."""
    from hf_elmo import ElmoForBiLM

    config = small_config(vocab_size=30, num_softmax_samples=8, dropout=0.5)
    model = ElmoForBiLM(config).cuda().train()
    static(model.elmo, device="cuda", graphs=True)
    batch = _bilm_batch()
    losses = [_bilm_step(model, batch, graphs=True)[0] for _ in range(5)]
    assert model._captured_steps.entries
    assert len({float(loss) for loss in losses[2:]}) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_logsumexp_without_a_column_equals_pytorch(dtype):
    """The sampled softmax's fused log-sum-exp (one column left out per row; some rows leave none out, one row
    has a single other column) and its gradient, against PyTorch's operations in float64."""
    from hf_elmo import sampled_softmax

    if sampled_softmax.logsumexp_forward is None or not (TRITON_ON_CPU or torch.cuda.is_available()):
        pytest.skip("Triton is not installed")
    generator = torch.Generator().manual_seed(0)
    rows, columns = 6, 2500  # more than one block of columns
    logits = (torch.randn(rows, columns, generator=generator) * 4).to(dtype).to(TRITON_DEVICE).requires_grad_()
    skip = torch.tensor([0, 7, columns, columns - 1, 1234, columns], device=TRITON_DEVICE)
    fused = sampled_softmax.logsumexp_without(logits, skip, fused=True)
    weights = torch.randn(rows, generator=generator).to(TRITON_DEVICE)
    (fused * weights).sum().backward()
    exact_logits = logits.detach().double().requires_grad_()
    keep = torch.ones(rows, columns, dtype=torch.bool, device=TRITON_DEVICE)
    keep[torch.arange(rows, device=TRITON_DEVICE)[skip < columns], skip[skip < columns]] = False
    exact = torch.logsumexp(exact_logits.masked_fill(~keep, float("-inf")), dim=1)
    (exact * weights.double()).sum().backward()
    assert fused.dtype == torch.float32
    assert (fused.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
    assert (logits.grad.double() - exact_logits.grad).abs().max() <= (2e-2 if dtype == torch.bfloat16 else 1e-6)
    assert torch.all(logits.grad[~keep] == 0)
