"""Weights of an integer or bool dtype in an original `weights.hdf5` or an ELMoForManyLangs checkpoint: refused in
one line naming the file and the dataset, by the converters and by the compatibility loaders, never cast to float."""

import re
import shutil

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES

from hf_elmo.commands.cli import main as cli_main
from hf_elmo.compat.allennlp import Elmo
from hf_elmo.compat.elmoformanylangs import Embedder
from hf_elmo.io.files import ElmoInputError

DTYPES = [np.int32, np.int64, np.bool_]
DATASET = "CNN_proj/b_proj"


@pytest.fixture(params=DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def integer_weights(request, tmp_path):
    """The allennlp fixture's weight file with one dataset rewritten in an integer or bool dtype (values that a cast
    to float would take without loss)."""
    folder = tmp_path / "original"
    folder.mkdir()
    shutil.copy(FIXTURES / "allennlp/options.json", folder / "options.json")
    weights = folder / "weights.hdf5"
    shutil.copy(FIXTURES / "allennlp/lm_weights.hdf5", weights)
    with h5py.File(weights, "r+") as file:
        shape = file[DATASET].shape
        del file[DATASET]
        file.create_dataset(DATASET, data=np.ones(shape, dtype=request.param))
    return folder, np.dtype(request.param).name


def test_convert_refuses_an_integer_dataset_in_one_line(integer_weights, tmp_path, capsys):
    folder, dtype = integer_weights
    output = tmp_path / "converted"
    arguments = ["--options", str(folder / "options.json"), "--weights", str(folder / "weights.hdf5")]
    assert cli_main(["convert", *arguments, "--output-dir", str(output)]) == 2
    error = capsys.readouterr().err
    assert error == f"error: {folder / 'weights.hdf5'}: dataset '{DATASET}' has dtype {dtype}, expected float\n"
    assert not output.exists()


def test_allennlp_elmo_refuses_an_integer_dataset(integer_weights):
    folder, dtype = integer_weights
    message = f"{folder / 'weights.hdf5'}: dataset '{DATASET}' has dtype {dtype}, expected float"
    with pytest.raises(ElmoInputError, match=f"^{re.escape(message)}$"):
        Elmo(str(folder / "options.json"), str(folder / "weights.hdf5"), num_output_representations=1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
def test_elmoformanylangs_refuses_an_integer_tensor(dtype, tmp_path, capsys):
    folder = tmp_path / "zz.model"
    shutil.copytree(FIXTURES / "elmoformanylangs/zz.model", folder)
    state = torch.load(folder / "token_embedder.pkl", map_location="cpu", weights_only=True)
    state["projection.bias"] = torch.ones_like(state["projection.bias"], dtype=dtype)
    torch.save(state, folder / "token_embedder.pkl")
    message = f"{folder / 'token_embedder.pkl'}: 'projection.bias' must hold finite floats"
    with pytest.raises(ElmoInputError, match=f"^{re.escape(message)}$"):
        Embedder(str(folder))
    output = tmp_path / "converted"
    arguments = ["--format", "elmoformanylangs", "--model-dir", str(folder), "--output-dir", str(output)]
    assert cli_main(["convert", *arguments]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not output.exists()
