"""Long inputs, values that overflow, arguments of the wrong type, damaged files and caches around the model: the
pipelines, the compiled loops' cache, the folder files transformers reads first, weights of another dtype,
`torch.export` from one sentence; each refused with one line naming the argument, file or size, or answered
correctly within bounded memory."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_heads import tiny_model
from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

import hf_elmo.pipelines_elmo as pipelines_elmo
from hf_elmo import ElmoConfig, ElmoForQuestionAnswering, ElmoForTokenClassification, ElmoModel, ElmoTokenizer
from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer
from hf_elmo.folder_files import cache_file_damage

BIO_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message.strip(), message
    return message


# --- the question-answering pipeline: a long question over a long context ------------------------------------------


@pytest.fixture(scope="module")
def qa():
    return pipeline(
        "elmo-question-answering", model=tiny_model(ElmoForQuestionAnswering).float(), tokenizer=ElmoTokenizer()
    )


def test_a_long_question_over_many_windows_runs_in_forwards_of_bounded_size(qa, monkeypatch):
    words = np.random.default_rng(0).integers(0, 10**6, size=1300).astype(str)  # no span repeats another's words
    question, context = " ".join(words[:300]) + " ?", " ".join(words[300:])
    arguments = dict(question=question, context=context, max_context_words=40, stride=10, top_k=5)
    whole = qa(**arguments)  # 33 windows, each 301 + 40 words with their boundaries: one forward under the default
    monkeypatch.setattr(pipelines_elmo, "POSITIONS_PER_FORWARD", 1000)
    sizes = []
    hook = qa.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(
            (len(kwargs["input_ids"]), kwargs["input_ids"].shape[1] + kwargs["pair_input_ids"].shape[1])
        ),
        with_kwargs=True,
    )
    try:
        bounded = qa(**arguments)
    finally:
        hook.remove()
    # The question (303 positions) is copied into each window of 42: two windows a forward fit in 1000 positions.
    assert [rows for rows, _ in sizes] == [2] * 16 + [1] and all(rows * positions <= 1000 for rows, positions in sizes)
    assert [(a["start"], a["end"], a["answer"]) for a in bounded] == [
        (a["start"], a["end"], a["answer"]) for a in whole
    ]
    # Each window's logits come from its own rows: a different padding changes the sums' order only.
    assert [a["score"] for a in bounded] == pytest.approx([a["score"] for a in whole], rel=1e-5)


def test_a_window_larger_than_the_bound_runs_alone(qa, monkeypatch):
    monkeypatch.setattr(pipelines_elmo, "POSITIONS_PER_FORWARD", 10)
    expected = qa(question="Who sat ?", context="The cat sat on the mat .", top_k=3)
    monkeypatch.undo()
    assert qa(question="Who sat ?", context="The cat sat on the mat .", top_k=3) == expected


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"top_k": 1e9}, r"^top_k must be an int, got 1000000000\.0$"),
        ({"top_k": 1.5}, r"^top_k must be an int, got 1\.5$"),
        ({"top_k": math.nan}, r"^top_k must be an int, got nan$"),
        ({"top_k": "3"}, r"^top_k must be an int, got '3'$"),
        ({"top_k": True}, r"^top_k must be an int, got True$"),
        ({"top_k": 0}, r"^top_k must be >= 1, got 0$"),
        ({"max_answer_len": 2.0}, r"^max_answer_len must be an int, got 2\.0$"),
        ({"max_context_words": "256"}, r"^max_context_words must be an int, got '256'$"),
        ({"stride": -1}, r"^stride must be >= 0, got -1$"),
        ({"handle_impossible_answer": "no"}, r"^handle_impossible_answer must be True or False, got 'no'$"),
    ],
)
def test_question_answering_arguments_of_the_wrong_type_are_named(qa, arguments, message):
    with pytest.raises(ValueError) as error:
        qa(question="Who sat ?", context="The cat sat .", **arguments)
    assert re.search(message, one_line(error))


@pytest.fixture(scope="module")
def tagger(converted_dirs):
    torch.manual_seed(3)
    model = AutoModelForTokenClassification.from_pretrained(converted_dirs["allennlp"], id2label=BIO_LABELS).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(std=1.0)
    return pipeline(
        "token-classification", model=model, tokenizer=AutoTokenizer.from_pretrained(converted_dirs["allennlp"])
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"aggregation_strategy": 123}, r"^aggregation_strategy must be one of \['none', 'simple', .*\], got 123$"),
        ({"aggregation_strategy": "largest"}, r"^aggregation_strategy must be one of .*, got 'largest'$"),
        ({"ignore_labels": "PER"}, r"^ignore_labels must be a list of labels \(str\), got 'PER'$"),
        ({"ignore_labels": ["O", 0]}, r"^ignore_labels must be a list of labels \(str\), got \['O', 0\]$"),
        ({"delimiter": 0, "is_split_into_words": True}, r"^delimiter must be a str \(what joins the words\), got int$"),
    ],
)
def test_token_classification_arguments_of_the_wrong_type_are_named(tagger, arguments, message):
    text = ["Ada", "met", "Charles", "."] if arguments.get("is_split_into_words") else "Ada met Charles ."
    with pytest.raises(ValueError) as error:
        tagger(text, **arguments)
    assert re.search(message, one_line(error))


def test_an_empty_delimiter_joins_the_words_without_one(tagger):
    words = ["Ada", "met", "Charles", "Babbage", "."]
    (result,) = tagger(words, is_split_into_words=True, delimiter="", ignore_labels=[])
    assert [(r["start"], r["end"]) for r in result] == [(0, 3), (3, 6), (6, 13), (13, 20), (20, 21)]
    assert all("".join(words)[r["start"] : r["end"]] == r["word"] for r in result)


def test_ignore_labels_leave_out_whole_labels(tagger):
    text = "Ada Lovelace met Charles Babbage in London ."
    everything = tagger(text, ignore_labels=[])
    assert {r["entity"] for r in everything} - {"O"}  # some word is tagged with another label
    kept = tagger(text, ignore_labels=["O", "B-PER"])
    assert kept == [r for r in everything if r["entity"] not in ("O", "B-PER")]


# --- the compiled CPU loops' cache ---------------------------------------------------------------------------------

_LOAD_THE_LOOPS = """
import json, warnings
import torch
from hf_elmo import cpu_kernels
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    built = cpu_kernels.available(torch.zeros(1))
print(json.dumps([built, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]]))
"""


def load_the_loops(cache: Path) -> tuple[bool, list[str]]:
    """Whether a fresh process with the cache folder `cache` loads the compiled loops, and its RuntimeWarnings."""
    env = {**os.environ, "HF_ELMO_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-c", _LOAD_THE_LOOPS], env=env, capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # a bus error loading a cut library: -7
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def built_loops(tmp_path_factory):
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler here")
    cache = tmp_path_factory.mktemp("kernels")
    assert load_the_loops(cache) == [True, []]
    return cache


def flip_a_byte_in_the_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, what",
    [
        (lambda path: os.truncate(path, path.stat().st_size // 2), r"[\d,]+ bytes where .*\.so\.record\.json records"),
        (flip_a_byte_in_the_middle, r"its SHA-256 differs from the one .*\.so\.record\.json records"),
    ],
    ids=["cut short", "changed"],
)
def test_a_damaged_build_of_the_compiled_loops_is_built_again_not_loaded(built_loops, tmp_path, damage, what):
    cache = tmp_path / "cache"
    shutil.copytree(built_loops, cache)
    (library,) = (cache / "kernels").glob("*.so")
    damage(library)
    built, warned = load_the_loops(cache)
    assert built and len(warned) == 1, warned
    assert re.fullmatch(
        rf"{re.escape(str(library))}: a damaged build of the compiled CPU loops \({what}.*\): built again", warned[0]
    )
    assert cache_file_damage(library) is None


# --- files that transformers and sentence-transformers read first; weights of another kind --------------------------


@pytest.fixture
def folder(converted_dirs, tmp_path):
    copy = tmp_path / "M"
    shutil.copytree(converted_dirs["allennlp"], copy)
    return copy


@pytest.mark.parametrize(
    "content, what",
    [
        ('{"model_max_length": 5', r"is not valid JSON \(line 1, column 23: Expecting ',' delimiter\)"),
        ("", r"is not valid JSON \(line 1, column 1: Expecting value\)"),
        ("[1, 2]", r"holds a JSON list, expected an object"),
        (b"\xff\xfe{}", r"cannot read tokenizer_config\.json \(.*can't decode byte 0xff.*\)"),
    ],
    ids=["cut", "empty", "a list", "not UTF-8"],
)
def test_a_damaged_tokenizer_config_is_named_before_transformers_reads_it(folder, content, what):
    config = folder / "tokenizer_config.json"
    config.write_bytes(content) if isinstance(content, bytes) else config.write_text(content)
    for load in (ElmoTokenizer.from_pretrained, elmo_sentence_transformer):
        with pytest.raises(ValueError) as error:
            load(str(folder))
        assert re.fullmatch(rf"{re.escape(str(folder))}: (tokenizer_config\.json )?{what}", one_line(error))


@pytest.mark.parametrize("dtype, name", [(torch.int64, "I64"), (torch.int32, "I32"), (torch.bool, "BOOL")])
def test_weights_of_an_integer_or_bool_dtype_are_refused_not_cast(folder, dtype, name):
    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.forward_layers.0.input_linearity.weight"] = torch.ones(256, 16, dtype=dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as error:
        ElmoModel.from_pretrained(folder)
    assert one_line(error) == (
        f"{folder}: the weights (model.safetensors) hold 'encoder.forward_layers.0.input_linearity.weight' of dtype "
        f"{name}: ELMo's weights are floating-point numbers (an integer or bool tensor would be cast to them silently)"
    )
    config = ElmoConfig.from_pretrained(folder)
    with pytest.raises(ValueError) as error:
        ElmoModel.from_pretrained(None, config=config, state_dict=tensors)
    assert re.fullmatch(
        r"from_pretrained\(None, \.\.\.\): state_dict holds '.*input_linearity\.weight' of dtype "
        rf"{str(dtype).removeprefix('torch.')}: .*",
        one_line(error),
    )


# --- torch.export from a one-sentence example -----------------------------------------------------------------------

ONE_SENTENCE_BATCHES = [[["one", "two", "three", "four", "five", "six", "seven"]], [["a"]], [[]], [["x", "y"]]]
EXPORTED = {
    "ElmoModel": (ElmoModel, {}, "last_hidden_state"),
    "token classification with a task BiLSTM": (
        ElmoForTokenClassification,
        dict(task_encoder_hidden_size=3, task_encoder_num_layers=2, elmo_placement=["input", "output"]),
        "logits",
    ),
}


def one_sentence(words):
    batch = ElmoTokenizer()(words, is_split_into_words=True, return_tensors="pt")
    return {name: batch[name] for name in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("name", list(EXPORTED))
def test_export_from_one_sentence_with_only_the_length_dynamic_gives_the_eager_outputs(name):
    cls, options, output = EXPORTED[name]
    model = tiny_model(cls, num_layers=1, **options).float()
    length = torch.export.Dim("length")
    axes = {"input_ids": {1: length}, "attention_mask": {1: length}}
    exported = torch.export.export(model, (), one_sentence(["the", "cat", "sat"]), dynamic_shapes=axes).module()
    for words in ONE_SENTENCE_BATCHES:
        inputs = one_sentence(words)
        with torch.no_grad():
            expected, actual = model(**inputs)[output], exported(**inputs)[output]
        # As in test_export_heads: the reference paths and one scan per direction against the eager fast paths, the
        # same sums of a few dozen float32 products of O(1) values in another order.
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_dynamic_batch_from_one_sentence_is_pytorchs_error_naming_the_dimension():
    model = tiny_model(ElmoModel, num_layers=1).float()
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    axes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    with pytest.raises(torch._dynamo.exc.UserError, match=r"marked batch as dynamic but your code specialized it"):
        torch.export.export(model, (), one_sentence(["the", "cat", "sat"]), dynamic_shapes=axes)
