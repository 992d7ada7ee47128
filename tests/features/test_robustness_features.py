"""The sentence-transformers module with an empty sentence and with a folder of another model type."""

import json
import shutil

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from test_robustness_model import one_line

from hf_elmo import ElmoModel, ElmoTokenizer
from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer

# --- sentence-transformers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling_mode", ["max", "mean"])
@pytest.mark.parametrize("normalize_embeddings", [False, True])
def test_an_empty_sentence_pools_its_boundaries_as_bert_pools_cls_and_sep(
    converted_dirs, pooling_mode, normalize_embeddings
):
    folder = converted_dirs["allennlp"]
    model, tokenizer = ElmoModel.from_pretrained(folder).eval(), ElmoTokenizer.from_pretrained(folder)
    sentences = elmo_sentence_transformer(folder, pooling_mode=pooling_mode)
    encoded = sentences.encode(["", "The cat"], normalize_embeddings=normalize_embeddings)
    assert np.isfinite(encoded).all()
    with torch.no_grad():
        boundaries = model(**tokenizer([[]], is_split_into_words=True, return_tensors="pt")).last_hidden_state[0]
    expected = (boundaries.max(dim=0).values if pooling_mode == "max" else boundaries.mean(dim=0)).numpy()
    if normalize_embeddings:
        expected = expected / np.linalg.norm(expected)
    np.testing.assert_allclose(encoded[0], expected, rtol=0, atol=1e-6)


@pytest.fixture
def folder(converted_dirs, tmp_path):
    copy = tmp_path / "M"
    shutil.copytree(converted_dirs["allennlp"], copy)
    return copy


def test_another_model_type_is_named_with_its_folder_by_the_sentence_transformer(folder, tmp_path):
    saved = tmp_path / "sentences"
    elmo_sentence_transformer(folder).save(str(saved))
    for path in (folder, saved):
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    expected = "{}: config.json: The configuration has model_type 'bert', not 'elmo': it is not an ELMo model."
    with pytest.raises(ValueError) as error:
        elmo_sentence_transformer(folder)
    assert one_line(error) == expected.format(folder)
    with pytest.raises(ValueError) as error:  # the saved folder's own ElmoConfig
        SentenceTransformer(str(saved), trust_remote_code=True)
    assert one_line(error) == expected.format(saved)
