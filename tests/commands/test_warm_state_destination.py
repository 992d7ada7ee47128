"""`hf-elmo warm-state` writes a new folder (`--output-dir`, the model folder untouched) or rewrites the model folder
when asked (`--in-place`), never unasked."""

import re
import shutil

import pytest
from safetensors.torch import load_file

from hf_elmo.commands.cli import main as cli_main

TEXT = "the cat sat on the mat .\na dog ran .\nit rained all day in the town .\n"


def folder_bytes(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


@pytest.fixture
def model_dir(converted_dirs, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(converted_dirs["allennlp"], folder)
    (tmp_path / "text.txt").write_text(TEXT)
    return folder


def test_output_dir_is_the_in_place_result_and_leaves_the_model_folder(model_dir, tmp_path, capsys):
    before = folder_bytes(model_dir)
    text = str(tmp_path / "text.txt")
    arguments = ["warm-state", "--model", str(model_dir), text, "--device", "cpu"]
    assert cli_main([*arguments, "--output-dir", str(tmp_path / "warm")]) == 0
    assert f"written to {tmp_path / 'warm'}" in capsys.readouterr().out
    assert folder_bytes(model_dir) == before

    in_place = tmp_path / "in-place"
    shutil.copytree(model_dir, in_place)
    assert cli_main(["warm-state", "--model", str(in_place), text, "--device", "cpu", "--in-place"]) == 0
    written, rewritten = folder_bytes(tmp_path / "warm"), folder_bytes(in_place)
    assert written.keys() == rewritten.keys() == before.keys()
    for name in written.keys() - {"model.safetensors"}:
        assert written[name] == rewritten[name], name
    tensors, expected = load_file(tmp_path / "warm" / "model.safetensors"), load_file(in_place / "model.safetensors")
    assert tensors.keys() == expected.keys() and {"warm_hidden", "warm_memory"} <= tensors.keys()
    assert all(tensors[key].equal(expected[key]) for key in tensors)
    assert b'"warm_state": true' in written["config.json"] and b'"warm_state": true' not in before["config.json"]


@pytest.mark.parametrize(
    "destination, message",
    [
        ([], r"name --output-dir DIR for a new folder .* or --in-place to rewrite"),
        (["--output-dir", "{model}/inside"], "is inside the input"),
        (["--output-dir", "{taken}"], r"folder is not empty \(use --force to replace it\)"),
        (["--in-place", "--force"], "--force goes with --output-dir"),
    ],
)
def test_no_destination_or_a_taken_one_is_a_one_line_error_before_any_work(
    destination, message, model_dir, tmp_path, capsys
):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    destination = [part.format(model=model_dir, taken=taken) for part in destination]
    before = folder_bytes(model_dir)
    assert cli_main(["warm-state", "--model", str(model_dir), str(tmp_path / "text.txt"), *destination]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and re.search(message, error), error
    assert folder_bytes(model_dir) == before and folder_bytes(taken) == {"notes.txt": b"mine"}


def test_output_dir_and_in_place_exclude_each_other(model_dir, tmp_path, capsys):
    arguments = ["warm-state", "--model", str(model_dir), str(tmp_path / "text.txt")]
    with pytest.raises(SystemExit):
        cli_main([*arguments, "--in-place", "--output-dir", str(tmp_path / "warm")])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "warm").exists()
