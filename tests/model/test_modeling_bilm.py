"""`ElmoForBiLM`: the full and sampled softmax losses against float64 recomputations, the loss normalisation, dropout
in training, bad labels, saving and loading (with remote code too), bfloat16 autocast, the training step's FLOP count.
"""

import textwrap

import numpy as np
import pytest
import torch
from conftest import as_a_folder_copy_runs, run_without_hf_elmo
from safetensors import safe_open
from test_modeling_elmo import small_config
from test_sampled_softmax import reference_sampled_softmax
from transformers import AutoModel, AutoModelForPreTraining
from transformers.utils import logging as hf_logging

from hf_elmo import ElmoForBiLM, ElmoModel, ElmoPaths, ElmoTokenizer
from hf_elmo.sampled_softmax import sample_log_uniform_candidates
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.windows import encode_windows

WORDS = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "on", "mat", "a", "dog", "."]
WINDOWS = [[["the", "cat", "sat"], ["a", "dog", "."]], [["the", "mat"]], [["on", "a", "zebra", "."]]]


def tiny_config(**overrides):
    return small_config(**{"num_layers": 2, "vocab_size": len(WORDS), "num_softmax_samples": 4, **overrides})


def random_bilm(config, dtype=torch.float64):
    model = ElmoForBiLM(config).to(dtype)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    return model


def batch():
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(WORDS)
    encoded = encode_windows(WINDOWS, tokenizer)
    return DataCollatorForBiLM()(
        [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
    )


def direction_targets(model, inputs):
    """(hidden (N, P), target id) per direction, read off the encoder output and the labels."""
    with torch.no_grad():
        top = model.elmo(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    P = model.config.projection_dim
    result = []
    for direction, half in ((0, top[..., :P]), (1, top[..., P:])):
        labels = inputs["labels"][..., direction]
        real = labels != -100
        result.append((half[real].numpy(), labels[real].numpy()))
    return result


def cross_entropy(hidden, targets, weight, bias):
    logits = hidden @ weight.T + bias
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return log_z - logits[np.arange(len(targets)), targets]


def test_full_softmax_loss_matches_float64_recomputation():
    model = random_bilm(tiny_config()).eval()
    inputs = batch()
    with torch.no_grad():
        out = model(**inputs, return_logits=True)
    weight, bias = model.softmax.weight.detach().numpy(), model.softmax.bias.detach().numpy()
    (h_f, t_f), (h_b, t_b) = direction_targets(model, inputs)
    forward, backward = cross_entropy(h_f, t_f, weight, bias), cross_entropy(h_b, t_b, weight, bias)
    assert len(forward) == len(backward)  # n + 1 targets per sentence in each direction
    np.testing.assert_allclose(out.forward_loss.item(), forward.mean(), rtol=1e-12)
    np.testing.assert_allclose(out.backward_loss.item(), backward.mean(), rtol=1e-12)
    np.testing.assert_allclose(out.loss.item(), 0.5 * (forward.mean() + backward.mean()), rtol=1e-12)
    B, T = inputs["attention_mask"].shape
    assert out.forward_logits.shape == out.backward_logits.shape == (B, T, len(WORDS))
    assert model(**inputs).forward_logits is None  # logits only when asked


def test_sampled_softmax_in_training_matches_float64_formula():
    model = random_bilm(tiny_config()).train()  # dropout 0: the only randomness is the sample
    inputs = batch()
    torch.manual_seed(7)
    out = model(**inputs)
    torch.manual_seed(7)
    sampled, num_tries = sample_log_uniform_candidates(4, len(WORDS))
    weight, bias = model.softmax.weight.detach().numpy(), model.softmax.bias.detach().numpy()
    (h_f, t_f), (h_b, t_b) = direction_targets(model, inputs)
    forward = reference_sampled_softmax(h_f, t_f, weight, bias, sampled.tolist(), num_tries)
    backward = reference_sampled_softmax(h_b, t_b, weight, bias, sampled.tolist(), num_tries)
    np.testing.assert_allclose(out.forward_loss.item(), forward.mean(), rtol=1e-12)
    np.testing.assert_allclose(out.backward_loss.item(), backward.mean(), rtol=1e-12)
    np.testing.assert_allclose(out.loss.item(), 0.5 * (forward.mean() + backward.mean()), rtol=1e-12)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_full_softmax_in_training_when_samples_cover_the_vocabulary():
    inputs = batch()
    for samples in (0, len(WORDS)):
        model = random_bilm(tiny_config(num_softmax_samples=samples))
        assert not model.uses_sampled_softmax()
        assert model.train()(**inputs).loss.item() == model.eval()(**inputs).loss.item()


def test_num_items_in_batch_normalises_the_summed_loss():
    model = random_bilm(tiny_config()).eval()
    inputs = batch()
    with torch.no_grad():
        out = model(**inputs)
        scaled = model(**inputs, num_items_in_batch=1000)
    targets = int(inputs["labels"].ne(-100).sum())
    np.testing.assert_allclose(scaled.loss.item() * 1000, out.loss.item() * targets, rtol=1e-12)


def recorded_calls(module):
    """The `(input, output)` of each call of `module` from now on."""
    calls = []
    module.register_forward_hook(lambda _, args, out: calls.append((args[0], out)))
    return calls


def assert_dropout_at_rate(calls, p):
    """Every output is its input scaled by float32 `1 / (1 - p)` (PyTorch's scale) or 0, the fraction kept 1 - p
    within five standard deviations of a binomial draw."""
    scale = float(torch.tensor(1.0) / torch.tensor(1 - p, dtype=torch.float32))
    kept = total = 0
    for x, y in calls:
        nonzero = x != 0
        dropped = y == 0
        assert torch.equal(y[~dropped], x[~dropped] * scale)
        kept, total = kept + int((nonzero & ~dropped).sum()), total + int(nonzero.sum())
    assert abs(kept / total - (1 - p)) <= 5 * (p * (1 - p) / total) ** 0.5, (kept, total)


@pytest.mark.parametrize("paths", ["auto", "reference"])
def test_dropout_at_each_lstm_input_and_on_the_top_layer_in_training(paths):
    """bilm-tf's placement: every LSTM layer's input (residual included) and the top layer before the softmax, each
    element kept with probability 1 - p and scaled by 1 / (1 - p); nothing changes in evaluation."""
    p = 0.3
    config = tiny_config(dropout=p, num_softmax_samples=0, projection_dim=32, cell_dim=64)
    config.paths = ElmoPaths.reference().to_dict() if paths == "reference" else None
    model = random_bilm(config, dtype=torch.float32).train()
    top_calls, encoder_calls = recorded_calls(model.dropout), recorded_calls(model.elmo.encoder.dropout)
    elmo_outputs, char_outputs = recorded_calls(model.elmo), recorded_calls(model.elmo.char_encoder)
    inputs = batch()
    with torch.no_grad():
        model(**inputs)
    # The top: once, on this forward pass's top layer.
    assert len(top_calls) == 1 and torch.equal(top_calls[0][0], elmo_outputs[0][1].last_hidden_state)
    assert_dropout_at_rate(top_calls, p)
    # Each direction's input of each layer; the first layer's is the character encoder's output (the default path
    # lays it out time-major, its rows sorted by length: the same values).
    assert len(encoder_calls) == 2 * config.num_layers
    token_embeddings = char_outputs[0][1].flatten().sort().values
    for x, _ in encoder_calls[:2]:
        assert torch.equal(x.flatten().sort().values, token_embeddings)
    assert_dropout_at_rate(encoder_calls, p)
    model.eval()
    top_calls.clear(), encoder_calls.clear()
    with torch.no_grad():
        model(**inputs)
    assert len(top_calls) == 1 and all(torch.equal(x, y) for x, y in top_calls + encoder_calls)


def test_bad_labels_and_config_give_clear_errors():
    model = random_bilm(tiny_config())
    inputs = batch()
    labels = inputs["labels"]
    bad = labels.clone()
    bad[0, 1, 0] = len(WORDS)
    cases = [
        (labels[..., 0], "labels must have shape"),
        (labels.double(), "integer word ids"),
        (bad, r"word ids in \[0, 10\] or -100"),
    ]
    for value, message in cases:
        with pytest.raises(ValueError, match=message):
            model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=value)
    with pytest.raises(ValueError, match="needs config.vocab_size >= 1"):
        ElmoForBiLM(tiny_config(vocab_size=0))


@pytest.fixture
def transformers_warnings(caplog):
    hf_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            yield caplog
    finally:
        hf_logging.disable_propagation()


def test_save_load_round_trip(tmp_path, transformers_warnings):
    model = random_bilm(tiny_config(), dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert [k for k in keys if k.startswith("softmax.")] == ["softmax.bias", "softmax.weight"]
    assert len(keys) == len(set(keys)) == len(model.state_dict())

    inputs = batch()
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, ElmoForBiLM)
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).loss, model(**inputs).loss)

    transformers_warnings.clear()
    encoder, info = ElmoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert transformers_warnings.records == []
    assert all(torch.equal(v, model.elmo.state_dict()[k]) for k, v in encoder.state_dict().items())
    assert type(AutoModel.from_pretrained(tmp_path)) is ElmoModel


def test_fresh_softmax_on_converted_weights(converted_dirs):
    folder = converted_dirs["allennlp"]
    model, info = ElmoForBiLM.from_pretrained(folder, vocab_size=500, output_loading_info=True)
    assert set(info["missing_keys"]) == {"softmax.weight", "softmax.bias"}
    encoder = ElmoModel.from_pretrained(folder)
    assert all(torch.equal(v, model.elmo.state_dict()[k]) for k, v in encoder.state_dict().items())
    # bilm-tf's initialisation (normal, std 1/sqrt(P); zero bias), not uninitialised memory
    P = model.config.projection_dim
    assert torch.all(model.softmax.bias == 0)
    assert abs(model.softmax.weight.std().item() * P**0.5 - 1) < 0.1


def test_remote_code_loads_the_bilm_without_the_package(tmp_path):
    model = random_bilm(tiny_config(), dtype=torch.float32).eval()
    model.save_pretrained(tmp_path / "bilm")
    inputs = batch()
    torch.save(dict(inputs), tmp_path / "inputs.pt")
    with torch.no_grad(), as_a_folder_copy_runs(model):
        expected = model(**inputs).loss.item()
    script = textwrap.dedent(
        f"""
        import torch
        from transformers import AutoModelForPreTraining
        model = AutoModelForPreTraining.from_pretrained({str(tmp_path / "bilm")!r}, trust_remote_code=True).eval()
        assert type(model).__name__ == "ElmoForBiLM" and type(model).__module__.startswith("transformers_modules")
        with torch.no_grad():
            print(repr(model(**torch.load({str(tmp_path / "inputs.pt")!r})).loss.item()))
        """
    )
    result = run_without_hf_elmo(script, tmp_path)
    assert float(result.stdout.strip().splitlines()[-1]) == expected


def test_bfloat16_autocast_keeps_the_loss_in_float32():
    model = random_bilm(tiny_config(num_softmax_samples=0), dtype=torch.float32).eval()
    inputs = batch()
    with torch.no_grad():
        expected = model(**inputs).loss
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(**inputs)
    assert out.loss.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: a relative error within a few units of 2**-8
    assert abs(out.loss.item() - expected.item()) <= 4 * 2**-8 * expected.item()


@pytest.mark.parametrize(
    "samples, split_directions", [(8, False), (0, False), (8, True)], ids=["sampled", "full softmax", "split rows"]
)
def test_floating_point_ops_count_the_products_a_training_step_runs(samples, split_directions):
    """`floating_point_ops` (what `hf-elmo train` reports as `total_flos`) against PyTorch's FLOP counter on the
    reference path, whose every product is a PyTorch matrix product: the forward exactly a third of the count, the
    backward twice the forward less the products with the start state, whose gradient autograd does not compute."""
    from torch.utils.flop_counter import FlopCounterMode

    config = tiny_config(num_softmax_samples=samples, max_characters_per_token=12, paths=ElmoPaths.reference())
    config.vocab_size = 40
    model = ElmoForBiLM(config).train()
    rows, length = 4, 5
    generator = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(1, 262, (rows, length, 12), generator=generator),
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "labels": torch.randint(0, 40, (rows, length, 2), generator=generator),
    }
    if split_directions:  # the first half of the rows is the forward LM's, the second the backward's
        inputs["labels"][: rows // 2, :, 1] = inputs["labels"][rows // 2 :, :, 0] = -100
    model(**inputs, split_directions=split_directions)  # loads what loads once, outside the counts
    with FlopCounterMode(display=False) as forward:
        loss = model(**inputs, split_directions=split_directions).loss
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    counted = model.floating_point_ops(inputs, split_directions=split_directions)
    assert counted == 3 * forward.get_total_flops()
    direction_rows = rows // 2 if split_directions else rows
    start_state_products = 2 * config.num_layers * 2 * direction_rows * config.projection_dim * 4 * config.cell_dim
    assert backward.get_total_flops() == 2 * forward.get_total_flops() - start_state_products
    assert model.floating_point_ops({"labels": inputs["labels"]}) == 0  # no input: nothing counted, as Trainer does


def test_the_captured_steps_dropout_on_the_cpu():
    """What a GPU captures as CUDA graphs (`ElmoForBiLM._training_step_sums` on the static LSTM over every word) run
    on the CPU in training: dropout at every layer's input (both directions stacked) and on the top layer at rate p,
    and from the same seed the direct step's draws, loss and gradients; new draws from another seed."""
    p = 0.3
    config = tiny_config(dropout=p, num_softmax_samples=0, projection_dim=32, cell_dim=64)
    config.paths = {"char_cnn": "every_word", "lstm": "static", "lstm_kernels": "torch", "cuda_graphs": "off"}
    model = random_bilm(config, dtype=torch.float32).train()
    assert model.paths.training_step == "direct: CUDA graphs off"
    inputs = batch()
    mask = model.elmo.check_inputs(inputs["input_ids"], inputs["attention_mask"])
    top_calls, encoder_calls = recorded_calls(model.dropout), recorded_calls(model.elmo.encoder.dropout)

    def step(seed):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        sums, counts = model._training_step_sums(inputs["input_ids"], mask, inputs["labels"])
        loss = sums.sum() / counts.sum()
        loss.backward()
        return loss.detach(), {name: param.grad.clone() for name, param in model.named_parameters()}

    loss, grads = step(seed=0)
    assert len(top_calls) == 1 and len(encoder_calls) == config.num_layers
    assert_dropout_at_rate(top_calls + encoder_calls, p)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    direct = model(**inputs).loss
    direct.backward()
    assert torch.equal(loss, direct.detach())
    for name, param in model.named_parameters():
        assert torch.equal(grads[name], param.grad), name
    assert not torch.equal(step(seed=1)[0], loss)


def test_a_training_call_decides_its_step_from_its_arguments(monkeypatch):
    """Where the paths allow a captured step (a GPU's), each argument that rules it out shows as the reason."""
    from hf_elmo.compute_paths import MAX_CAPTURED_POSITIONS

    monkeypatch.setattr(ElmoForBiLM, "paths", property(lambda self: ElmoPaths(training_step="captured")))
    model = random_bilm(tiny_config()).train()
    ids, labels = batch()["input_ids"], batch()["labels"]
    state = model.elmo.initial_state(len(ids))

    def step(*args, **kwargs):
        return model.training_step_paths(*args, **kwargs).training_step

    assert step(ids, labels) == "captured"
    assert step(ids, labels, state, use_cache=True) == "captured"
    assert step(ids, None) == "direct: no labels"
    assert step(ids, labels, outputs_beyond_loss=True) == "direct: outputs beyond the loss and the final state"
    assert step(ids, labels, use_cache=True).startswith("direct: a final state without a start state")
    assert step(ids, labels, state).startswith("direct: a final state without a start state")
    taking = tuple(t.clone().requires_grad_() for t in state)
    assert step(ids, labels, taking, use_cache=True) == "direct: a start state that takes gradients"
    long_rows = torch.zeros(2, MAX_CAPTURED_POSITIONS, 1, dtype=torch.long)
    assert step(long_rows, labels, split_directions=True) == "captured"  # each direction reads half of the rows
    assert step(long_rows, labels).startswith(f"direct: more than {MAX_CAPTURED_POSITIONS} positions")
    model.gradient_checkpointing_enable()
    assert step(ids, labels) == "direct: gradient checkpointing"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_printed_sampled_softmax_kernel_is_the_one_that_runs(dtype, monkeypatch):
    from hf_elmo import cpu_kernels, sampled_softmax

    if not cpu_kernels.loops_built():
        pytest.skip("the compiled CPU loops do not build here")
    ran = []
    for name in ("compiled_logsumexp", "compiled_logsumexp_backward"):
        original = getattr(sampled_softmax, name)
        monkeypatch.setattr(sampled_softmax, name, lambda *args, f=original: ran.append("compiled") or f(*args))
    model = random_bilm(tiny_config(), dtype=dtype).train()
    expected = "compiled" if dtype == torch.float32 else "torch"
    assert model.paths.sampled_softmax == expected and f"sampled_softmax: {expected}" in str(model.paths)
    model(**batch()).loss.backward()
    assert ran == (["compiled", "compiled"] if expected == "compiled" else [])
