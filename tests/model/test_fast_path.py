"""The fast path of `ElmoModel` (deduplicated words, character-CNN windows skipped inside a word's final run
of one character, length-sorted LSTM with a fused backward) against the straightforward reference path
(`ElmoPaths.reference()`): same values within 1e-5 and same gradients within 1e-4 relative."""

import threading
from functools import partial

import numpy as np
import pytest
import torch
from conftest import FIXTURE_SETS, fixture_batches, reference_from
from hypothesis import given, settings
from hypothesis import strategies as st
from test_modeling_elmo import random_model as modeling_random_model
from test_modeling_elmo import small_config as modeling_small_config
from transformers import AutoModel

from hf_elmo import (
    ElmoTokenizer,
    char_cnn_fast,
    compute_paths,
    cpu_kernels,
    cpu_threads,
    lstm_sorted,
    onednn_linear,
    paths_resolution,
)
from hf_elmo.character_rows import word_keys, words_to_char_ids
from hf_elmo.compute_paths import OnednnProducts

# Lengths differ and are not sorted; one word fills all 50 slots; words repeat within and across sentences.
SENTENCES = [
    ["a", "b"],
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Über", "naïve", "日本語", "😀", "x" * 60, "the"],
    ["Hi"],
    ["A", "b", "c", "the", "cat"],
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread runs them as fast, and a busy machine cannot stall a second one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["default products", "oneDNN for every product"])
def products(request, monkeypatch):
    """The test models are too small for the oneDNN float32 products to be chosen by size: also force them."""
    if request.param != "default products":
        if onednn_linear._onednn_linear is None or not torch.backends.mkldnn.is_available():
            pytest.skip("this PyTorch build has no oneDNN")
        monkeypatch.setattr(paths_resolution, "onednn_products", lambda: EVERY_PRODUCT)
    return request.param


EVERY_PRODUCT = OnednnProducts(min_multiply_adds=0)


@pytest.fixture(params=["compiled step", "PyTorch step"])
def lstm_step(request, monkeypatch):
    """An LSTM step's elementwise part as one compiled call (where it builds: `test_cpu_kernels.py` fails
    where a compiler is found and it does not) or as PyTorch operations (as "auto" resolves for large steps)."""
    if request.param == "PyTorch step":
        monkeypatch.setattr(paths_resolution, "MAX_COMPILED_STEP_MULTIPLY_ADDS", 0)
    elif not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("the CPU LSTM kernels do not build here")
    return request.param


def small_config(**overrides):
    """The core tests' small config, with a filter wider than most words' spans."""
    return modeling_small_config(**{"filters": [[1, 4], [2, 6], [3, 8], [7, 5]], **overrides})


def random_model(config, scale=1.0):
    """Float32 weights of magnitude `scale / sqrt(fan_in)`: both clips of `small_config` trigger (see
    `test_clips_trigger_in_these_tests`) while values stay O(1), so float32 rounding stays near 1e-7."""
    return modeling_random_model(config, scale=scale, dtype=torch.float32)


def encode(sentences):
    return ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")


def run_fast(model, batch, state=None):
    out = model(**batch, state=state, use_cache=True, output_hidden_states=True)
    return list(out.hidden_states), out.state


def assert_same_outputs(fast, reference, atol):
    (fast_layers, fast_state), (reference_layers, reference_state) = fast, reference
    assert len(fast_layers) == len(reference_layers)
    for a, b in zip([*fast_layers, *fast_state], [*reference_layers, *reference_state]):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= atol, f"max abs diff {(a - b).abs().max()}"


@pytest.mark.parametrize("name", FIXTURE_SETS)
def test_fixture_models_all_layers_with_carried_state(name, converted_dirs, products, lstm_step):
    model = AutoModel.from_pretrained(converted_dirs[name]).eval()
    reference = reference_from(model)
    fast_state = reference_state = None
    with torch.no_grad():
        for words, _ in fixture_batches(name):
            batch = encode(words)
            fast = run_fast(model, batch, fast_state)
            slow = reference(batch["input_ids"], batch["attention_mask"], reference_state)
            assert_same_outputs(fast, slow, atol=1e-5)
            fast_state, reference_state = fast[1], slow[1]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"use_skip_connections": False, "num_layers": 2},
        {"activation": "tanh", "n_highway": 0},
        {"cell_clip": None, "proj_clip": None},
        {"filters": [[1, 3], [5, 4], [30, 2], [50, 2]]},  # windows as wide as the word, and wider than spans
        {"forget_bias": 1.0},
    ],
)
def test_random_configs_match_reference_with_state_and_padding(overrides, products, lstm_step):
    config = small_config(**overrides)
    model = random_model(config)
    reference = reference_from(model)
    first, second = encode(SENTENCES), encode(SENTENCES[::-1])
    with torch.no_grad():
        fast = run_fast(model, first)
        slow = reference(first["input_ids"], first["attention_mask"])
        assert_same_outputs(fast, slow, atol=1e-5)
        for layer in fast[0]:
            assert torch.all(layer[~first["attention_mask"].bool()] == 0), "padded positions must be exactly 0"
        # Carry the state into a batch whose rows sort differently.
        assert_same_outputs(run_fast(model, second, fast[1]), reference(second["input_ids"], None, slow[1]), atol=1e-5)


def test_word_embeddings_beside_the_characters(products):
    """ELMoForManyLangs models: word ids need not follow the characters (a repeated spelling, other words)."""
    model = random_model(small_config(input_word_vocab_size=7, input_word_dim=3))
    reference = reference_from(model)
    batch = encode(SENTENCES)
    word_ids = torch.randint(0, 7, batch["attention_mask"].shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = run_fast(model, {**batch, "input_word_ids": word_ids})
        slow = reference(batch["input_ids"], batch["attention_mask"], input_word_ids=word_ids)
    assert_same_outputs(fast, slow, atol=1e-5)


def test_clips_trigger_in_these_tests():
    model = random_model(small_config(cell_clip=None, proj_clip=None))
    with torch.no_grad():
        _, (hidden, memory) = run_fast(model, encode(SENTENCES))
    assert memory.abs().max() > 0.5 and hidden.abs().max() > 0.3


char_rows = st.lists(st.integers(0, 261), min_size=50, max_size=50)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(char_rows, min_size=1, max_size=12),
    run_start=st.lists(st.integers(0, 50), min_size=12, max_size=12),
    run_char=st.lists(st.integers(0, 261), min_size=12, max_size=12),
    widths=st.lists(st.integers(1, 50), min_size=1, max_size=3),
)
def test_character_cnn_on_arbitrary_ids(rows, run_start, run_char, widths):
    """Any ids, not only the tokenizer's layout: each row ends in a run of one character from a random slot."""
    config = small_config(filters=[[w, 3] for w in widths], n_highway=1)
    model = random_model(config)
    reference = reference_from(model)
    ids = torch.tensor(rows)
    for k in range(len(rows)):
        ids[k, run_start[k] :] = run_char[k]
    ids = torch.cat([ids, ids[:2]])  # repeated words
    with torch.no_grad():
        fast, slow = model.char_encoder(ids), reference.char_encoder(ids)
    assert (fast - slow).abs().max() <= 1e-5


def test_gradients_match_reference(products, lstm_step):
    """Gradients of every parameter and of the initial state, through clipping, padding and sorting."""
    config = small_config()
    model = random_model(config)
    reference = reference_from(model)
    batch = encode(SENTENCES)
    generator = torch.Generator().manual_seed(1)
    state = tuple(t.requires_grad_() for t in model.initial_state(len(SENTENCES)))
    for t in state:
        t.data.uniform_(-0.3, 0.3, generator=generator)
    reference_state = tuple(t.detach().clone().requires_grad_() for t in state)
    layers, (hidden, memory) = run_fast(model, batch, state)
    reference_layers, (reference_hidden, reference_memory) = reference(batch["input_ids"], None, reference_state)
    weights = [torch.randn(t.shape, generator=generator) for t in [*layers, hidden, memory]]

    def loss(tensors):
        return sum((w * t).sum() for w, t in zip(weights, tensors))

    loss([*layers, hidden, memory]).backward()
    loss([*reference_layers, reference_hidden, reference_memory]).backward()
    pairs = [
        (name, param.grad, dict(reference.named_parameters())[name].grad) for name, param in model.named_parameters()
    ]
    pairs += [(f"state {k}", a.grad, b.grad) for k, (a, b) in enumerate(zip(state, reference_state))]
    for name, fast_grad, reference_grad in pairs:
        scale = reference_grad.abs().max()
        assert scale > 0, name
        assert (fast_grad - reference_grad).abs().max() <= 1e-4 * scale, name


def test_gradients_in_train_mode_without_dropout_and_frozen_weights(products):
    model = random_model(small_config()).train()
    for param in model.encoder.parameters():
        param.requires_grad_(False)
    reference = reference_from(model)
    batch = encode(SENTENCES)
    model(**batch).last_hidden_state.square().sum().backward()
    reference(batch["input_ids"])[0][-1].square().sum().backward()
    for name, param in model.named_parameters():
        other = dict(reference.named_parameters())[name]
        if name.startswith("encoder."):
            assert param.grad is None
        else:
            assert (param.grad - other.grad).abs().max() <= 1e-4 * other.grad.abs().max(), name


def test_forward_direction_of_chunked_document_equals_one_pass():
    """Embedding a long document in chunks with the state carried gives the forward LSTM direction of the
    one-pass run (the backward direction differs by design: each chunk runs it from its own end)."""
    config = small_config()
    model = random_model(config)
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 9))) for _ in range(300)]
    ids = torch.from_numpy(words_to_char_ids(words))[None]
    with torch.no_grad():
        whole = model(ids, output_hidden_states=True).hidden_states
        state, pieces = None, []
        for start in range(0, len(words), 64):
            out = model(ids[:, start : start + 64], state=state, use_cache=True, output_hidden_states=True)
            state, pieces = out.state, pieces + [out.hidden_states]
    P = config.projection_dim
    for layer in range(1, config.num_layers + 1):
        chunked = torch.cat([piece[layer] for piece in pieces], dim=1)
        assert (chunked[..., :P] - whole[layer][..., :P]).abs().max() <= 1e-5


@pytest.mark.parametrize("mode", ["bfloat16 weights", "bfloat16 autocast"])
def test_bfloat16_layers_stay_close_to_float32(mode, converted_dirs, products):
    """Quality of the bfloat16 paths on the allennlp fixture model: mean cosine per token of each layer."""
    model = AutoModel.from_pretrained(converted_dirs["allennlp"]).eval()
    batch = encode([sentence for words, _ in fixture_batches("allennlp")[:3] for sentence in words])
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        full_layers = model(**batch, output_hidden_states=True).hidden_states
        if mode == "bfloat16 weights":
            half_layers = model.to(torch.bfloat16)(**batch, output_hidden_states=True).hidden_states
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                half_layers = model(**batch, output_hidden_states=True).hidden_states
    for full, low in zip(full_layers, half_layers):
        assert low.dtype == torch.bfloat16
        cosine = torch.nn.functional.cosine_similarity(full[real], low[real].float(), dim=-1)
        assert cosine.mean() >= 0.999, cosine.mean()


def test_autocast_training_step_gives_float32_gradients_close_to_float32(products):
    model = random_model(small_config()).train()
    batch = encode(SENTENCES)
    model(**batch).last_hidden_state.square().sum().backward()
    full = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(**batch).last_hidden_state.float().square().sum().backward()
    for name, param in model.named_parameters():
        assert param.grad.dtype == torch.float32
        cosine = torch.nn.functional.cosine_similarity(param.grad.flatten(), full[name].flatten(), dim=0)
        assert cosine >= 0.99, (name, cosine)


@pytest.mark.skipif(onednn_linear._onednn_linear is None, reason="this PyTorch build has no oneDNN")
def test_onednn_linear_matches_torch_linear_with_gradients():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=generator).transpose(0, 1)  # not contiguous
    weight, bias = torch.randn(4, 7, generator=generator), torch.randn(4, generator=generator)
    tensors = [t.clone().requires_grad_() for t in (x, weight, bias)]
    references = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out, expected = onednn_linear.linear(*tensors, onednn=EVERY_PRODUCT), torch.nn.functional.linear(*references)
    assert out.shape == expected.shape and (out - expected).abs().max() <= 1e-5
    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    expected.backward(grad)
    for a, b in zip(tensors, references):
        assert (a.grad - b.grad).abs().max() <= 1e-5
    with torch.no_grad():
        assert (onednn_linear.linear(x, weight, onednn=EVERY_PRODUCT) - x @ weight.t()).abs().max() <= 1e-5


@pytest.mark.skipif(onednn_linear._onednn_linear is None, reason="this PyTorch build has no oneDNN")
def test_onednn_linear_under_torch_compile():
    # Inductor lowers the oneDNN operator only for frozen weights: a compiled model's products must be PyTorch's.
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(6, 7, generator=generator), torch.randn(4, 7, generator=generator)
    torch._dynamo.reset()
    with torch.inference_mode():
        out = torch.compile(partial(onednn_linear.linear, onednn=EVERY_PRODUCT), fullgraph=True)(x, weight)
    assert (out.double() - x.double() @ weight.double().t()).abs().max() <= 1e-5


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "bfloat16 autocast"])
def test_concurrent_cpu_inference_matches_reference(mode, monkeypatch, lstm_step):
    """With two intra-op threads, inference splits LSTM directions and character-CNN words between threads."""
    calls = []
    original = cpu_threads.run_concurrently

    def spy(*parts):
        calls.append(len(parts))
        return original(*parts)

    monkeypatch.setattr("hf_elmo.char_cnn_fast.run_concurrently", spy)
    monkeypatch.setattr("hf_elmo.lstm_sorted.run_concurrently", spy)
    model = random_model(small_config())
    reference = reference_from(model)
    rng = np.random.default_rng(0)
    sentences = [
        ["".join(rng.choice(list("abcdefghij"), size=rng.integers(1, 12))) for _ in range(n)] for n in (20, 8, 14)
    ]
    batch = encode(sentences)
    torch.set_num_threads(2)
    try:
        context = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode()}.get(mode)
        if context is None:
            context = torch.autocast("cpu", dtype=torch.bfloat16)
            torch.set_grad_enabled(False)
        with context:
            fast = run_fast(model, batch)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
        torch.set_grad_enabled(True)
    assert calls == [2] * (1 + model.config.num_layers)  # the words once, then the directions of each layer
    assert fast[0][-1].is_inference() == (mode == "inference_mode")
    with torch.no_grad():
        slow = reference(batch["input_ids"], batch["attention_mask"])
    if mode == "bfloat16 autocast":
        assert all(layer.dtype == torch.bfloat16 for layer in fast[0])
        assert all(t.dtype == torch.float32 for t in fast[1]), "the state must be passable back to the model"
        real = batch["attention_mask"].bool()
        for a, b in zip(fast[0], slow[0]):
            assert torch.nn.functional.cosine_similarity(a[real].float(), b[real], dim=-1).mean() >= 0.999
    else:
        assert_same_outputs(fast, slow, atol=1e-5)


@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["stacked", "one direction at a time"])
def test_cpu_training_gradients_match_reference_both_ways(monkeypatch, one_at_a_time, lstm_step):
    """Under autograd a layer's directions run stacked (one batched product per step for both, the backward one
    reading rows from their last word), or one after the other for layers with very large steps; either way, with
    rows of different lengths and two intra-op threads, the gradients are those of the reference."""
    directions_per_call = []
    original = lstm_sorted._forward

    def spy(xs, *args, **kwargs):
        directions_per_call.append(len(xs))
        return original(xs, *args, **kwargs)

    monkeypatch.setattr(lstm_sorted, "_forward", spy)
    monkeypatch.setattr(lstm_sorted, "_MIN_STEP_MULTIPLY_ADDS_ONE_AT_A_TIME", 0 if one_at_a_time else 1 << 62)
    model = random_model(small_config())
    reference = reference_from(model)
    batch = encode(SENTENCES)
    assert len(set(batch["attention_mask"].sum(dim=1).tolist())) > 1
    generator = torch.Generator().manual_seed(2)
    weights = [
        torch.randn(len(SENTENCES), batch["input_ids"].shape[1], 2 * model.config.projection_dim, generator=generator)
        for _ in range(model.config.num_layers)
    ]
    torch.set_num_threads(2)
    try:
        layers = run_fast(model, batch)[0][1:]
        sum((w * layer).sum() for w, layer in zip(weights, layers)).backward()
    finally:
        torch.set_num_threads(1)
    expected_calls = [1, 1] * model.config.num_layers if one_at_a_time else [2] * model.config.num_layers
    assert directions_per_call == expected_calls
    reference_layers = reference(batch["input_ids"], batch["attention_mask"])[0][1:]
    sum((w * layer).sum() for w, layer in zip(weights, reference_layers)).backward()
    for name, param in model.named_parameters():
        expected = dict(reference.named_parameters())[name].grad
        assert (param.grad - expected).abs().max() <= 1e-4 * expected.abs().max(), name


@pytest.mark.skipif(cpu_threads._thread_count_setters() is None, reason="no per-thread OpenMP setting here")
def test_concurrent_parts_change_no_other_threads_count():
    """The workers run with their share of the caller's threads; a thread that starts using torch meanwhile, and the
    caller, keep the caller's count (torch.set_num_threads in a worker would give that thread the worker's share)."""
    seen = {}

    def part(name):
        seen[name] = torch.get_num_threads()
        started = threading.Thread(target=lambda: seen.__setitem__(f"started by {name}", torch.get_num_threads()))
        started.start()
        started.join()
        return name

    torch.set_num_threads(2)
    try:
        assert cpu_threads.run_concurrently(partial(part, "a"), partial(part, "b")) == ["a", "b"]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert seen == {"a": 1, "b": 1, "started by a": 2, "started by b": 2}


@pytest.mark.skipif(not cpu_kernels.available(torch.zeros(1)), reason="the CPU LSTM kernels do not build here")
@pytest.mark.parametrize(
    "cell_dim, projection_dim, lstm_kernels, runs",
    [
        (8, 4, "auto", "compiled"),
        # 5 D P at the threshold: PyTorch's products, as the paths print.
        (1024, 820, "auto", "torch"),
        (1024, 820, "compiled", "compiled"),  # a named path runs as named
    ],
    ids=["small steps", "large steps", "large steps, compiled asked for"],
)
def test_the_printed_lstm_kernels_are_the_ones_that_run(monkeypatch, cell_dim, projection_dim, lstm_kernels, runs):
    assert 5 * 1024 * 820 >= compute_paths.MAX_COMPILED_STEP_MULTIPLY_ADDS > 5 * 8 * 4
    seen = []
    for name in ("compiled_forward", "compiled_backward", "_torch_forward_loop", "_torch_backward_loop"):
        original = getattr(lstm_sorted, name)
        kind = "compiled" if name.startswith("compiled") else "torch"
        monkeypatch.setattr(
            lstm_sorted, name, partial(lambda f, kind, *a, **k: seen.append(kind) or f(*a, **k), original, kind)
        )
    config = small_config(cell_dim=cell_dim, projection_dim=projection_dim, num_layers=1)
    config.paths = {"lstm_kernels": lstm_kernels}
    model = random_model(config).train()
    model.config.dropout = 0.0
    printed = str(model.paths)
    assert f"lstm_kernels: {runs}" in printed.splitlines()[4]
    assert ("multiply-adds per row" in printed) == (lstm_kernels == "auto" and runs == "torch")
    model(**encode(SENTENCES[:2])).last_hidden_state.sum().backward()
    assert seen and set(seen) == {runs}, seen


def test_the_printed_products_are_the_ones_that_run_forward_and_backward(monkeypatch):
    """The oneDNN products `print(model.paths)` shows are those of the forward pass and of its backward pass, which
    runs after the forward returned; a model on `linear="torch"` sends none to oneDNN either way."""
    monkeypatch.setattr(paths_resolution, "onednn_products", lambda: EVERY_PRODUCT)
    asked = []
    use_onednn = onednn_linear._use_onednn
    monkeypatch.setattr(
        onednn_linear, "_use_onednn", lambda x, w, onednn: asked.append(onednn) or use_onednn(x, w, onednn)
    )
    for linear in ("onednn", "torch"):
        model = random_model(small_config(paths={"linear": linear, "lstm_kernels": "torch"})).train()
        printed = str(model.paths).splitlines()[7]
        assert printed == (
            "linear: onednn (products of at least 0 multiply-adds)" if linear == "onednn" else "linear: torch"
        )
        asked.clear()
        out = model(**encode(SENTENCES[:2])).last_hidden_state
        forward_asked = len(asked)
        out.sum().backward()
        assert forward_asked and (len(asked) > forward_asked or linear == "torch"), "products forward and backward"
        assert set(asked) == ({EVERY_PRODUCT} if linear == "onednn" else {None})


def test_a_models_paths_reach_its_products_and_threads(monkeypatch):
    """A model whose `paths.linear` is "torch" sends no product to oneDNN, and one whose `paths.threads` is "single"
    splits no pass between threads."""
    monkeypatch.setattr(paths_resolution, "onednn_products", lambda: EVERY_PRODUCT)
    seen = []
    use_onednn, can_split = onednn_linear._use_onednn, cpu_threads.can_run_concurrently
    monkeypatch.setattr(onednn_linear, "_use_onednn", lambda *args: seen.append(("onednn", use_onednn(*args))) or False)
    for module in (lstm_sorted, char_cnn_fast):
        monkeypatch.setattr(module, "can_run_concurrently", lambda *a: seen.append(("threads", can_split(*a))) or False)
    model = random_model(small_config(paths={"linear": "torch", "threads": "single"})).eval()
    ids = encode(SENTENCES * 4)  # enough distinct words for two threads
    torch.set_num_threads(2)  # one thread never splits
    try:
        with torch.no_grad():
            model(**ids)
    finally:
        torch.set_num_threads(1)
    assert ("onednn", False) in seen and ("threads", False) in seen
    assert ("onednn", True) not in seen and ("threads", True) not in seen


@pytest.mark.parametrize("colliding_keys", [False, True], ids=["hashed", "every key equal: row-wise fallback"])
def test_distinct_rows_are_the_row_wise_unique(monkeypatch, colliding_keys):
    """The character CNN's repeated-word search gives the rows `torch.unique(dim=0)` gives (in another order) and
    each row's index among them, also when different rows share a key."""
    if colliding_keys:
        monkeypatch.setattr(char_cnn_fast, "word_keys", lambda rows: rows.new_zeros(rows.shape[:-1]))
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(0, 4, (60, 50), generator=generator)
    words[:, 6:] = 0  # short words of few letters: many near-duplicates
    rows = words[torch.randint(0, 60, (500,), generator=generator)]
    distinct, index = char_cnn_fast.distinct_rows(rows)
    expected = torch.unique(rows, dim=0)
    assert torch.equal(distinct[index], rows)
    assert len(distinct) == len(expected)
    assert torch.equal(torch.unique(distinct, dim=0), expected)


def test_word_keys_are_equal_exactly_for_equal_rows_and_lowercase_folds_ascii_capitals():
    """`character_rows.word_keys`, the one word key of the package: the same key for the same row, different keys for
    the distinct words here; with `lowercase`, 'The' and 'the' share one and 'Über' keeps its capital (not ASCII)."""
    words = ["the", "The", "THE", "cat", "Über", "über", "x" * 60, ""]
    rows = torch.from_numpy(words_to_char_ids(words))
    keys = word_keys(rows)
    assert torch.equal(word_keys(rows[[2, 0, 1]]), keys[[2, 0, 1]]) and torch.equal(word_keys(rows[None]), keys[None])
    assert len(set(keys.tolist())) == len(words)
    folded = word_keys(rows, lowercase=True).tolist()
    assert folded[0] == folded[1] == folded[2] and folded[4] != folded[5]
    assert len(set(folded)) == len(words) - 2


def test_the_first_layers_input_products_once_per_distinct_row_match_the_reference(monkeypatch, lstm_step):
    """At inference the first layer's input products are formed once per distinct token embedding (a repeated word,
    the boundaries, padding) and gathered: the layers and final states are the reference path's."""
    taken = []
    original = lstm_sorted._distinct_rows
    monkeypatch.setattr(lstm_sorted, "_distinct_rows", lambda x: taken.append(original(x)) or taken[-1])
    model = random_model(small_config())
    reference = reference_from(model)
    repeated = [["the", "cat", "and", "the", "dog", "and", "the", "cat"], ["the", "dog"], ["the"] * 11]
    batch = encode(repeated)
    with torch.no_grad():
        assert_same_outputs(run_fast(model, batch), reference(batch["input_ids"], batch["attention_mask"]), atol=1e-5)
    (found,) = taken
    assert found is not None and len(found[0]) == 7  # the, cat, and, dog, <S>, </S> and padding
    # Training reads every position's input (dropout, gradients): no search there.
    taken.clear()
    model.train()
    run_fast(model, batch)
    assert taken == []


def test_distinct_float_rows_compare_bits():
    """Rows are the same when their bits are: NaN equals NaN, -0.0 differs from 0.0, also when every row gets one key
    (the row-wise fallback); more distinct rows than `_MAX_DISTINCT_SHARE` of them give None."""
    x = torch.tensor(
        [[1.0, float("nan")], [0.0, 2.0], [1.0, float("nan")], [-0.0, 2.0], [0.0, 2.0], [1.0, float("nan")]]
    )
    for colliding_keys in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            if colliding_keys:
                patch.setattr(
                    char_cnn_fast, "word_keys", lambda rows: rows.new_zeros(rows.shape[:-1], dtype=torch.long)
                )
            distinct, index = lstm_sorted._distinct_rows(x.view(3, 2, 2))
        assert len(distinct) == 3
        assert torch.equal(distinct[index].view(torch.int32), x.view(3, 2, 2).view(torch.int32))
    assert lstm_sorted._distinct_rows(torch.randn(4, 2, 8)) is None
