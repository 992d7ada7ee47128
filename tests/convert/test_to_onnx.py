"""`torch.export` of the default inference path and `hf-elmo export --format onnx`, run by onnxruntime."""

import numpy as np
import pytest
import torch
from conftest import FIXTURE_SETS, fixture_batches
from transformers import AutoTokenizer

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main

TINY = dict(
    char_embedding_dim=4,
    filters=[[1, 4], [2, 4]],
    n_highway=1,
    cell_dim=8,
    projection_dim=4,
    num_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)


def encode(sentences, **kwargs):
    batch = ElmoTokenizer()(sentences, padding=True, return_tensors="pt", **kwargs)
    return {name: batch[name] for name in ("input_ids", "attention_mask")}


def test_torch_export_of_the_default_path_keeps_batch_and_length_dynamic():
    model = ElmoModel(ElmoConfig(**TINY, output_hidden_states=True)).eval()
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    axes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    exported = torch.export.export(model, (), encode(["the cat sat on the mat", "a dog"]), dynamic_shapes=axes)
    # Other batch sizes and lengths than the traced ones, rows of different lengths: the same as the eager model.
    for sentences in (["one two three four five six seven eight nine ten", "x", "y z"], ["a"]):
        inputs = encode(sentences)
        with torch.no_grad():
            expected = model(**inputs).hidden_states
            actual = exported.module()(**inputs).hidden_states
        for got, want in zip(actual, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.fixture(scope="module", params=list(FIXTURE_SETS))
def exported(request, converted_dirs, tmp_path_factory):
    """Each fixture model exported by the command, the bilm-tf one with the LSTM state as inputs and outputs."""
    ort = pytest.importorskip("onnxruntime")  # in the test extra, with onnx and onnxscript
    name = request.param
    with_state = name == "bilm-tf"
    output = tmp_path_factory.mktemp("onnx") / name
    command = f"export --format onnx --model {converted_dirs[name]} --output-dir {output}"
    assert cli_main((command + (" --with-state" if with_state else "")).split()) == 0
    session = ort.InferenceSession(str(output / "model.onnx"), providers=["CPUExecutionProvider"])
    return name, with_state, session, ElmoModel.from_pretrained(converted_dirs[name]).eval()


def test_onnx_inputs_outputs_and_dynamic_axes(exported):
    _, with_state, session, model = exported
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name: o.shape for o in session.get_outputs()}
    config = model.config
    expected_inputs = {
        "input_ids": ["batch", "length", config.max_characters_per_token],
        "attention_mask": ["batch", "length"],
    }
    width = 2 * config.projection_dim
    expected_outputs = {
        "last_hidden_state": ["batch", "length", width],
        "hidden_states": [config.num_layers + 1, "batch", "length", width],
    }
    if with_state:
        expected_inputs.update(
            state_hidden=[config.num_layers, "batch", 2 * config.projection_dim],
            state_memory=[config.num_layers, "batch", 2 * config.cell_dim],
        )
        expected_outputs.update(
            final_state_hidden=expected_inputs["state_hidden"], final_state_memory=expected_inputs["state_memory"]
        )
    assert inputs == expected_inputs
    assert outputs == expected_outputs
    # onnxruntime holds every input to its declared dtype and fixed sizes (docs/export.md: what is checked where).
    feed = {key: value.numpy() for key, value in encode(["a b"]).items()}
    if with_state:
        feed.update(state_hidden=model.initial_state(1)[0].numpy(), state_memory=model.initial_state(1)[1].numpy())
    with pytest.raises(Exception, match=r"(?s)input: input_ids.*index: 2 Got: 49 Expected: 50"):
        session.run(None, {**feed, "input_ids": feed["input_ids"][..., :49]})
    with pytest.raises(Exception, match=r"Unexpected input data type.*int32.*expected: \(tensor\(int64\)\)"):
        session.run(None, {**feed, "attention_mask": feed["attention_mask"].astype(np.int32)})
    too_high = feed["input_ids"].copy()
    too_high[0, 1, 3] = config.n_characters
    with pytest.raises(Exception, match=rf"indices element out of data bounds, idx={config.n_characters} must be"):
        session.run(None, {**feed, "input_ids": too_high})


def test_onnxruntime_reproduces_pytorch_and_the_original(exported):
    name, with_state, session, model = exported
    state = model.initial_state(3)
    for words, top_layers in fixture_batches(name):
        inputs = encode(words, is_split_into_words=True)
        feed = {key: value.numpy() for key, value in inputs.items()}
        if with_state:  # carried from batch to batch, as the original computed the fixture's layers
            feed.update(state_hidden=state[0].numpy(), state_memory=state[1].numpy())
        got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        with torch.no_grad():
            out = model(**inputs, state=state if with_state else None, use_cache=True, output_hidden_states=True)
        np.testing.assert_allclose(got["hidden_states"], torch.stack(out.hidden_states).numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(got["last_hidden_state"], out.last_hidden_state.numpy(), rtol=0, atol=1e-5)
        if with_state:
            np.testing.assert_allclose(got["final_state_hidden"], out.state[0].numpy(), rtol=0, atol=1e-5)
            np.testing.assert_allclose(got["final_state_memory"], out.state[1].numpy(), rtol=0, atol=1e-5)
            state = out.state
            for k, sentence in enumerate(words):  # the original's top layer (bilm-tf's own outputs)
                actual = got["last_hidden_state"][k, 1 : len(sentence) + 1]
                np.testing.assert_allclose(actual, top_layers[k], rtol=1e-5, atol=1e-5)


def test_onnx_of_an_elmoformanylangs_model_gives_their_embedders_numbers(tmp_path):
    """A model with word embeddings and a character vocabulary: `input_word_ids` is an input of the graph."""
    ort = pytest.importorskip("onnxruntime")
    from test_elmoformanylangs import MODEL_DIR, SENTENCES, assert_their_numbers, convert_args, their_embedder_outputs

    assert cli_main(convert_args(MODEL_DIR, tmp_path / "M")) == 0
    assert cli_main(f"export --format onnx --model {tmp_path / 'M'} --output-dir {tmp_path / 'onnx'}".split()) == 0
    session = ort.InferenceSession(str(tmp_path / "onnx/model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "input_word_ids"]
    batch = AutoTokenizer.from_pretrained(tmp_path / "M")(
        SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt"
    )
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    (layers,) = session.run(["hidden_states"], feed)
    with torch.no_grad():
        expected = ElmoModel.from_pretrained(tmp_path / "M").eval()(**batch, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(layers, torch.stack(expected).numpy(), rtol=0, atol=1e-5)
    first, _ = their_embedder_outputs()
    for (output_layer, k), theirs in first.items():
        words = layers[:, k, 1 : len(SENTENCES[k]) + 1].astype(np.float64)
        assert_their_numbers(words.mean(axis=0) if output_layer == -1 else words[output_layer], theirs)


def test_torch_compile_gives_the_eager_models_layers():
    # Compiled, the model runs the reference computation (the fast path compiled gave other numbers).
    model = ElmoModel(ElmoConfig(**{**TINY, "num_layers": 1}, output_hidden_states=True)).eval()
    inputs = encode(["the cat sat", "a"])
    torch._dynamo.reset()
    with torch.inference_mode():
        compiled = torch.compile(model)(**inputs).hidden_states
        expected = model(**inputs).hidden_states
    for got, want in zip(compiled, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
