"""The exported graph's character encoder (each distinct word once, windows up to the longest span), the checks
`hf-elmo export --format onnx` runs before writing, `--quantize int8`, and folders of 16-bit dtypes."""

import json

import numpy as np
import pytest
import torch
from conftest import fixture_batches

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert import to_onnx as onnx_export
from hf_elmo.convert.to_onnx import DistinctWordsCharacterEncoder, layer_cosines

ort = pytest.importorskip("onnxruntime")  # in the test extra, with onnx and onnxscript

CONFIG = dict(
    char_embedding_dim=4,
    filters=[[1, 4], [2, 4], [3, 8], [5, 8]],
    n_highway=1,
    cell_dim=8,
    projection_dim=4,
    num_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)
LONGEST = "x" * 60  # cut to the row's 50 slots: a word whose final run is one slot
# Repeated words, a one-letter word, a word filling its row, words whose spans end near the row's end.
SENTENCES = [
    ["the", "cat", "sat", "on", "the", "mat", "."],
    ["a", LONGEST, "the"],
    ["y" * 45, "z" * 47, "b"],
    ["the"],
]


def random_model(**options) -> ElmoModel:
    torch.manual_seed(0)
    model = ElmoModel(ElmoConfig(**{**CONFIG, **options}, output_hidden_states=True)).eval()
    with torch.no_grad():
        for param in model.parameters():  # values of order 1 to 10, the padding characters' windows winning some maxima
            param.copy_(torch.randn(param.shape) / param.shape[-1] ** 0.5)
    return model


def encode(sentences):
    batch = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    return {name: batch[name] for name in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("sentences", [SENTENCES, SENTENCES[:1], [["a"]]], ids=["mixed", "short words", "one word"])
def test_distinct_words_encoder_computes_the_reference_encoder(sentences):
    model = random_model()
    char_ids = encode(sentences)["input_ids"]
    with torch.no_grad():
        expected = model.char_encoder.double()(char_ids)
        actual = DistinctWordsCharacterEncoder(model.char_encoder.float())(char_ids)
    # float32 (unit roundoff 6e-8) sums of at most 5 x 4 products per window, then highway and projection of 24
    # terms each, terms as large as the largest output: 24 terms x 3 layers of rounding, about 1e-5 of it at most
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=1e-5 * float(expected.abs().max()))


def export(folder, output, *options):
    command = f"export --format onnx --model {folder} --output-dir {output}".split() + list(options)
    assert cli_main(command) == 0


def run_graph(folder, sentences):
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = {name: value.numpy() for name, value in encode(sentences).items()}
    return session.run(["hidden_states"], feed)[0]


def test_exported_graph_gives_the_models_layers_on_long_repeated_and_single_words(tmp_path):
    model = random_model()
    model.save_pretrained(tmp_path / "model")
    export(tmp_path / "model", tmp_path / "onnx")
    for sentences in (SENTENCES, [["a"]], SENTENCES[2:3]):
        with torch.no_grad():
            expected = torch.stack(model(**encode(sentences)).hidden_states).numpy()
        np.testing.assert_allclose(run_graph(tmp_path / "onnx", sentences), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_16_bit_folder_exports_a_float32_graph_that_onnxruntime_runs(dtype, tmp_path):
    model = random_model().to(getattr(torch, dtype))
    model.save_pretrained(tmp_path / "model")
    assert json.loads((tmp_path / "model/config.json").read_text())["dtype"] == dtype
    export(tmp_path / "model", tmp_path / "onnx")
    float32 = ElmoModel.from_pretrained(tmp_path / "model").float().eval()
    with torch.no_grad():
        expected = torch.stack(float32(**encode(SENTENCES)).hidden_states).numpy()
    np.testing.assert_allclose(run_graph(tmp_path / "onnx", SENTENCES), expected, rtol=0, atol=1e-5)


def test_int8_export_keeps_every_layer_of_the_fixture_at_cosine_0_999(converted_dirs, tmp_path, capsys):
    folder = converted_dirs["allennlp"]
    export(folder, tmp_path / "int8", "--quantize", "int8")
    printed = capsys.readouterr().out
    assert "model.onnx (int8) written" in printed and "mean cosine to float32 per layer" in printed
    session = ort.InferenceSession(str(tmp_path / "int8/model.onnx"), providers=["CPUExecutionProvider"])
    assert {"DynamicQuantizeMatMul", "MatMulInteger"} <= {
        node.op_type for node in _all_nodes(tmp_path / "int8/model.onnx")
    }
    model = ElmoModel.from_pretrained(folder).eval()
    per_batch = []
    for words, _ in fixture_batches("allennlp"):
        inputs = encode(words)
        (layers,) = session.run(["hidden_states"], {name: value.numpy() for name, value in inputs.items()})
        with torch.no_grad():
            expected = torch.stack(model(**inputs, output_hidden_states=True).hidden_states).numpy()
        per_batch.append(layer_cosines(expected, layers, inputs["attention_mask"].bool().numpy()))
    per_layer = np.mean(per_batch, axis=0)
    assert len(per_layer) == model.config.num_layers + 1
    assert (per_layer >= 0.999).all(), per_layer


def _all_nodes(path):
    """The nodes of an ONNX file's graph and of the graphs inside its nodes (the time loops' bodies)."""
    import onnx

    graphs, nodes = [onnx.load(str(path)).graph], []
    while graphs:
        graph = graphs.pop()
        nodes += graph.node
        graphs += [attribute.g for node in graph.node for attribute in node.attribute if attribute.g.node]
    return nodes


def test_int8_below_the_least_cosine_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    random_model().save_pretrained(tmp_path / "model")
    monkeypatch.setattr(onnx_export, "MIN_INT8_COSINE", 1.0 + 1e-9)  # no int8 graph reaches it
    with pytest.raises(ValueError, match=r"^--quantize int8: the int8 graph's vectors are too far from float32's"):
        onnx_export.export_onnx(tmp_path / "model", tmp_path / "int8", quantize="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_quantize_is_refused_for_heads_and_other_formats(tmp_path, capsys):
    from test_heads import tiny_model

    from hf_elmo import ElmoForTokenClassification

    tiny_model(ElmoForTokenClassification, num_layers=1).save_pretrained(tmp_path / "tagger")
    assert (
        cli_main(
            f"export --format onnx --model {tmp_path / 'tagger'} --output-dir {tmp_path / 'o'} --quantize int8".split()
        )
        != 0
    )
    assert "--quantize: " in capsys.readouterr().err
    assert cli_main(f"export --model {tmp_path / 'tagger'} --output-dir {tmp_path / 'p'} --quantize int8".split()) != 0
    assert "--quantize: only --format onnx has int8 weights" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tagger"]


def test_a_graph_onnxruntime_cannot_run_is_not_written(tmp_path, monkeypatch):
    random_model().save_pretrained(tmp_path / "model")

    def broken_session(path):
        raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for MatMul(13)")

    monkeypatch.setattr(onnx_export, "_session", broken_session)
    with pytest.raises(ValueError, match=r"^model.onnx: onnxruntime cannot run the exported graph \(\[ONNXRun"):
        onnx_export.export_onnx(tmp_path / "model", tmp_path / "onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.fixture(scope="module")
def checked_session(tmp_path_factory):
    """A biLM exported with the state as inputs, opened through `CheckedOnnxSession`."""
    folder = tmp_path_factory.mktemp("checked")
    random_model().save_pretrained(folder / "model")
    export(folder / "model", folder / "onnx", "--with-state")
    return onnx_export.CheckedOnnxSession(folder / "onnx/model.onnx")


def test_checked_session_runs_a_good_feed_as_onnxruntime_does(checked_session):
    feed = {name: value.numpy() for name, value in encode(SENTENCES).items()}
    state = ElmoModel(checked_session.config).initial_state(len(SENTENCES))
    feed.update(state_hidden=state[0].numpy(), state_memory=state[1].numpy())
    for got, want in zip(checked_session.run(None, feed), checked_session.session.run(None, feed), strict=True):
        np.testing.assert_array_equal(got, want)


def _wrong(feed, name, change):
    feed = dict(feed)
    feed[name] = change(feed[name].copy())
    return feed


def _left_padded(mask):
    mask[1] = mask[1][::-1]
    return mask


def _too_high(ids):
    ids[0, 1, 3] = 100_000
    return ids


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda feed: {k: v for k, v in feed.items() if k != "attention_mask"}, r"missing \['attention_mask'\]"),
        (lambda feed: _wrong(feed, "input_ids", lambda ids: ids[..., :49]), r"input_ids must have shape \(batch"),
        (lambda feed: _wrong(feed, "input_ids", lambda ids: ids[:, :0]), r"input_ids is empty"),
        (lambda feed: _wrong(feed, "input_ids", _too_high), r"input_ids must be in \[0, 261\], found .* 100000\]"),
        (lambda feed: _wrong(feed, "attention_mask", _left_padded), r"every attention_mask row must be ones then"),
        (lambda feed: _wrong(feed, "attention_mask", lambda mask: mask[:2]), r"attention_mask must have shape \(4, "),
        (lambda feed: _wrong(feed, "state_hidden", lambda state: state[:, :2]), r"state must be .* got \(\(2, 2, 8\)"),
        (lambda feed: _wrong(feed, "input_ids", lambda ids: ids.tolist()), r"input_ids must be a numpy array"),
        (lambda feed: _wrong(feed, "input_ids", lambda ids: ids.astype(np.int32)), r"^input_ids must have dtype int64"),
        (
            lambda feed: _wrong(feed, "attention_mask", lambda m: m.astype(bool)),
            r"^attention_mask must have dtype int6",
        ),
        (lambda feed: _wrong(feed, "state_memory", lambda s: s.astype(np.float64)), r"^state_memory must have dtype f"),
    ],
    ids=[
        "missing",
        "49 characters",
        "no positions",
        "id out of range",
        "left padding",
        "rows",
        "state",
        "a list",
        "int32 ids",
        "bool mask",
        "float64 state",
    ],
)
def test_checked_session_names_the_wrong_input_in_one_line(checked_session, change, message):
    feed = {name: value.numpy() for name, value in encode(SENTENCES).items()}
    state = ElmoModel(checked_session.config).initial_state(len(SENTENCES))
    feed.update(state_hidden=state[0].numpy(), state_memory=state[1].numpy())
    with pytest.raises(ValueError, match=message) as raised:
        checked_session.run(None, change(feed))
    assert "\n" not in str(raised.value)
