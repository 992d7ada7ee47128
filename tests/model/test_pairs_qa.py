"""Sentence pairs and answer spans: the pair classifier (`ElmoForSequenceClassification` with `sentence_pairs`) and
`ElmoForQuestionAnswering` against float64 NumPy recomputations of ESIM's and BiDAF's equations, each sentence of a
pair through the biLM on its own; the span decoder against a brute-force search; the pipelines, the layer cache and
save / load."""

import json
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_heads import ROOT, bilm_layers, mixed_elmo, tiny_model
from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification, pipeline

from hf_elmo import (
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoQuestionAnsweringPipeline,
    ElmoTokenizer,
)
from hf_elmo.features.task_data import DataCollatorForElmo, ElmoLayerCache
from hf_elmo.pipelines_elmo import QuestionAnsweringPipelineForElmoModels, best_answer_spans, context_windows

sys.path.insert(0, str(ROOT / "examples"))
from pos_tagging import DATA, read_conllu  # noqa: E402

FIRST = [["A", "man", "sleeps", "."], ["Who", "sat", "?"], ["Hi"]]
SECOND = [["Someone", "is", "resting"], ["The", "cat", "sat", "on", "the", "mat", "."], ["Über", "naïve", "words"]]


def pair_batch(first=FIRST, second=SECOND):
    return ElmoTokenizer()(first, second, is_split_into_words=True, padding=True, return_tensors="pt")


def side(encoded, prefix):
    return {key: encoded[prefix + key] for key in ("input_ids", "attention_mask")}


def words_of(model, encoded, prefix, place="input"):
    """Each sentence's mixed ELMo vectors at its words, `[(n_i, 2P)]`, from its own biLM run."""
    mixed = mixed_elmo(model, bilm_layers(model, side(encoded, prefix)), place)
    lengths = encoded[prefix + "attention_mask"].sum(dim=1).tolist()
    return [mixed[row, 1 : n - 1] for row, n in enumerate(lengths)]


def softmax_rows(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def parameter(module):
    return {name: value.detach().numpy() for name, value in module.named_parameters()}


def lstm_direction(x, p, suffix):
    """PyTorch's LSTM equations (gates i, f, g, o) over the rows of `x`, in order."""
    h = np.zeros(p["weight_hh_l0" + suffix].shape[1])
    c = np.zeros_like(h)
    out = []
    for step in x:
        gates = p["weight_ih_l0" + suffix] @ step + p["bias_ih_l0" + suffix] + p["weight_hh_l0" + suffix] @ h
        gates += p["bias_hh_l0" + suffix]
        i, f, g, o = np.split(gates, 4)
        sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.array(out)


def bilstm(x, lstm):
    p = parameter(lstm)
    return np.concatenate([lstm_direction(x, p, ""), lstm_direction(x[::-1], p, "_reverse")[::-1]], axis=1)


# --- the pair classifier: ESIM's comparison of two sentences -------------------------------------------------------


def test_pair_classifier_is_esim_over_each_sentences_own_elmo():
    model = tiny_model(ElmoForSequenceClassification, sentence_pairs=True, num_labels=3, scalar_mix_layers=[2, 0])
    encoded = pair_batch()
    with torch.no_grad():
        logits = model(**encoded).logits.numpy()
    projection, classifier = parameter(model.pair_comparison.projection), parameter(model.classifier)
    for row, (a, b) in enumerate(zip(words_of(model, encoded, ""), words_of(model, encoded, "pair_"))):
        similarity = a @ b.T
        aligned_a, aligned_b = softmax_rows(similarity) @ b, softmax_rows(similarity.T) @ a
        pooled = []
        for words, aligned in ((a, aligned_a), (b, aligned_b)):
            enhanced = np.concatenate([words, aligned, words - aligned, words * aligned], axis=1)
            projected = np.maximum(enhanced @ projection["weight"].T + projection["bias"], 0)
            pooled += [projected.mean(0), projected.max(0)]
        expected = np.concatenate(pooled) @ classifier["weight"].T + classifier["bias"]
        np.testing.assert_allclose(logits[row], expected, rtol=0, atol=1e-12)


def test_pair_classifier_with_the_layer_cache_trains_as_with_the_bilm():
    tokenizer = ElmoTokenizer()
    examples = [
        dict(tokenizer(a, b, is_split_into_words=True), labels=i % 3) for i, (a, b) in enumerate(zip(FIRST, SECOND))
    ]
    model = tiny_model(ElmoForSequenceClassification, sentence_pairs=True, num_labels=3).float()
    cache = ElmoLayerCache(model, batch_size=1)
    columns = {key: [example[key] for example in examples] for key in examples[0]}
    layers = cache(columns)
    assert sorted(layers) == ["elmo_hidden_states", "pair_elmo_hidden_states"]
    cached = [{**example, **{key: value[i] for key, value in layers.items()}} for i, example in enumerate(examples)]
    collate = DataCollatorForElmo(tokenizer)
    with torch.no_grad():
        direct, from_cache = model(**collate(examples)), model(**collate(cached))
    torch.testing.assert_close(from_cache.logits, direct.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(from_cache.loss, direct.loss, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cls", [ElmoForSequenceClassification, ElmoForQuestionAnswering])
def test_pair_heads_fine_tune_the_bilm_only_when_asked(cls):
    encoded = pair_batch()
    for freeze, expect_gradients in ((True, False), (False, True)):
        model = tiny_model(cls, sentence_pairs=True, freeze_elmo=freeze).train()
        outputs = model(**encoded)
        logits = outputs.logits if cls is ElmoForSequenceClassification else outputs.start_logits
        logits.masked_fill(logits == torch.finfo(logits.dtype).min, 0).sum().backward()
        gradients = [p.grad for p in model.elmo.parameters() if p.grad is not None and p.grad.any()]
        assert bool(gradients) is expect_gradients


def test_text_classification_pipeline_takes_pairs_and_the_classifier_round_trips(tmp_path):
    model = tiny_model(ElmoForSequenceClassification, sentence_pairs=True, num_labels=3).float()
    tokenizer = ElmoTokenizer()
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=None)
    result = classify({"text": "A man sleeps.", "text_pair": "Someone is resting."})
    with torch.no_grad():
        encoded = tokenizer("A man sleeps.", "Someone is resting.", return_tensors="pt")
        probabilities = model(**encoded).logits.softmax(-1)
    assert {r["label"]: r["score"] for r in result} == pytest.approx(
        {model.config.id2label[i]: p for i, p in enumerate(probabilities[0].tolist())}, abs=1e-6
    )
    model.save_pretrained(tmp_path / "pairs")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "pairs").eval()
    assert type(reloaded) is ElmoForSequenceClassification and reloaded.config.sentence_pairs
    encoded = pair_batch()
    with torch.no_grad():
        assert torch.equal(reloaded(**encoded).logits, model(**encoded).logits)


# --- answer spans: BiDAF's attention flow ---------------------------------------------------------------------------


def test_question_answering_is_bidaf_over_each_sentences_own_elmo():
    model = tiny_model(ElmoForQuestionAnswering, task_encoder_hidden_size=3, elmo_placement=["input", "output"])
    encoded = pair_batch()
    with torch.no_grad():
        output = model(**encoded)
    encoder = model.task_encoder
    similarity = parameter(model.similarity)
    w_h, w_u, w_hu = np.split(similarity["weight"][0], 3)
    heads = {name: parameter(getattr(model, name)) for name in ("start_output", "end_output", "no_answer_output")}
    questions = zip(words_of(model, encoded, ""), words_of(model, encoded, "", "output"))
    contexts = zip(words_of(model, encoded, "pair_"), words_of(model, encoded, "pair_", "output"))
    for row, ((q_in, q_out), (c_in, c_out)) in enumerate(zip(questions, contexts)):
        u = np.concatenate([bilstm(q_in, encoder.lstm), q_out], axis=1)
        h = np.concatenate([bilstm(c_in, encoder.lstm), c_out], axis=1)
        s = (h @ w_h)[:, None] + (u @ w_u)[None, :] + (h * w_hu) @ u.T + similarity["bias"]
        attended_u = softmax_rows(s) @ u
        attended_h = softmax_rows(s.max(axis=1)) @ h
        g = np.concatenate([h, attended_u, h * attended_u, h * attended_h], axis=1)
        m = bilstm(g, model.modeling)
        m2 = bilstm(m, model.end_modeling)
        start = np.concatenate([g, m], axis=1) @ heads["start_output"]["weight"][0] + heads["start_output"]["bias"]
        end = np.concatenate([g, m2], axis=1) @ heads["end_output"]["weight"][0] + heads["end_output"]["bias"]
        pooled = np.concatenate([g, m], axis=1).max(axis=0)
        no_answer = pooled @ heads["no_answer_output"]["weight"].T + heads["no_answer_output"]["bias"]
        n = len(h)
        for logits, words, null in ((output.start_logits, start, no_answer[0]), (output.end_logits, end, no_answer[1])):
            np.testing.assert_allclose(logits[row, 1 : n + 1].numpy(), words, rtol=0, atol=1e-12)
            np.testing.assert_allclose(logits[row, 0].item(), null, rtol=0, atol=1e-12)
            assert (logits[row, n + 1 :] == torch.finfo(torch.float64).min).all(), "</S> and padding can't be picked"


def test_question_answering_loss_is_the_mean_of_the_start_and_end_cross_entropies():
    model = tiny_model(ElmoForQuestionAnswering)
    encoded = pair_batch()
    starts, ends = torch.tensor([1, 3, 0]), torch.tensor([3, 3, 0])
    with torch.no_grad():
        output = model(**encoded, start_positions=starts, end_positions=ends)
    expected = []
    for logits, positions in ((output.start_logits, starts), (output.end_logits, ends)):
        shifted = logits.numpy() - logits.numpy().max(1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        expected.append(-np.mean([log_p[row, p] for row, p in enumerate(positions.tolist())]))
    assert output.loss.item() == pytest.approx(sum(expected) / 2, abs=1e-12)


def brute_force_spans(start, end, max_length):
    """Every span `(first, last, score)` that starts before it ends and is at most `max_length` long, best first."""
    spans = [(i, j, start[i] + end[j]) for i in range(len(start)) for j in range(i, min(len(end), i + max_length))]
    return sorted(spans, key=lambda span: -span[2])


def brute_force_span(start, end, max_length):
    return brute_force_spans(start, end, max_length)[0]


@pytest.mark.parametrize("n, max_length", [(1, 1), (7, 1), (7, 3), (12, 30)])
@pytest.mark.parametrize("top_k", [1, 4, 100])
def test_best_answer_spans_are_the_best_spans_that_start_before_they_end(n, max_length, top_k):
    generator = torch.Generator().manual_seed(n * 100 + max_length)
    for _ in range(20):
        start, end = torch.randn(2, n, generator=generator, dtype=torch.float64)
        spans = best_answer_spans(start, end, max_length, top_k)
        expected = brute_force_spans(start.tolist(), end.tolist(), max_length)[:top_k]
        assert [(first, last) for first, last, _ in spans] == [(i, j) for i, j, _ in expected]
        assert [p for _, _, p in spans] == pytest.approx([np.exp(score) for _, _, score in expected], rel=1e-12)


def test_context_windows_cover_the_context_with_the_overlap():
    for n, window, stride in ((1, 5, 0), (5, 5, 2), (6, 5, 2), (23, 5, 2), (23, 6, 0)):
        starts = context_windows(n, window, stride)
        covered = sorted({start + k for start in starts for k in range(window) if start + k < n})
        assert covered == list(range(n)) and starts[0] == 0 and starts[-1] + window >= n
        assert all(b - a == window - stride for a, b in zip(starts, starts[1:]))


def answer_log_probabilities(model, question: str, context_words: list[str]):
    """The model's start and end log-probabilities `(Tc,)` (float64) over the positions of one window of the context,
    computed on its own."""
    tokenizer = ElmoTokenizer()
    encoded = tokenizer(tokenizer.split_words(question), context_words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded)
    return tuple(logits[0].double().log_softmax(-1) for logits in (out.start_logits, out.end_logits))


def test_question_answering_pipeline_answers_with_offsets_into_the_context(tmp_path):
    model = tiny_model(ElmoForQuestionAnswering).float()
    tokenizer = ElmoTokenizer()
    question = "Who sat on the mat?"
    context = "  The cat sat on the mat, and then the dog didn't sit anywhere at all.\n"
    qa = pipeline("elmo-question-answering", model=model, tokenizer=tokenizer)
    context_words = tokenizer.split_words(context)
    for window, stride in ((100, 0), (5, 2), (4, 0)):
        answer = qa(question=question, context=context, max_context_words=window, stride=stride, max_answer_len=3)
        # The truth: every window on its own through the model, every span of every window scored by brute force.
        best = None
        for start in context_windows(len(context_words), window, stride):
            piece = context_words[start : start + window]
            log_start, log_end = (p[1 : len(piece) + 1] for p in answer_log_probabilities(model, question, piece))
            i, j, score = brute_force_span(log_start.tolist(), log_end.tolist(), 3)
            if best is None or score > best[2]:
                best = (start + i, start + j, score)
        expected = " ".join(context_words[best[0] : best[1] + 1])
        assert answer["score"] == pytest.approx(np.exp(best[2]), rel=1e-6)
        assert context[answer["start"] : answer["end"]] == answer["answer"]
        assert tokenizer.split_words(answer["answer"]) == tokenizer.split_words(expected)
    batched = qa(question=[question, "Who?"], context=[context, "Nobody."])
    assert len(batched) == 2 and batched[1]["answer"] == "Nobody."


def test_question_answering_pipeline_top_k_gives_the_best_spans_of_every_window_and_the_empty_answer():
    model = tiny_model(ElmoForQuestionAnswering).float()
    tokenizer = ElmoTokenizer()
    question, context = "Who sat on the mat?", "The cat sat on the mat, and then the dog didn't sit anywhere at all."
    qa = pipeline("elmo-question-answering", model=model, tokenizer=tokenizer)
    context_words = tokenizer.split_words(context)
    for window, stride in ((100, 0), (5, 2)):
        # The truth: every span of every window scored by brute force, a span read in two windows once (its best).
        scores, no_answer = {}, 1.0
        for start in context_windows(len(context_words), window, stride):
            piece = context_words[start : start + window]
            log_start, log_end = answer_log_probabilities(model, question, piece)
            no_answer = min(no_answer, float((log_start[0] + log_end[0]).exp()))
            n = len(piece)
            for i, j, score in brute_force_spans(log_start[1 : n + 1].tolist(), log_end[1 : n + 1].tolist(), 3):
                scores[start + i, start + j] = max(np.exp(score), scores.get((start + i, start + j), 0.0))
        ranked = sorted(scores.items(), key=lambda item: -item[1])
        answers = qa(
            question=question, context=context, max_context_words=window, stride=stride, max_answer_len=3, top_k=4
        )
        assert [tokenizer.split_words(a["answer"]) for a in answers] == [
            context_words[i : j + 1] for (i, j), _ in ranked[:4]
        ]
        assert [a["score"] for a in answers] == pytest.approx([p for _, p in ranked[:4]], rel=1e-6)
        assert all(context[a["start"] : a["end"]] == a["answer"] for a in answers)
        assert (
            qa(question=question, context=context, max_context_words=window, stride=stride, max_answer_len=3)
            == answers[0]
        )
        with_empty = qa(
            question=question,
            context=context,
            max_context_words=window,
            stride=stride,
            max_answer_len=3,
            top_k=len(scores) + 1,
            handle_impossible_answer=True,
        )
        expected = sorted([*(p for _, p in ranked), no_answer], reverse=True)
        assert [a["score"] for a in with_empty] == pytest.approx(expected, rel=1e-6)
        assert [a for a in with_empty if a["answer"] == ""] == [
            {"score": pytest.approx(no_answer, rel=1e-6), "start": 0, "end": 0, "answer": ""}
        ]
    one_word = qa(question=question, context="Nobody", top_k=5)  # one word, one span: a dict, as transformers gives
    assert isinstance(one_word, dict) and one_word["answer"] == "Nobody"


def test_question_answering_pipeline_takes_several_questions_about_one_context_and_positional_texts():
    model = tiny_model(ElmoForQuestionAnswering).float()
    qa = pipeline("elmo-question-answering", model=model, tokenizer=ElmoTokenizer())
    questions, context = ["Who sat?", "Where did the cat sit?", "What happened?"], "The cat sat on the mat."
    assert qa(question=questions, context=context) == [qa(question=q, context=context) for q in questions]
    assert qa(questions[1], context) == qa(question=questions[1], context=context)  # positional, as transformers took


def test_question_answering_pipeline_gives_the_empty_answer_when_the_model_does():
    model = tiny_model(ElmoForQuestionAnswering).float()
    qa = pipeline("elmo-question-answering", model=model, tokenizer=ElmoTokenizer())
    with torch.no_grad():
        model.no_answer_output.bias.fill_(50.0)
    assert qa(question="Who sat?", context="The cat sat.", handle_impossible_answer=True) == {
        "score": pytest.approx(1.0),
        "start": 0,
        "end": 0,
        "answer": "",
    }
    assert qa(question="Who sat?", context="The cat sat.")["answer"] != ""  # SQuAD 1.1: a span is always given
    with torch.no_grad():
        model.no_answer_output.bias.fill_(-50.0)
    assert qa(question="Who sat?", context="The cat sat.", handle_impossible_answer=True)["answer"] != ""


def test_question_answering_model_round_trips_and_loads_the_pipeline_from_a_folder(tmp_path):
    model = tiny_model(ElmoForQuestionAnswering).float()
    tokenizer = ElmoTokenizer()
    model.save_pretrained(tmp_path / "qa")
    tokenizer.save_pretrained(tmp_path / "qa")
    reloaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    assert type(reloaded) is ElmoForQuestionAnswering
    encoded = pair_batch()
    with torch.no_grad():
        assert torch.equal(reloaded(**encoded).start_logits, model(**encoded).start_logits)
    qa = pipeline("question-answering", model=str(tmp_path / "qa"), trust_remote_code=True)
    assert type(qa).__name__ == "ElmoQuestionAnsweringPipeline"
    in_memory = pipeline("elmo-question-answering", model=model, tokenizer=tokenizer)
    expected = in_memory(question="Who?", context="The cat sat.")
    assert qa(question="Who?", context="The cat sat.") == expected


QUESTIONS = ["Who sat on the mat?", "What did the dog do?"]
CONTEXTS = ["The cat sat on the mat, and then the dog didn't sit anywhere at all.", "The dog slept under the table."]


def save_bert_for_question_answering(folder):
    """A tiny BERT with a question-answering head and its tokenizer, saved in `folder`."""
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizer

    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    tokenizer = BertTokenizer(str(folder / "vocab.txt"))
    config = BertConfig(vocab_size=7, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    model = BertForQuestionAnswering(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def test_question_answering_task_builds_the_elmo_pipeline_for_an_elmo_model(tmp_path):
    # transformers 5 removed the task; with hf_elmo imported it builds ELMo's pipeline for an ELMo model, object or
    # folder (without trust_remote_code, as for token-classification), answering as "elmo-question-answering" does.
    model = tiny_model(ElmoForQuestionAnswering).float()
    tokenizer = ElmoTokenizer()
    model.save_pretrained(tmp_path / "qa")
    tokenizer.save_pretrained(tmp_path / "qa")
    expected = pipeline("elmo-question-answering", model=model, tokenizer=tokenizer)(
        question=QUESTIONS, context=CONTEXTS, max_answer_len=4
    )
    assert len({answer["answer"] for answer in expected}) == 2
    for qa in (
        pipeline("question-answering", model=model, tokenizer=tokenizer),
        pipeline("question-answering", model=str(tmp_path / "qa")),
        pipeline("question-answering", model=str(tmp_path / "qa"), trust_remote_code=True),
        pipeline("elmo-question-answering", model=str(tmp_path / "qa")),
    ):
        assert type(qa) is ElmoQuestionAnsweringPipeline
        assert qa(question=QUESTIONS, context=CONTEXTS, max_answer_len=4) == expected


def test_question_answering_task_refuses_other_models_as_transformers_5_does(tmp_path):
    from conftest import run_without_hf_elmo

    bert, bert_tokenizer = save_bert_for_question_answering(tmp_path / "bert")
    # The truth: what transformers raises for the task where hf_elmo is not installed.
    script = f"""
        import json
        from transformers import pipeline
        errors = []
        for model in (None, {str(tmp_path / "bert")!r}):
            try:
                pipeline("question-answering", model=model)
            except Exception as error:
                errors.append([type(error).__name__, str(error)])
        open("errors.json", "w").write(json.dumps(errors))
        """
    run_without_hf_elmo(script, tmp_path)
    without_hf_elmo = json.loads((tmp_path / "errors.json").read_text())
    assert without_hf_elmo[0] == without_hf_elmo[1] and without_hf_elmo[0][0] == "KeyError"
    for model, tokenizer in ((None, None), (str(tmp_path / "bert"), None), (bert, bert_tokenizer)):
        with pytest.raises(KeyError) as raised:
            pipeline("question-answering", model=model, tokenizer=tokenizer)
        assert [type(raised.value).__name__, str(raised.value)] == without_hf_elmo[0]


def test_question_answering_task_inferred_as_for_other_models(tmp_path, monkeypatch):
    # Without a task, transformers asks the Hub for the repository's pipeline_tag (from its model card); an ELMo
    # question-answering folder's card says "question-answering". A local folder is no Hub repository: the same error
    # as for BERT's.
    import transformers.pipelines
    from huggingface_hub import ModelCard

    model = tiny_model(ElmoForQuestionAnswering).float()
    model.save_pretrained(tmp_path / "qa")
    ElmoTokenizer().save_pretrained(tmp_path / "qa")
    save_bert_for_question_answering(tmp_path / "bert")
    errors = []
    for name in ("qa", "bert"):
        with pytest.raises(Exception) as raised:
            pipeline(model=str(tmp_path / name))
        errors.append((type(raised.value), str(raised.value).replace(str(tmp_path / name), "FOLDER")))
    assert errors[0] == errors[1]

    tag = ModelCard.load(tmp_path / "qa" / "README.md").data.pipeline_tag
    assert tag == "question-answering"
    hub = type("Hub", (), {"model_info": lambda self, model, token=None: SimpleNamespace(pipeline_tag=tag)})
    monkeypatch.setattr(transformers.pipelines, "hf_api", hub)
    monkeypatch.setattr(transformers.pipelines, "is_offline_mode", lambda: False)
    qa = pipeline(model=str(tmp_path / "qa"))
    assert type(qa) is ElmoQuestionAnsweringPipeline
    expected = pipeline("elmo-question-answering", model=model, tokenizer=ElmoTokenizer())
    assert qa(question=QUESTIONS, context=CONTEXTS) == expected(question=QUESTIONS, context=CONTEXTS)
    with pytest.raises(KeyError) as raised:
        pipeline(model=str(tmp_path / "bert"))
    assert raised.value.args == (QuestionAnsweringPipelineForElmoModels.removed_task_message,)


# --- the examples: data built from the bundled EWT sentences, run briefly ------------------------------------------


def run_example(script, converted_dirs, tmp_path, *options):
    import subprocess

    command = [sys.executable, str(ROOT / "examples" / script), "--model", str(converted_dirs["allennlp"])]
    command += ["--epochs", "1", "--output-dir", str(tmp_path / "out"), "--predictions", str(tmp_path / "p.json")]
    result = subprocess.run(command + list(options), capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads((tmp_path / "p.json").read_text())


def test_sentence_pairs_example_reports_the_accuracy_of_its_predictions(converted_dirs, tmp_path):
    options = ("--train-pairs", "32", "--eval-pairs", "24")
    stdout, rows = run_example("sentence_pairs.py", converted_dirs, tmp_path, *options)
    accuracy = float(re.search(r"held-out accuracy ([0-9.]+)% on 24 \(chance 33\.33%\)", stdout).group(1))
    assert len(rows) == 24
    assert accuracy == pytest.approx(100 * np.mean([r["gold"] == r["predicted"] for r in rows]), abs=0.005)
    for row in rows:  # the labels follow the documented construction
        premise, hypothesis = row["premise"], row["hypothesis"]
        spans = [premise[i : i + len(hypothesis)] for i in range(len(premise) - len(hypothesis) + 1)]
        mismatches = min(sum(a != b for a, b in zip(span, hypothesis)) for span in spans) if spans else None
        if row["gold"] == "entailment":
            assert mismatches == 0
        elif row["gold"] == "contradiction":
            assert mismatches == 1 and 3 <= len(hypothesis) <= 8


def test_question_answering_example_reports_the_exact_match_of_its_predictions(converted_dirs, tmp_path):
    stdout, rows = run_example(
        "question_answering.py", converted_dirs, tmp_path, "--train-questions", "32", "--eval-questions", "24"
    )
    exact = float(re.search(r"held-out exact match ([0-9.]+)% on 24 \(chance [0-9.]+%\)", stdout).group(1))
    assert len(rows) == 24
    assert exact == pytest.approx(100 * np.mean([r["predicted"] in r["gold"] for r in rows]), abs=0.005)
    contexts = [" ".join(words) for words in read_conllu(DATA / "en_ewt-ud-test.conllu")[0]]
    for row in rows:  # the gold answer is the word, or the two words, after the question's word in some sentence
        question = row["question"].split()
        anchor, length = question[-2], 2 if "two" in question else 1
        assert len(row["gold"][0].split()) == length
        assert any(f" {anchor} {row['gold'][0]} " in f" {context} " for context in contexts)


def test_the_examples_read_squad_and_snli_as_their_dataset_cards_describe_them(monkeypatch):
    import datasets
    import question_answering
    import sentence_pairs

    context = "Fine. The  Eiffel Tower, in Paris, opened in 1889 ; it is 330 m tall."
    tables = {
        "squad": datasets.Dataset.from_dict(
            {
                "question": ["When did it open?", "Where is it?", "How tall?"],
                "context": [context] * 3,
                "answers": [
                    {"text": ["1889"], "answer_start": [context.index("1889")]},
                    {"text": ["in Paris"], "answer_start": [context.index("in Paris")]},
                    {"text": ["330 m tall"], "answer_start": [context.index("330")]},
                ],
            }
        ),
        "snli": datasets.Dataset.from_dict(
            {"premise": ["A man sleeps.", "x", "y"], "hypothesis": ["He rests.", "z", "w"], "label": [0, -1, 2]}
        ),
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: tables[name])
    tokenizer = ElmoTokenizer()
    examples = question_answering.squad_questions("validation", None, tokenizer, None)
    assert [" ".join(e["context"][e["answer"][0] : e["answer"][1] + 1]) for e in examples] == [
        "1889",
        "in Paris",
        "330 m tall",
    ]
    # Training keeps the questions whose answer lies in the first words only.
    first_words = tokenizer.split_words(context).index("Paris") + 1
    kept = question_answering.squad_questions("train", None, tokenizer, first_words)
    assert [e["gold"] for e in kept] == [["in Paris"]] and len(kept[0]["context"]) == first_words
    assert sentence_pairs.snli_pairs("train", None) == [("A man sleeps.", "He rests.", 0), ("y", "w", 2)]
