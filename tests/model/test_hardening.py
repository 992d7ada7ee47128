"""Arbitrary Unicode through tokenizer and model (both character modes): no exception other than a documented
`ValueError`, finite outputs of the right shapes."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer

TRICKY = [
    "\u200d",  # zero-width joiner
    "\u200b",  # zero-width space
    "\u202e",  # right-to-left override
    "\u05e9\u05dc\u05d5\u05dd",  # Hebrew
    "\u0627\u0644\u0633\u0644\u0627\u0645",  # Arabic
    "e\u0301\u0302\u0303",  # stacked combining marks
    "\ud800",  # unpaired surrogates
    "\udfff",
    "\x00",
    "\x1b[31m",  # control characters
    "\u2028",
    "\ufeff",
    "👩\u200d👩\u200d👧",
    "<S>",
    "</S>",
    "<bos>",
    "<pad>",
    "x" * 500,  # a very long token
]
any_char = st.one_of(st.characters(codec=None, exclude_categories=()), st.characters(categories=["Cs"]))
any_text = st.lists(st.one_of(st.text(any_char, max_size=30), st.sampled_from(TRICKY)), max_size=8).map(" ".join)


def tiny_model(**overrides):
    config = ElmoConfig(
        char_embedding_dim=3,
        filters=[[1, 4], [3, 4]],
        n_highway=1,
        cell_dim=8,
        projection_dim=4,
        dropout=0.0,
        **overrides,
    )
    model = ElmoModel(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
    return model


def vocabulary_tokenizer():
    chars = {
        c: i + 1 for i, c in enumerate(["a", "b", "x", "\u05e9", "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"])
    }
    words = {"<oov>": 0, "<bos>": 1, "<eos>": 2, "<pad>": 3, "a": 4, "xx": 5}
    return ElmoTokenizer(char_vocab=chars, input_word_vocab=words)


MODES = {
    "utf-8 bytes": (ElmoTokenizer(), tiny_model()),
    "character vocabulary": (
        vocabulary_tokenizer(),
        tiny_model(char_vocabulary=True, n_characters=11, input_word_vocab_size=6, input_word_dim=2),
    ),
}


def check(tokenizer, model, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    n_words = [len(tokenizer.split_words(text)) for text in texts]
    assert batch["input_ids"].shape == (len(texts), max(n_words) + 2, 50)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and out.last_hidden_state.shape == (len(texts), max(n_words) + 2, 8)
    for layer in out.hidden_states:
        assert torch.isfinite(layer).all()
        for row, n in enumerate(n_words):
            assert not layer[row, n + 2 :].any()  # padding is exactly 0


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(any_text, min_size=1, max_size=3))
def test_any_unicode_text_gives_finite_outputs(mode, texts):
    tokenizer, model = MODES[mode]
    check(tokenizer, model, texts)


@pytest.mark.parametrize("mode", MODES)
def test_thousands_of_words(mode):
    tokenizer, model = MODES[mode]
    rng = np.random.default_rng(0)
    text = " ".join(rng.choice(TRICKY[:-1] + ["a", "b", "xx", "."], size=3000))
    check(tokenizer, model, [text, "a"])


@pytest.mark.parametrize("mode", MODES)
def test_empty_batch_and_empty_sentences(mode):
    tokenizer, model = MODES[mode]
    with pytest.raises(ValueError, match=r"empty batch: shape \(0, 0, 50\)"):
        model(**tokenizer([], padding=True, return_tensors="pt"))
    # Empty sentences still have their boundaries: a valid input, with nothing between them.
    batch = tokenizer(["", " \t\u3000 "], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 2, 50)
    with torch.no_grad():
        assert torch.isfinite(model(**batch).last_hidden_state).all()
    without_boundaries = tokenizer(["", ""], add_special_tokens=False, padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="has no positions"):
        model(**without_boundaries)
