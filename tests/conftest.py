import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import hf_elmo  # noqa: F401  (registers the Auto classes)
from hf_elmo.convert_original_elmo import convert

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_SETS = {
    # name: (folder, sentence file); bilm-tf's model has skip connections off, allennlp's on.
    "bilm-tf": (FIXTURES / "bilm-tf", "lm_embeddings_sentences.json"),
    "allennlp": (FIXTURES / "allennlp", "sentences.json"),
}


def fixture_batches(name):
    """The 10 fixture batches of 3 sentences (word lists) and, per batch, the 3 expected top layers
    `(n_words, 2P)` (forward | backward, boundaries removed)."""
    folder, sentence_file = FIXTURE_SETS[name]
    sentences = json.loads((folder / sentence_file).read_text())
    expected_files = [h5py.File(folder / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    batches = []
    for i in range(10):
        words = [sentences[k][i].split() for k in range(3)]
        expected = [np.concatenate(list(f[str(i)][...]), axis=-1) for f in expected_files]
        batches.append((words, expected))
    for f in expected_files:
        f.close()
    return batches


@pytest.fixture(scope="session")
def converted_dirs(tmp_path_factory):
    """Each fixture model converted once per test session: name -> output folder."""
    dirs = {}
    for name, (folder, _) in FIXTURE_SETS.items():
        out = tmp_path_factory.mktemp("converted") / name
        convert(folder / "options.json", folder / "lm_weights.hdf5", out)
        dirs[name] = out
    return dirs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
