"""What the suite shares: one intra-op thread per process, the fixtures' files and batches, the fixture models
converted once per session, the reference-path model, the rounding bound of a float32 sum.
"""

import contextlib
import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # The GPU path's Triton kernels then run on CPU tensors, interpreted (set before hf_elmo defines them).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import hf_elmo  # noqa: F401  (registers the Auto classes)
from hf_elmo import ElmoModel, ElmoPaths
from hf_elmo.convert.from_bilm_tf_checkpoint import convert_bilm_tf_checkpoint
from hf_elmo.convert.from_original import convert

# The suite's models are tiny: a second intra-op thread gains nothing, and on a busy machine every multi-threaded
# operation ends in a barrier that waits for a descheduled thread. The processes tests start get the same count (their
# numbers are compared exactly with this process's). Tests of threading set their own counts.
torch.set_num_threads(1)
os.environ["OMP_NUM_THREADS"] = "1"

# The hostile-input tables of every folder share their working folder and checks (`workspace`, `bilm_dir`).
pytest_plugins = ["hostile"]

FIXTURES = Path(__file__).parent / "fixtures"
# A biLM trained by bilm-tf, its raw TensorFlow checkpoint and bilm-tf's own held-out numbers (README there).
CHECKPOINT = FIXTURES / "bilm-tf-checkpoint"
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


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """The bilm-tf checkpoint converted once per test session (ElmoForBiLM with softmax and vocabulary)."""
    out = tmp_path_factory.mktemp("checkpoint") / "bilm"
    return convert_bilm_tf_checkpoint(CHECKPOINT / "tf_checkpoint", out, vocab_path=CHECKPOINT / "vocab.txt")


class ReferenceElmo(ElmoModel):
    """`ElmoModel` on the reference paths (`ElmoPaths.reference()`), called as `(input_ids, attention_mask, state,
    input_word_ids)` and returning `(num_layers + 1 layers, final state)`."""

    def forward(self, input_ids, attention_mask=None, state=None, input_word_ids=None):
        out = super().forward(
            input_ids, attention_mask, state, use_cache=True, output_hidden_states=True, input_word_ids=input_word_ids
        )
        return list(out.hidden_states), out.state


def reference_from(model) -> ReferenceElmo:
    """The reference path of `model` on a copy of its weights, in its dtype, on its device, in its mode."""
    config = copy.deepcopy(model.config)
    config.paths = ElmoPaths.reference().to_dict()
    reference = ReferenceElmo(config)
    reference.load_state_dict(model.state_dict())
    parameter = next(model.parameters())
    return reference.to(device=parameter.device, dtype=parameter.dtype).train(model.training)


def rounding_bound(sum_of_magnitudes: torch.Tensor, terms: int, dtype=torch.float32) -> torch.Tensor:
    """The most a sum of `terms` products computed in `dtype` can differ from the exact sum, in any order, with or
    without fused multiply-adds: gamma_terms * sum |a_i b_i| (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., eq. 3.5), given `sum_of_magnitudes` = sum |a_i b_i| (any shape, float64)."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return terms * unit_roundoff / (1 - terms * unit_roundoff) * sum_of_magnitudes


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


_BLOCK_HF_ELMO = """
import importlib.abc, sys
class BlockHfElmo(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "hf_elmo" or name.startswith("hf_elmo."):
            raise ImportError("hf_elmo is blocked in this test")
sys.meta_path.insert(0, BlockHfElmo())
"""


@contextlib.contextmanager
def as_a_folder_copy_runs(model):
    """`model` runs the paths its folder's copy of the code runs where hf_elmo is not installed: the PyTorch operations
    where the compiled CPU loops would run (their C++ source is package data, which the copy does not carry)."""
    saved = dict(model.config.paths)
    model.config.paths = {**saved, "window_max": "torch", "lstm_kernels": "torch", "dropout": "torch"}
    try:
        yield model
    finally:
        model.config.paths = saved


def run_without_hf_elmo(script: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    """Runs `script` in a fresh Python where `hf_elmo` cannot be imported (as for a user who only has
    transformers), with its own remote-code module cache under `cwd`; fails the test on a non-zero exit."""
    env = {**os.environ, "HF_MODULES_CACHE": str(Path(cwd) / "modules"), "PYTHONPATH": "", **env}
    code = _BLOCK_HF_ELMO + textwrap.dedent(script)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
