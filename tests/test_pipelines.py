import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer, pipeline

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


def expected_tags(model, tokenizer, text):
    words = tokenizer.split_words(text)
    with torch.no_grad():
        probabilities = model(**on(model.device, tokenizer(text, return_tensors="pt"))).logits[0].float().softmax(-1)
    return [
        (word, LABELS[int(probabilities[i + 1].argmax())], float(probabilities[i + 1].max()))
        for i, word in enumerate(words)
    ]


def test_token_classification_pipeline_tags_raw_text(tagger_dir):
    model = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tagger_dir)
    tagger = pipeline("elmo-token-classification", model=model, tokenizer=tokenizer)
    assert isinstance(tagger, ElmoTokenClassificationPipeline) and tagger.device == model.device
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


def test_token_classification_task_uses_the_custom_pipeline_from_a_folder(tagger_dir):
    tagger = pipeline("token-classification", model=str(tagger_dir), trust_remote_code=True)
    assert type(tagger).__name__ == "ElmoTokenClassificationPipeline"
    model = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval().to(tagger.device)
    expected = [(w, t) for w, t, _ in expected_tags(model, AutoTokenizer.from_pretrained(tagger_dir), TEXTS[1])]
    assert [(r["word"], r["entity"]) for r in tagger(TEXTS[1], ignore_labels=[])] == expected
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("token-classification", model=str(tagger_dir))


def test_pipeline_bad_input(tagger_dir):
    tagger = pipeline("elmo-token-classification", model=str(tagger_dir))
    with pytest.raises(TypeError, match="expects raw text"):
        tagger([["pre", "split"]])
    with pytest.raises(ValueError, match="unknown arguments"):
        tagger("text", aggregation_strategy="simple")


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
