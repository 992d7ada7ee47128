"""`torch.export` of the task heads on their default inference path: batch size and lengths (each side's, for sentence
pairs and question answering) stay dynamic, and the exported program gives the eager model's logits on batches of
other sizes and lengths than the example's; `hf-elmo export --format onnx` of a folder saved as a head computes its
logits."""

import numpy as np
import pytest
import torch
from test_heads import tiny_model

from hf_elmo import (
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoTokenizer,
)
from hf_elmo.commands.cli import main as cli_main

FIRST = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog"]]
SECOND = [["a", "b"], ["p", "q", "r", "s", "t"]]
# Other batch sizes and lengths than the example's, each side's length changing on its own: one word per sentence
# (three positions), an empty sentence (two) where a head reads single sentences, a side longer than the other.
SINGLE_BATCHES = [
    [["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"], ["x"], ["y", "z"]],
    [["a"]],
    [[], ["b"], []],
]
PAIR_BATCHES = [
    ([["one", "two", "three", "four", "five", "six", "seven"], ["x"], ["y", "z"]], [["a"], ["b"] * 9, ["k"]]),
    ([["a"]], [["b"]]),
    ([["w"] * 3, ["v"]], [["p", "q"], ["r"] * 12]),
]

HEADS = {
    "sequence classification": (ElmoForSequenceClassification, {}),
    "sentence pairs (ESIM)": (ElmoForSequenceClassification, dict(sentence_pairs=True)),
    "token classification with a task BiLSTM": (
        ElmoForTokenClassification,
        dict(task_encoder_hidden_size=3, task_encoder_num_layers=2, elmo_placement=["input", "output"]),
    ),
    "question answering (BiDAF)": (ElmoForQuestionAnswering, {}),
}


def encode(first, second=None):
    batch = ElmoTokenizer()(first, second, is_split_into_words=True, padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask"] + (["pair_input_ids", "pair_attention_mask"] if second else [])
    return {name: batch[name] for name in names}


def logits(output):
    return [output[name] for name in ("logits", "start_logits", "end_logits") if name in output]


@pytest.mark.parametrize("head", list(HEADS))
def test_exported_head_gives_the_eager_logits_on_other_batch_sizes_and_lengths(head):
    cls, options = HEADS[head]
    model = tiny_model(cls, num_layers=1, **options).float()
    pairs = model.config.sentence_pairs or cls is ElmoForQuestionAnswering
    batch, length, pair_length = torch.export.Dim("batch"), torch.export.Dim("length"), torch.export.Dim("pair_length")
    axes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    if pairs:
        axes.update(pair_input_ids={0: batch, 1: pair_length}, pair_attention_mask={0: batch, 1: pair_length})
    example = encode(FIRST, SECOND if pairs else None)
    exported = torch.export.export(model, (), example, dynamic_shapes=axes).module()
    for sentences in PAIR_BATCHES if pairs else [(first, None) for first in SINGLE_BATCHES]:
        inputs = encode(*sentences)
        with torch.no_grad():
            expected, actual = logits(model(**inputs)), logits(exported(**inputs))
        # The exported program runs the reference biLM and one scan per LSTM direction, the eager model its fast
        # paths and a packed LSTM: the same sums in another order, each over a few dozen float32 products of O(1)
        # values, so a few units in the last place of O(1) logits. Padding is the dtype's lowest value in both.
        for got, want in zip(actual, expected, strict=True):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", list(HEADS))
def test_head_exported_from_a_batch_of_one_sentence_gives_the_eager_logits(head):
    """Without dynamic shapes the program keeps the example's: here a batch of one row, whose biLM start state has
    strides of its own (a one-row tensor's) that the scan's carry must not inherit."""
    cls, options = HEADS[head]
    model = tiny_model(cls, num_layers=1, **options).float()
    pairs = model.config.sentence_pairs or cls is ElmoForQuestionAnswering
    inputs = encode(FIRST[:1], SECOND[:1] if pairs else None)
    exported = torch.export.export(model, (), inputs).module()
    with torch.no_grad():
        expected, actual = logits(model(**inputs)), logits(exported(**inputs))
    for got, want in zip(actual, expected, strict=True):  # the tolerance of the test above, for the same reasons
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [ElmoForTokenClassification, ElmoForQuestionAnswering])
def test_onnx_of_a_head_folder_gives_the_heads_logits(cls, tmp_path):
    """`hf-elmo export --format onnx` of a folder saved as a task head: its logits, run by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = tiny_model(cls, num_layers=1).float()
    model.save_pretrained(tmp_path / "head")
    assert cli_main(f"export --format onnx --model {tmp_path / 'head'} --output-dir {tmp_path / 'onnx'}".split()) == 0
    session = ort.InferenceSession(str(tmp_path / "onnx/model.onnx"), providers=["CPUExecutionProvider"])
    pairs = cls is ElmoForQuestionAnswering
    outputs = ["start_logits", "end_logits"] if pairs else ["logits"]
    assert [o.name for o in session.get_outputs()] == outputs
    for sentences in PAIR_BATCHES if pairs else [(first, None) for first in SINGLE_BATCHES]:
        inputs = encode(*sentences)
        assert [i.name for i in session.get_inputs()] == list(inputs)
        got = session.run(None, {name: value.numpy() for name, value in inputs.items()})
        with torch.no_grad():
            expected = model(**inputs)
        for name, actual in zip(outputs, got, strict=True):
            np.testing.assert_allclose(actual, expected[name].numpy(), rtol=0, atol=1e-5)


def test_original_format_export_of_a_head_folder_says_the_head_is_left_out(tmp_path):
    from hf_elmo import ElmoModel
    from hf_elmo.convert.from_original import convert
    from hf_elmo.convert.to_original import export

    model = tiny_model(ElmoForTokenClassification, num_layers=1).float()
    model.save_pretrained(tmp_path / "tagger")
    with pytest.warns(UserWarning, match=r"the task head \(ElmoForTokenClassification\) is not exported, its biLM is"):
        export(tmp_path / "tagger", tmp_path / "original")
    convert(tmp_path / "original/options.json", tmp_path / "original/weights.hdf5", tmp_path / "back")
    batch = encode(FIRST)
    with torch.no_grad():  # the same biLM (the converted one adds TensorFlow's forget bias at run time)
        expected = model.elmo.eval()(**batch, output_hidden_states=True).hidden_states
        exported = ElmoModel.from_pretrained(tmp_path / "back").eval()(**batch, output_hidden_states=True).hidden_states
    for layer, value in zip(expected, exported):
        torch.testing.assert_close(value, layer, rtol=1e-5, atol=1e-6)
