"""The sentence-transformers recipe (`hf_elmo.features.sentence_embeddings`): sentence vectors against the mean (or
max) of ElmoModel's top layer over each sentence's words, computed here from the model directly."""

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from hf_elmo import ElmoModel, ElmoTokenizer
from hf_elmo.features.sentence_embeddings import DEFAULT_MAX_SEQ_LENGTH, elmo_sentence_transformer

TEXTS = ["The cat sat on the mat .", "Hello", "", "I don't think it's raining, is it?"]


def word_vectors(model, tokenizer, words):
    """ElmoModel's top layer at each of `words` (the `<S>` and `</S>` positions left out), the sentence alone; for no
    words, at `<S>` and `</S>` (what sentence-transformers pools for BERT's empty text: `[CLS]` and `[SEP]`)."""
    with torch.no_grad():
        batch = tokenizer([words], is_split_into_words=True, return_tensors="pt")
        top = model(**batch).last_hidden_state[0]
        return (top[1:-1] if words else top).numpy()


def test_sentence_vectors_pool_the_words_only_and_reload(converted_dirs, tmp_path):
    folder = converted_dirs["allennlp"]
    model, tokenizer = ElmoModel.from_pretrained(folder).eval(), ElmoTokenizer.from_pretrained(folder)
    sentences = elmo_sentence_transformer(folder)
    assert sentences.max_seq_length == sentences.tokenizer.model_max_length == DEFAULT_MAX_SEQ_LENGTH
    vectors = [word_vectors(model, tokenizer, tokenizer.split_words(text)) for text in TEXTS]
    expected = np.stack([v.mean(axis=0) for v in vectors])
    encoded = sentences.encode(TEXTS, batch_size=len(TEXTS))  # one padded batch
    np.testing.assert_allclose(encoded, expected, rtol=0, atol=1e-6)
    # sentence-transformers' own mean counts <S> and </S> as words: other vectors.
    assert not np.allclose(SentenceTransformer(str(folder)).encode(TEXTS[:2]), expected[:2], rtol=0, atol=1e-3)

    by_max = elmo_sentence_transformer(folder, pooling_mode="max").encode(TEXTS, batch_size=len(TEXTS))
    np.testing.assert_allclose(by_max, np.stack([v.max(axis=0) for v in vectors]), rtol=0, atol=1e-6)

    sentences.save(str(tmp_path / "elmo-sentences"))
    reloaded = SentenceTransformer(str(tmp_path / "elmo-sentences"), trust_remote_code=True)
    assert reloaded.max_seq_length == DEFAULT_MAX_SEQ_LENGTH
    np.testing.assert_array_equal(reloaded.encode(TEXTS, batch_size=len(TEXTS)), encoded)


def test_long_sentences_keep_their_first_words(converted_dirs):
    folder = converted_dirs["allennlp"]
    model, tokenizer = ElmoModel.from_pretrained(folder).eval(), ElmoTokenizer.from_pretrained(folder)
    words = [f"w{i % 37}" for i in range(30)]
    sentences = elmo_sentence_transformer(folder, max_seq_length=12)  # <S>, 10 words, </S>
    (encoded,) = sentences.encode([" ".join(words)])
    np.testing.assert_allclose(encoded, word_vectors(model, tokenizer, words[:10]).mean(axis=0), rtol=0, atol=1e-6)
