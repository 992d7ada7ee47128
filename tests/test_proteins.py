"""Protein sequences (SeqVec, Heinzinger et al. 2019): SeqVec's usage code on `hf_elmo.compat.allennlp` gives AllenNLP
0.9's numbers on SeqVec-shaped models (`tests/fixtures/seqvec/`, made by AllenNLP's own code)."""

import json

import numpy as np
import pytest
from conftest import FIXTURES
from seqvec_shaped import SEQVEC_OPTIONS, SMALL_OPTIONS, write_seqvec_shaped

from hf_elmo.compat.allennlp import ElmoEmbedder

SEQVEC_FIXTURE = FIXTURES / "seqvec" / "allennlp_outputs.npz"
MODEL_OPTIONS = {"seqvec": SEQVEC_OPTIONS, "small": SMALL_OPTIONS}


@pytest.fixture(scope="session")
def seqvec_shaped_models(tmp_path_factory):
    """name -> (options.json, weights.hdf5) of the fixture's models, written once per session."""
    folder = tmp_path_factory.mktemp("seqvec-shaped")
    return {name: write_seqvec_shaped(folder / name, options) for name, options in MODEL_OPTIONS.items()}


def stored_rows(length: int) -> list[int]:
    # The residues the fixture keeps (conversion/seqvec_reference_outputs.py).
    step = max(1, length // 8)
    return sorted({0, 1, length - 2, length - 1, *range(0, length, step)} & set(range(length)))


def assert_matches_allennlp(embedding: np.ndarray, expected: dict, where: str):
    """`embedding` `(3, L, 2P)` against AllenNLP's stored rows and reductions. A value of a network of thousands of
    float32 products per value is compared within 1e-5 of its layer's largest magnitude (docs/testing.md); the
    per-protein vector sums the three layers, so its bound is the sum of theirs."""
    rows = embedding[:, stored_rows(embedding.shape[1])]
    assert rows.shape == expected["rows"].shape, where
    layer_bounds = 1e-5 * np.abs(expected["rows"]).max(axis=(1, 2))
    assert (np.abs(rows - expected["rows"]).max(axis=(1, 2)) <= layer_bounds).all(), where
    assert (np.abs(embedding.mean(axis=1) - expected["layer_means"]).max(axis=1) <= layer_bounds).all(), where
    per_protein = embedding.sum(axis=0).mean(axis=0)  # SeqVec's per-protein vector
    assert np.abs(per_protein - expected["per_protein"]).max() <= layer_bounds.sum(), where


@pytest.mark.parametrize("model", ["seqvec", "small"])
def test_seqvec_usage_gives_allennlps_numbers(seqvec_shaped_models, model):
    """SeqVec's calls, in the fixture's order on one embedder (state carried from call to call, as AllenNLP 0.9
    does): `embed_sentence(list(seq))`, `embed_batch([list(s) ...])`, `embed_sentences`, from 1 to 5,000 residues
    (the long ones on the small model of the same structure)."""
    stored = np.load(SEQVEC_FIXTURE)
    options_file, weight_file = seqvec_shaped_models[model]
    embedder = ElmoEmbedder(str(options_file), str(weight_file), cuda_device=-1)
    calls = json.loads(str(stored[f"{model}/calls"]))
    assert max(len(s) for _, sequences in calls for s in sequences) == (90 if model == "seqvec" else 5000)
    for c, (kind, sequences) in enumerate(calls):
        if kind == "embed_sentence":
            embeddings = [embedder.embed_sentence(list(sequences[0]))]
        elif kind == "embed_batch":
            embeddings = embedder.embed_batch([list(seq) for seq in sequences])
        else:
            embeddings = list(embedder.embed_sentences((list(seq) for seq in sequences), batch_size=2))
        for k, (sequence, embedding) in enumerate(zip(sequences, embeddings, strict=True)):
            hidden = 2 * MODEL_OPTIONS[model]["lstm"]["projection_dim"]
            assert embedding.shape == (3, len(sequence), hidden) and embedding.dtype == np.float32
            key = f"{model}/call_{c}/sequence_{k}"
            expected = {name: stored[f"{key}/{name}"] for name in ("rows", "layer_means", "per_protein")}
            assert_matches_allennlp(embedding, expected, key)
