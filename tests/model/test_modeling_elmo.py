"""`ElmoModel` against the original's outputs (the fixtures, with carried state) and a float64 reference: clipping, the
state of each row, stateless outputs, gradients, input checks, safetensors-only loading, `return_dict=False`.
"""

import re

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURE_SETS, FIXTURES, fixture_batches
from reference_elmo import bilm as reference_bilm
from transformers import AutoModel, AutoTokenizer

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.convert.original_format import load_original_elmo


def assert_close_to_tf(actual, expected):
    # The reference implementations' own rule; the ~1e-6 residual is float32 noise in the TF outputs.
    assert np.allclose(actual, expected, atol=1e-6, rtol=1e-5), f"max abs diff {np.abs(actual - expected).max()}"


@pytest.mark.parametrize("name", FIXTURE_SETS)
def test_fixture_top_layer_with_carried_state(name, converted_dirs):
    model = AutoModel.from_pretrained(converted_dirs[name]).eval()
    tokenizer = AutoTokenizer.from_pretrained(converted_dirs[name])
    state = None
    for i, (words, expected) in enumerate(fixture_batches(name)):
        batch = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(**batch, use_cache=True, state=state)
            stateless = model(**batch)
        state = out.state
        for k, sentence in enumerate(words):
            actual = out.last_hidden_state[k, 1 : len(sentence) + 1].numpy()
            assert_close_to_tf(actual, expected[k])
            if i == 0:  # only the first batch starts from the zero state the original started from
                assert_close_to_tf(stateless.last_hidden_state[k, 1 : len(sentence) + 1].numpy(), expected[k])
    assert i == 9


def test_char_cnn_matches_allennlp_token_embeddings():
    model = load_original_elmo(FIXTURES / "allennlp/options.json", FIXTURES / "allennlp/lm_weights.hdf5")
    words = (FIXTURES / "allennlp/vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(FIXTURES / "allennlp/elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][...]
    assert len(words) == expected.shape[0] == 458
    tokenizer = ElmoTokenizer()
    # As in AllenNLP's test: sentences of 50 words through the model, boundaries removed, from layer 0.
    chunks = [words[i : i + 50] for i in range(0, len(words), 50)]
    batch = tokenizer(chunks, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layer0 = model(**batch, output_hidden_states=True).hidden_states[0]
    P = model.config.projection_dim
    actual = np.concatenate([layer0[i, 1 : len(c) + 1, :P].numpy() for i, c in enumerate(chunks)])
    assert_close_to_tf(actual, expected)
    assert torch.equal(layer0[..., :P], layer0[..., P:])
    # <S>/</S> rows embed to the same vector wherever they stand.
    vocab_index = {w: i for i, w in enumerate(words)}
    assert_close_to_tf(layer0[0, 0, :P].numpy(), expected[vocab_index["<S>"]])
    assert_close_to_tf(layer0[0, len(chunks[0]) + 1, :P].numpy(), expected[vocab_index["</S>"]])


def small_config(**overrides):
    values = dict(
        char_embedding_dim=4,
        filters=[[1, 4], [2, 6], [3, 8]],
        n_highway=2,
        cell_dim=12,
        projection_dim=6,
        num_layers=3,
        cell_clip=0.5,
        proj_clip=0.3,
        dropout=0.0,
    )
    values.update(overrides)
    return ElmoConfig(**values)


def random_model(config, scale=2.0, dtype=torch.float64):
    """Random weights of magnitude `scale / sqrt(fan_in)`: large enough for both clips to trigger. Float64 by
    default so that comparisons with the float64 reference test the algorithm, not float32 rounding (which
    these large weights amplify)."""
    model = ElmoModel(config).to(dtype).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * scale / param.shape[-1] ** 0.5)
    return model


SENTENCES = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["Hi"],
    ["Über", "naïve", "日本語", "😀", "x" * 60],
    ["A", "b", "c"],
]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"use_skip_connections": False},
        {"activation": "tanh", "n_highway": 0},
        {"cell_clip": None, "proj_clip": None},
    ],
)
def test_matches_float64_reference_per_sentence(overrides):
    config = small_config(**overrides)
    model = random_model(config)
    batch = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True, use_cache=True)
    for k, sentence in enumerate(SENTENCES):
        n = len(sentence) + 2
        layers, (h, c) = reference_bilm(model.state_dict(), config, batch["input_ids"][k, :n].numpy())
        for actual, expected in zip(out.hidden_states, layers):
            np.testing.assert_allclose(actual[k, :n].numpy(), expected, atol=1e-10, rtol=0)
            assert torch.all(actual[k, n:] == 0), "padded positions must be exactly 0"
        np.testing.assert_allclose(out.state[0][:, k].numpy(), h, atol=1e-10, rtol=0)
        np.testing.assert_allclose(out.state[1][:, k].numpy(), c, atol=1e-10, rtol=0)
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])


def test_clipping_is_exercised():
    tokens = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    clipped = random_model(small_config())
    unclipped = ElmoModel(small_config(cell_clip=None, proj_clip=None)).eval()
    unclipped.load_state_dict(clipped.state_dict())
    with torch.no_grad():
        a, b = clipped(**tokens, use_cache=True), unclipped(**tokens, use_cache=True)
    assert a.state[1].abs().max() <= 0.5 < b.state[1].abs().max()
    assert a.state[0].abs().max() <= 0.3 < b.state[0].abs().max()


def test_state_continues_each_row():
    """Two chunks with the state carried equal the reference run on the chunks with its state carried."""
    config = small_config()
    model = random_model(config)
    tokenizer = ElmoTokenizer()
    first = tokenizer(SENTENCES[:2], is_split_into_words=True, padding=True, return_tensors="pt")
    second = tokenizer(SENTENCES[2:], is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        state = model(**first, use_cache=True).state
        out = model(**second, use_cache=True, state=state, output_hidden_states=True)
    for k in range(2):
        n0, n1 = len(SENTENCES[k]) + 2, len(SENTENCES[2 + k]) + 2
        _, ref_state = reference_bilm(model.state_dict(), config, first["input_ids"][k, :n0].numpy())
        layers, _ = reference_bilm(model.state_dict(), config, second["input_ids"][k, :n1].numpy(), ref_state)
        np.testing.assert_allclose(out.hidden_states[-1][k, :n1].numpy(), layers[-1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("source", ["fixture float32", "random float64"])
def test_stateless_output_independent_of_batch_and_history(source, converted_dirs):
    # Relative to each layer's largest value: float32 rounds each of the hundreds of products summed into a value, and
    # the recurrence carries it, to some 1e-7 of the magnitudes in any order of summation; a sentence that saw
    # another's state or padding differs by orders more.
    if source == "fixture float32":
        model, tolerance = AutoModel.from_pretrained(converted_dirs["allennlp"]).eval(), 1e-5
    else:
        model, tolerance = random_model(small_config()), 1e-12
    tokenizer = ElmoTokenizer()
    batch = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        together = model(**batch, output_hidden_states=True).hidden_states
        for k, sentence in enumerate(SENTENCES):
            alone = model(
                **tokenizer([sentence], is_split_into_words=True, return_tensors="pt"), output_hidden_states=True
            )
            n = len(sentence) + 2
            for layer_alone, layer_together in zip(alone.hidden_states, together):
                assert (layer_alone[0] - layer_together[k, :n]).abs().max() <= tolerance * layer_together.abs().max()
        again = model(**batch, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(together, again))


def test_gradients_flow_to_every_parameter():
    model = random_model(small_config(), scale=1.0, dtype=torch.float32).train()
    batch = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    model(**batch).last_hidden_state.square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_bad_inputs_give_clear_errors():
    model = random_model(small_config())
    good = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    ids, mask = good["input_ids"], good["attention_mask"]
    other_model = random_model(small_config(cell_dim=10))
    hidden, memory = model.initial_state(4)
    cases = [
        (dict(input_ids=ids[0]), "a single sentence needs a batch axis"),
        (dict(input_ids=ids[..., :20]), "must have shape (batch, words, 50), got (4, 9, 20)"),
        (dict(input_ids=ids.tolist()), "must be a torch.Tensor"),
        (dict(input_ids=ids.float()), "integer character ids, got dtype torch.float32"),
        (dict(input_ids=ids.bool()), "integer character ids, got dtype torch.bool"),
        (dict(input_ids=ids[:0]), "empty batch: shape (0, 9, 50)"),
        (dict(input_ids=ids[:, :0]), "has no positions; every sentence, even an empty one, needs its <S> and </S>"),
        (dict(input_ids=ids + 300), "must be in [0, 261], found values in [300, 561]"),
        (dict(input_ids=ids - 1), "found values in [-1, 260]"),
        (dict(input_ids=ids, attention_mask=mask[:, :-1]), "attention_mask must have shape (4, 9)"),
        (dict(input_ids=ids, attention_mask=mask.flip(1)), "right-padded"),
        (dict(input_ids=ids, input_word_ids=mask), "this model has no word embeddings"),
        (dict(input_ids=ids, state=model.initial_state(2)), "for this model and a batch of 4"),
        (dict(input_ids=ids, state="nope"), "state must be (hidden, memory)"),
        (dict(input_ids=ids, state=(hidden.tolist(), memory)), "state must be (hidden, memory)"),
        (dict(input_ids=ids, state=other_model.initial_state(4)), "of shapes ((3, 4, 12), (3, 4, 24))"),
        (dict(input_ids=ids, state=(hidden.float(), memory.float())), "state must be torch.float64"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            model(**kwargs)


def test_word_embedding_inputs_are_checked():
    model = random_model(small_config(input_word_vocab_size=7, input_word_dim=3))
    ids = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")["input_ids"]
    word_ids = torch.zeros(ids.shape[:2], dtype=torch.long)
    cases = [
        (dict(), "pass input_word_ids (4, 9) from its tokenizer, got NoneType"),
        (dict(input_word_ids=word_ids[:, :3]), "integer ids of shape (4, 9) (batch, words), got (4, 3)"),
        (dict(input_word_ids=word_ids.float()), "got (4, 9) of dtype torch.float32"),
        (dict(input_word_ids=word_ids + 7), "input_word_ids must be in [0, 6], found values in [7, 7]"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            model(ids, **kwargs)
    with torch.no_grad():
        assert model(ids, input_word_ids=word_ids + 6).last_hidden_state.isfinite().all()


def test_weights_load_from_safetensors_only_unless_asked(tmp_path):
    model = random_model(small_config(), dtype=torch.float32)
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    for load in (AutoModel.from_pretrained, ElmoModel.from_pretrained):
        with pytest.raises(
            OSError,
            match=r"only from safetensors by default, because a pickle checkpoint .* can run "
            r"code .* pass use_safetensors=False explicitly",
        ):
            load(tmp_path)
    with pytest.raises(OSError, match="only from safetensors"):
        ElmoModel.from_pretrained(tmp_path / "pytorch_model.bin", config=model.config)
    loaded = AutoModel.from_pretrained(tmp_path, use_safetensors=False)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_return_dict_false_gives_tuple():
    model = random_model(small_config())
    ids = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        as_tuple = model(ids, return_dict=False)
        as_output = model(ids)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], as_output.last_hidden_state)
