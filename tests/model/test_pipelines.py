"""The pipelines: feature extraction, token classification (raw text, pre-split words, aggregation, from a folder
with and without the package, the built-in pipeline kept for other models), text classification, word offsets.
"""

import numpy as np
import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    pipeline,
)

from hf_elmo import ElmoTokenClassificationPipeline, ElmoTokenizer

TEXTS = ["I don't think it's raining, is it?", 'He said "no" -- twice.']
LABELS = {0: "O", 1: "NOUN", 2: "VERB", 3: "PUNCT"}


def on(device, batch):
    return {key: value.to(device) for key, value in batch.items()}


def test_feature_extraction_pipeline_gives_the_model_output(converted_dirs):
    # Pipelines run on the first GPU when there is one (transformers' rule), moving the model there: the expected
    # outputs are computed where the pipeline put the model.
    folder = converted_dirs["allennlp"]
    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    extractor = pipeline("feature-extraction", model=model, tokenizer=tokenizer)
    from_folder = pipeline("feature-extraction", model=str(folder))
    expected_device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert extractor.device == from_folder.device == model.device == expected_device
    for text in TEXTS:
        with torch.no_grad():
            expected = model(**on(model.device, tokenizer(text, return_tensors="pt"))).last_hidden_state.cpu().numpy()
        assert np.array_equal(np.array(extractor(text), dtype=np.float32), expected)
        assert np.array_equal(np.array(from_folder(text), dtype=np.float32), expected)
        assert expected.shape == (1, len(tokenizer.split_words(text)) + 2, 32)


@pytest.fixture(scope="module")
def tagger_dir(converted_dirs, tmp_path_factory):
    torch.manual_seed(1)
    model = AutoModelForTokenClassification.from_pretrained(converted_dirs["allennlp"], id2label=LABELS)
    with torch.no_grad():
        model.classifier.weight.normal_(std=1.0)  # distinct, confident predictions
    folder = tmp_path_factory.mktemp("tagger")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(converted_dirs["allennlp"]).save_pretrained(folder)
    return folder


def expected_tags(model, tokenizer, text, labels=LABELS):
    words = tokenizer.split_words(text)
    with torch.no_grad():
        probabilities = model(**on(model.device, tokenizer(text, return_tensors="pt"))).logits[0].float().softmax(-1)
    return [
        (word, labels[int(probabilities[i + 1].argmax())], float(probabilities[i + 1].max()))
        for i, word in enumerate(words)
    ]


def test_token_classification_pipeline_tags_raw_text(tagger_dir):
    model = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tagger_dir)
    tagger = pipeline("token-classification", model=model, tokenizer=tokenizer)
    assert isinstance(tagger, ElmoTokenClassificationPipeline) and tagger.device == model.device
    assert type(pipeline("elmo-token-classification", model=model, tokenizer=tokenizer)) is type(tagger)
    for text, result in zip(TEXTS, tagger(TEXTS, ignore_labels=[])):
        expected = expected_tags(model, tokenizer, text)
        assert [(r["word"], r["entity"]) for r in result] == [(w, t) for w, t, _ in expected]
        assert [r["score"] for r in result] == pytest.approx([s for _, _, s in expected], abs=1e-6)
        assert [r["index"] for r in result] == list(range(1, len(expected) + 1))
        assert all(text[r["start"] : r["end"]] == r["word"] for r in result)
    expected = expected_tags(model, tokenizer, TEXTS[0])
    common = max(LABELS.values(), key=[t for _, t, _ in expected].count)
    assert [r["word"] for r in tagger(TEXTS[0], ignore_labels=[common])] == [w for w, t, _ in expected if t != common]
    # Like the built-in pipeline, "O" is left out by default.
    with torch.no_grad():
        model.classifier.bias[0] = 1e3
    assert tagger(TEXTS[0]) == [] and len(tagger(TEXTS[0], ignore_labels=[])) == len(expected)


def test_token_classification_task_uses_the_elmo_pipeline_from_a_folder(tagger_dir):
    # With hf_elmo imported the built-in task builds ELMo's pipeline; trust_remote_code=True (for the folder's own code,
    # where hf_elmo is not installed) gives the same tags.
    model = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval()
    expected = [(w, t) for w, t, _ in expected_tags(model, AutoTokenizer.from_pretrained(tagger_dir), TEXTS[1])]
    for options in ({}, {"trust_remote_code": True}):
        tagger = pipeline("token-classification", model=str(tagger_dir), **options)
        assert type(tagger).__name__ == "ElmoTokenClassificationPipeline"
        model.to(tagger.device)
        assert [(r["word"], r["entity"]) for r in tagger(TEXTS[1], ignore_labels=[])] == expected


def test_token_classification_from_a_folder_without_the_package(tagger_dir, tmp_path):
    import json
    import textwrap

    from conftest import run_without_hf_elmo

    model = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval()
    expected = [[w, t] for w, t, _ in expected_tags(model, AutoTokenizer.from_pretrained(tagger_dir), TEXTS[1])]
    script = textwrap.dedent(
        f"""
        import json
        from transformers import pipeline
        tagger = pipeline("token-classification", model={str(tagger_dir)!r}, trust_remote_code=True, device="cpu")
        assert type(tagger).__module__.startswith("transformers_modules"), type(tagger).__module__
        tags = [[r["word"], r["entity"]] for r in tagger({TEXTS[1]!r}, ignore_labels=[])]
        open("tags.json", "w").write(json.dumps(tags))
        """
    )
    run_without_hf_elmo(script, tmp_path)
    assert json.loads((tmp_path / "tags.json").read_text()) == expected


def test_token_classification_task_keeps_the_built_in_pipeline_for_other_models(tmp_path):
    from transformers import BertConfig, BertForTokenClassification, BertTokenizer, TokenClassificationPipeline

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(tmp_path / "vocab.txt"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocabulary),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        id2label={0: "O", 1: "B-X", 2: "I-X"},
    )
    model = BertForTokenClassification(config).eval()
    tagger = pipeline("token-classification", model=model, tokenizer=tokenizer)
    built_in = TokenClassificationPipeline(model=model, tokenizer=tokenizer)
    assert isinstance(tagger, TokenClassificationPipeline) and not isinstance(tagger, ElmoTokenClassificationPipeline)
    for strategy in ("none", "simple"):
        assert tagger("the cats sat on the mat .", aggregation_strategy=strategy, ignore_labels=[]) == built_in(
            "the cats sat on the mat .", aggregation_strategy=strategy, ignore_labels=[]
        )


def grouped(entities):
    """The built-in pipeline's grouping, written out: adjacent words of one tag (the part after `B-`/`I-`) form an
    entity unless the later one starts with `B-`; the group's score is the mean of its words'."""
    groups = []
    for word, label, score, start, end in entities:
        tag = label.split("-", 1)[-1]
        if groups and groups[-1]["entity_group"] == tag and not label.startswith("B-"):
            groups[-1]["words"].append(word)
            groups[-1]["scores"].append(score)
            groups[-1]["end"] = end
        else:
            groups.append({"entity_group": tag, "words": [word], "scores": [score], "start": start, "end": end})
    return [
        {
            "entity_group": g["entity_group"],
            "score": float(np.mean(g["scores"])),
            "word": " ".join(g["words"]),
            "start": g["start"],
            "end": g["end"],
        }
        for g in groups
    ]


BIO_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def test_token_classification_aggregation_strategies_and_pre_split_words(converted_dirs):
    torch.manual_seed(3)
    model = AutoModelForTokenClassification.from_pretrained(converted_dirs["allennlp"], id2label=BIO_LABELS).eval()
    tokenizer = AutoTokenizer.from_pretrained(converted_dirs["allennlp"])
    with torch.no_grad():
        model.classifier.weight.normal_(std=1.0)
    tagger = pipeline("token-classification", model=model, tokenizer=tokenizer)
    assert isinstance(tagger, ElmoTokenClassificationPipeline)
    text = "Ada Lovelace met Charles Babbage in London , and they wrote to Michael Faraday in Paris ."
    words, starts = text.split(" "), []
    for word in words:
        starts.append(text.index(word, starts[-1] + 1 if starts else 0))
    per_word = [
        (word, label, score, start, start + len(word))
        for (word, label, score), start in zip(expected_tags(model, tokenizer, text, BIO_LABELS), starts)
    ]
    truth = grouped(per_word)
    assert any(" " in group["word"] for group in truth)  # some group spans several words
    assert any(label.startswith("B-") for _, label, *_ in per_word[1:])  # and some B- starts a new one
    for strategy in ("simple", "first", "average", "max"):
        result = tagger(text, aggregation_strategy=strategy, ignore_labels=[])
        assert [{**r, "score": float(r["score"])} for r in result] == [
            {**r, "score": pytest.approx(r["score"], abs=1e-6)} for r in truth
        ]
    kept = tagger(text, aggregation_strategy="simple", ignore_labels=["PER"])
    assert [r["word"] for r in kept] == [g["word"] for g in truth if g["entity_group"] != "PER"]
    # Pre-split words: offsets in the words joined by the delimiter, as the built-in pipeline gives them.
    (result,) = tagger(words, is_split_into_words=True, ignore_labels=[])
    assert [(r["word"], r["entity"], r["index"], r["start"], r["end"]) for r in result] == [
        (word, label, index + 1, start, end) for index, (word, label, _, start, end) in enumerate(per_word)
    ]
    (result,) = tagger(words, is_split_into_words=True, delimiter="||", ignore_labels=[])
    assert all("||".join(words)[r["start"] : r["end"]] == r["word"] for r in result)
    assert result[-1]["end"] == len("||".join(words))
    results = tagger([words[:4], words[4:]], is_split_into_words=True, ignore_labels=[])
    assert [[r["word"] for r in result] for result in results] == [words[:4], words[4:]]


def test_text_classification_pipeline_gives_the_model_label(converted_dirs, tmp_path):
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    torch.manual_seed(2)
    model = AutoModelForSequenceClassification.from_pretrained(converted_dirs["allennlp"], id2label=labels).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(std=1.0)
    tokenizer = AutoTokenizer.from_pretrained(converted_dirs["allennlp"])
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for classifier in (
        pipeline("text-classification", model=model, tokenizer=tokenizer),
        pipeline("text-classification", model=str(tmp_path)),
    ):
        for text in TEXTS:
            with torch.no_grad():
                inputs = on(classifier.model.device, tokenizer(text, return_tensors="pt"))
                probabilities = classifier.model(**inputs).logits[0].softmax(-1)
            (result,) = classifier([text])
            assert result["label"] == labels[int(probabilities.argmax())]
            assert result["score"] == pytest.approx(float(probabilities.max()), abs=1e-6)


class CountingText(str):
    """A text that counts the characters its searches may have looked at (a failed search: the rest of the text)."""

    looked_at = 0

    def startswith(self, prefix, start=0, *end):
        self.looked_at += len(prefix)
        return super().startswith(prefix, start, *end)

    def find(self, sub, start=0, *end):
        found = super().find(sub, start, *end)
        self.looked_at += (len(self) if found < 0 else found + len(sub)) - start
        return found

    def index(self, sub, start=0, *end):
        self.looked_at += len(self) - start
        return super().index(sub, start, *end)

    def __getitem__(self, key):
        item = super().__getitem__(key)
        self.looked_at += len(item)
        return item


def test_word_offsets_take_one_pass_over_the_text():
    from hf_elmo.pipelines_elmo import word_spans

    # The truth: a text built from words at known places; every 7th word has a lone surrogate inside, which the
    # splitter drops (the word it gives is not a piece of the text: no offsets); some separators hold one too.
    pieces, words, expected, length = [], [], [], 0
    for index in range(3000):
        separator = [" ", "\n\t", " \udc80 "][index % 3]
        word = f"w{index}\udc80x" if index % 7 == 0 else f"w{index}x"
        pieces += [separator, word]
        words.append(word.replace("\udc80", ""))
        start = length + len(separator)
        expected.append((None, None) if index % 7 == 0 else (start, start + len(word)))
        length += len(separator) + len(word)
    text = CountingText("".join(pieces))
    assert ElmoTokenizer().split_words(text) == words
    text.looked_at = 0
    assert word_spans(text, words) == expected
    assert text.looked_at <= 3 * len(text)  # a bounded number of looks per character, not a search per word
