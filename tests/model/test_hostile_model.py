"""The model, its configuration and its tokenizer given careless or hostile input through Python (folders,
configurations, inputs, paths, tracing): a `ValueError` naming the problem, nothing changed; folders without
`forget_bias` and batches without labels read as they must be.
"""

import json

import pytest
from hostile import (
    TINY,
    check_api_refusal,
    edit_json,
    edit_weights,
    load,
    load_with,
    mask_over_padding,
    padded_batch,
    run_bfloat16,
    run_model,
    shards_outside,
    traced,
    warm_state_of_shapes,
    with_ids_as,
    with_labels,
    with_nan_state,
    with_pair,
    write,
)

from hf_elmo import ElmoConfig, ElmoTokenizer

API_CASES = {
    "attention_mask of 1 over padding rows": (
        [],
        mask_over_padding,
        r"attention_mask is 1 at row 1, position 3, whose input_ids are all zeros \(padding\)",
    ),
    "from_pretrained with a missing tensor": (
        [edit_weights("M", lambda t: t.pop("char_encoder.highways.1.bias"))],
        load("ElmoModel", "M"),
        r"M: the weights \(model\.safetensors\) lack 1 tensor\(s\) .*'char_encoder\.highways\.1\.bias' \(248,\)",
    ),
    "a task head from a folder with a missing biLM tensor": (
        [edit_weights("M", lambda t: t.pop("encoder.backward_layers.0.state_linearity.bias"))],
        load("ElmoForTokenClassification", "M"),
        r"lack 1 tensor\(s\) .*'encoder\.backward_layers\.0\.state_linearity\.bias'",
    ),
    "a saved biLM without its softmax": (
        [edit_weights("B", lambda t: [t.pop(k) for k in ("softmax.weight", "softmax.bias")])],
        load("ElmoForBiLM", "B"),
        r"B: the weights \(model\.safetensors\) lack 2 tensor\(s\) .*'softmax\.",
    ),
    "from_pretrained of weights holding a NaN": (
        [edit_weights("M", lambda t: t["encoder.forward_layers.0.state_linearity.bias"].__setitem__(3, float("nan")))],
        load("ElmoModel", "M"),
        r"M: the weights hold NaN or infinite values in 'encoder\.forward_layers\.0\.state_linearity\.bias'",
    ),
    "from_pretrained with a NaN in config.json": (
        [edit_json("M/config.json", cell_clip=float("nan"))],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.cell_clip must be finite, got nan\.",
    ),
    "the tokenizer on raw text with a 10 MB word": (
        [],
        lambda root: ElmoTokenizer()("The cat " + "a" * 10**7),
        r"^the text has more than 100,000 characters without whitespace \(from character 8\)",
    ),
    "ElmoModel from the folder of another model type": (
        [edit_json("M/config.json", model_type="bert")],
        load("ElmoModel", "M"),
        r"model_type 'bert', not 'elmo'",
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "ElmoConfig num_labels 10**9": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=10**9),
        r"^ElmoConfig\.num_labels must be an int from 1 to 100,000, got 1000000000\.$",
    ),
    "ElmoConfig num_labels 0": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=0),
        r"^ElmoConfig\.num_labels .* got 0\.$",
    ),
    "ElmoConfig num_labels -1": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=-1),
        r"^ElmoConfig\.num_labels .* got -1\.$",
    ),
    "num_labels set on a config": (
        [],
        lambda root: setattr(ElmoConfig(**TINY), "num_labels", 10**9),
        r"^ElmoConfig\.num_labels must be an int",
    ),
    "a classifier from a config.json with num_labels 10**9": (
        [edit_json("M/config.json", num_labels=10**9)],
        load("ElmoForSequenceClassification", "M"),
        r"M: config\.json: ElmoConfig\.num_labels must be an int from 1 to 100,000, got 1000000000\.$",
    ),
    "ElmoConfig: a field of the wrong type": (
        [],
        lambda root: ElmoConfig(**{**TINY, "cell_dim": "8"}),
        r"^ElmoConfig\.cell_dim must be int, got '8'\.$",
    ),
    "ElmoConfig: a field set to the wrong type": (
        [],
        lambda root: setattr(ElmoConfig(**TINY), "filters", 3),
        r"^ElmoConfig\.filters must be list\[list\[int\]\]",
    ),
    "ElmoConfig: a value its validator refuses": (
        [],
        lambda root: ElmoConfig(**TINY, dropout=1.5),
        r"^ElmoConfig\.dropout must be in \[0, 1\), got 1\.5\.$",
    ),
    "ElmoModel from a config.json that is a bare number": (
        [write("M/config.json", "5")],
        load("ElmoModel", "M"),
        r"M/config\.json: expected a JSON object \(configuration fields\), got int$",
    ),
    "ElmoModel from a config.json with torch_dtype float8": (
        [edit_json("M/config.json", torch_dtype="float8_e4m3fn")],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.torch_dtype must name a torch dtype such as 'float32', got 'float8_e4m3fn'; the "
        r"model computes in float32, float16, bfloat16, float64\.$",
    ),
    "ElmoModel from a shard index that points outside the folder": (
        [shards_outside],
        load("ElmoModel", "M"),
        r"M: model\.safetensors\.index\.json names the shard '\.\./x\.safetensors', outside the model folder",
    ),
    "int8 input_ids": (
        [],
        run_model(with_ids_as("int8")),
        r"^input_ids of dtype torch\.int8 cannot hold this model's character ids \(up to 261\); use torch\.int64",
    ),
    "uint8 input_ids": ([], run_model(with_ids_as("uint8")), r"^input_ids of dtype torch\.uint8 cannot hold"),
    "state with a NaN": ([], run_model(with_nan_state), r"^state holds NaN or infinite values"),
    "input_ids on the meta device": (
        [],
        run_model(with_ids_as("meta")),
        r"^input_ids is on the meta device, which holds shapes but no values",
    ),
    "a NaN regression label": (
        [],
        run_model(with_labels(1.0, float("nan")), "ElmoForSequenceClassification", num_labels=1),
        r"^labels hold NaN or infinite values \(regression\): the loss would be NaN\.$",
    ),
    "a NaN multi-label label": (
        [],
        run_model(
            with_labels([1.0, float("nan")], [0.0, 1.0]),
            "ElmoForSequenceClassification",
            num_labels=2,
            problem_type="multi_label_classification",
        ),
        r"^labels hold NaN or infinite values \(multi_label_classification\)",
    ),
    "ElmoTokenizer from a folder whose tokenizer_class is BertTokenizer": (
        [edit_json("M/tokenizer_config.json", tokenizer_class="BertTokenizer")],
        lambda root: ElmoTokenizer.from_pretrained(root / "M"),
        r"M: tokenizer_config\.json names tokenizer_class 'BertTokenizer', expected 'ElmoTokenizer'",
    ),
    # --- sentence pairs and question answering ---
    "a pair of one sentence and a batch": (
        [],
        lambda root: ElmoTokenizer()("A man sleeps .", ["Someone rests ."]),
        r"^text and text_pair must both be one sentence or both a batch of sentences, got one sentence and a batch$",
    ),
    "pairs of batches of different lengths": (
        [],
        lambda root: ElmoTokenizer()(["A man sleeps .", "Hi"], ["Someone rests ."]),
        r"^text has 2 sentences but text_pair has 1: each sentence needs its pair$",
    ),
    "truncation only_second without a pair": (
        [],
        lambda root: ElmoTokenizer()("A man sleeps .", truncation="only_second", max_length=3),
        r"^truncation='only_second' needs sequence pairs: pass text_pair$",
    ),
    "a pair whose second sentence has no words": (
        [],
        run_model(with_pair(["Someone rests .", ""]), "ElmoForSequenceClassification", sentence_pairs=True),
        r"^pair_input_ids row 1 has no words: each side of a sentence pair needs at least one word$",
    ),
    "a pair classifier given more second sentences than first": (
        [],
        run_model(with_pair(["a", "b", "c"]), "ElmoForSequenceClassification", sentence_pairs=True),
        r"^input_ids has 2 rows but pair_input_ids has 3: each sentence needs its pair$",
    ),
    "a pair classifier without the second sentences": (
        [],
        run_model(lambda batch, model: batch, "ElmoForSequenceClassification", sentence_pairs=True),
        r"^ElmoForSequenceClassification reads sentence pairs: pass pair_input_ids",
    ),
    "second sentences given to a single-sentence classifier": (
        [],
        run_model(with_pair(["a", "b"]), "ElmoForSequenceClassification"),
        r"^pair_input_ids given to a single-sentence classifier: build a pair classifier with sentence_pairs=True",
    ),
    "cached layers of the second sentences of the wrong shape": (
        [],
        run_model(
            with_pair(["a b", "c"], pair_elmo_hidden_states=[[[[0.0] * 32]] * 4] * 2), "ElmoForQuestionAnswering"
        ),
        r"^the second sentences \(pair_\.\.\.\): elmo_hidden_states must have shape \(2, 4, 3, 32\)",
    ),
    "an answer span outside the context": (
        [],
        run_model(with_pair(["a b c", "d"], start_positions=[1, 1], end_positions=[3, 2]), "ElmoForQuestionAnswering"),
        r"^end_positions\[1\] = 2 is outside the context: its words are at positions 1 to 1 of pair_input_ids "
        r"\(0: no answer\)$",
    ),
    "an answer span that ends before it starts": (
        [],
        run_model(with_pair(["a b c", "d"], start_positions=[3, 1], end_positions=[2, 1]), "ElmoForQuestionAnswering"),
        r"^start_positions\[0\] = 3 comes after end_positions\[0\] = 2: an answer ends at or after its start$",
    ),
    "float answer positions": (
        [],
        run_model(with_pair(["a", "b"], start_positions=[1.0, 1.0], end_positions=[1, 1]), "ElmoForQuestionAnswering"),
        r"^start_positions must be integer positions of shape \(2,\) \(one per question\), got torch\.float32 \(2,\)$",
    ),
    # --- the paths (config.paths, ElmoPaths) ---
    "from_pretrained with paths= naming no path": (
        [],
        lambda root: load_with(root / "M", paths={"char_cnn": "fused"}),
        r"^paths\.char_cnn must be one of \('auto', 'reference', 'distinct_words', 'every_word'\), got 'fused'\.$",
    ),
    "config.json paths that are a string": (
        [edit_json("M/config.json", paths="reference")],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.paths must be dict \| hf_elmo\.compute_paths\.ElmoPaths \| None, got "
        r"'reference'\.$",
    ),
    "compiled window max forced on a bfloat16 model": (
        [],
        lambda root: run_bfloat16(root / "M", paths={"window_max": "compiled"}),
        r"^paths\.window_max='compiled' needs the compiled CPU loops \(float32 CPU tensors, a C\+\+ compiler\); got "
        r"torch\.bfloat16 tensors on cpu\.$",
    ),
    "Triton LSTM kernels forced on the sorted path": (
        [],
        lambda root: run_bfloat16(root / "M", paths={"lstm": "sorted", "lstm_kernels": "triton"}),
        r"^paths\.lstm_kernels='triton' (needs Triton|runs on paths\.lstm='static', got 'sorted')",
    ),
    # --- checks the model file calls from input_checks: the question-answering head, the warm state ---
    "a question-answering model without contexts": (
        [],
        run_model(lambda batch, model: batch, "ElmoForQuestionAnswering"),
        r"^ElmoForQuestionAnswering reads sentence pairs: pass pair_input_ids \(and pair_attention_mask\)",
    ),
    "a warm state of the wrong shape": (
        [],
        lambda root: warm_state_of_shapes(root / "M", (2, 3), (2, 3)),
        r"^A warm state must be \(hidden, memory\) of shapes \(\d+, \d+\) and \(\d+, \d+\) \(num_layers, 2 \* "
        r"projection_dim / 2 \* cell_dim\), got \[\(2, 3\), \(2, 3\)\]\.$",
    ),
    # --- TorchScript: torch.jit.trace of every model class is refused, pointing to torch.export and ONNX ---
    "torch.jit.trace of ElmoModel": (
        [],
        traced("ElmoModel", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript, as torch\.onnx\.export\(dynamo=False\) "
        r"does\): the trace would keep the length and the sentence lengths of its example as constants; use "
        r"torch\.export\.export with dynamic batch and length, or hf-elmo export --format onnx \(docs/export\.md\)\.$",
    ),
    "torch.jit.trace of ElmoForBiLM": (
        [],
        traced("ElmoForBiLM", "B"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForTokenClassification": (
        [],
        traced("ElmoForTokenClassification", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForSequenceClassification": (
        [],
        traced("ElmoForSequenceClassification", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForQuestionAnswering": (
        [],
        traced("ElmoForQuestionAnswering", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)


def test_the_word_splitter_takes_runs_up_to_its_limit():
    from hf_elmo.pre_tokenizer import MAX_RUN_LENGTH

    tokenizer = ElmoTokenizer()
    # The patterns that make the regex engine work hardest, at the limit: each gives its words, no panic.
    for run, words in [("a", 1), ("a'", 2), ("\U0001d400", 1), ("1.", 2), ("n't", 1), ("-", 1)]:
        text = run * (MAX_RUN_LENGTH // len(run))
        assert len(tokenizer.split_words(f"x {text} y")) == words + 2
    # Separated by whitespace, any length is fine; a Python-only separator (\x1c) does not separate.
    assert len(tokenizer.split_words(("a" * 60_000 + "\u3000") * 3)) == 3
    with pytest.raises(ValueError, match="without whitespace"):
        tokenizer.split_words(("a" * 60_000 + "\x1c") * 3)


def test_a_panic_of_the_regex_engine_is_a_value_error():
    from hf_elmo.pre_tokenizer import split_words

    class PanicException(BaseException):  # what pyo3 raises for a Rust panic: not an Exception
        pass

    class Panicking:
        def pre_tokenize_str(self, text):
            raise PanicException("Onig: Regex search error: retry-limit-in-match over")

    with pytest.raises(ValueError, match=r"the word splitter failed on this text \(Onig: .*retry-limit-in-match"):
        split_words(Panicking(), "text")


def test_a_config_json_without_forget_bias_is_read_as_the_folders_that_lacked_it(workspace):
    """Folders converted before `forget_bias` existed hold TensorFlow's 1.0 folded into the stored bias and no such
    field; a missing field therefore means 0, and such a folder gives the original's vectors."""
    import numpy as np
    import torch
    from conftest import fixture_batches

    from hf_elmo import ElmoModel

    values = json.loads((workspace / "M/config.json").read_text())
    assert values.pop("forget_bias") == 1.0
    (workspace / "M/config.json").write_text(json.dumps(values))
    D = values["cell_dim"]

    def fold(tensors):
        for name, tensor in tensors.items():
            if name.endswith("state_linearity.bias"):  # gates [i, f, g, o]
                tensor[D : 2 * D] += 1.0

    edit_weights("M", fold)(workspace)
    model = ElmoModel.from_pretrained(workspace / "M").eval()
    words, expected = fixture_batches("allennlp")[0]
    batch = ElmoTokenizer()(words, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        top = model(**batch).last_hidden_state
    for k, sentence in enumerate(words):  # the original's rule, as tests/model/test_modeling_elmo.py compares
        np.testing.assert_allclose(top[k, 1 : len(sentence) + 1].numpy(), expected[k], atol=1e-6, rtol=1e-5)


def test_a_token_batch_without_labels_gives_what_bert_gives(workspace):
    """All -100: NaN, the mean over no positions, as transformers' BERT token classifier gives."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from hf_elmo import ElmoForTokenClassification

    batch = padded_batch(workspace)
    no_labels = torch.full(batch["attention_mask"].shape, -100)
    ours = ElmoForTokenClassification.from_pretrained(workspace / "M", num_labels=3).eval()
    bert = BertForTokenClassification(
        BertConfig(
            vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, num_labels=3
        )
    ).eval()
    assert torch.isnan(ours(**batch, labels=no_labels).loss)
    assert torch.isnan(bert(input_ids=torch.ones_like(no_labels), labels=no_labels).loss)
