"""The converter of the original files (`options.json` + `weights.hdf5`): its folder loads through the Auto classes and
with remote code bit for bit, the command line entry points, its errors one line leaving nothing, `--force` replacing
only an earlier conversion.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES, as_a_folder_copy_runs, run_without_hf_elmo
from transformers import AutoModel, AutoTokenizer

from hf_elmo import ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert.original_format import load_original_elmo

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = FIXTURES / "allennlp/options.json"
WEIGHTS = FIXTURES / "allennlp/lm_weights.hdf5"
WORDS = [["The", "bank", "of", "the", "river", "."], ["I", "went", "to", "the", "bank", "to", "deposit", "money"]]


def embed(model, tokenizer):
    batch = tokenizer(WORDS, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.stack(model(**batch, output_hidden_states=True).hidden_states)


def test_converted_folder_loads_with_auto_classes_bit_identical(converted_dirs, tmp_path):
    folder = converted_dirs["allennlp"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "modeling_elmo.py"} <= {
        p.name for p in folder.iterdir()
    }
    model = AutoModel.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert isinstance(model, ElmoModel) and isinstance(tokenizer, ElmoTokenizer)
    expected = embed(load_original_elmo(OPTIONS, WEIGHTS), ElmoTokenizer())
    assert torch.equal(embed(model.eval(), tokenizer), expected)
    model.save_pretrained(tmp_path / "again")
    assert torch.equal(embed(AutoModel.from_pretrained(tmp_path / "again").eval(), tokenizer), expected)


def test_remote_code_loads_without_the_package(converted_dirs, tmp_path):
    folder = converted_dirs["bilm-tf"]
    with as_a_folder_copy_runs(AutoModel.from_pretrained(folder).eval()) as model:
        expected = embed(model, AutoTokenizer.from_pretrained(folder))
    script = textwrap.dedent(
        f"""
        import numpy, torch
        from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer
        model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        batch = tokenizer({WORDS!r}, is_split_into_words=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            layers = torch.stack(model(**batch, output_hidden_states=True).hidden_states)
        # the heads' code is in the converted folder too
        tagger = AutoModelForTokenClassification.from_pretrained({str(folder)!r}, trust_remote_code=True, num_labels=3)
        with torch.no_grad():
            assert tagger.eval()(**batch).logits.shape == (*batch["attention_mask"].shape, 3)
        numpy.save({str(tmp_path / "out.npy")!r}, layers.numpy())
        """
    )
    run_without_hf_elmo(script, tmp_path)
    assert np.array_equal(np.load(tmp_path / "out.npy"), expected.numpy())


def test_command_line_entry_points(tmp_path):
    script = [sys.executable, str(ROOT / "conversion/convert_original_elmo.py")]
    module = [sys.executable, "-m", "hf_elmo.commands", "convert"]
    for name, command in (("script", script), ("module", module)):
        args = ["--options", str(OPTIONS), "--weights", str(WEIGHTS), "--output-dir", str(tmp_path / name)]
        result = subprocess.run(command + args, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / name / "model.safetensors").is_file()
    from importlib.metadata import entry_points

    assert any(ep.value == "hf_elmo.commands.cli:main" for ep in entry_points(group="console_scripts", name="hf-elmo"))


def run_convert(options, weights, output_dir, *extra):
    return cli_main(
        ["convert", "--options", str(options), "--weights", str(weights), "--output-dir", str(output_dir), *extra]
    )


def edited_weights(tmp_path, edit):
    path = tmp_path / "weights.hdf5"
    shutil.copy(WEIGHTS, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def edited_options(tmp_path, edit):
    options = json.loads(OPTIONS.read_text())
    edit(options)
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return path


def resize(name, shape):
    def edit(f):
        del f[name]
        f[name] = np.zeros(shape, dtype=np.float32)

    return edit


def _delete(name):
    def edit(f):
        del f[name]

    return edit


ERROR_CASES = {
    "missing dataset": (
        lambda p: (OPTIONS, edited_weights(p, _delete("CNN_high_1/W_carry"))),
        "missing dataset 'CNN_high_1/W_carry'",
    ),
    "wrong shape": (
        lambda p: (OPTIONS, edited_weights(p, resize("CNN/W_cnn_2", (1, 3, 4, 15)))),
        r"dataset 'CNN/W_cnn_2' has shape \(1, 3, 4, 15\), expected \(1, 3, 4, 16\)",
    ),
    "wrong LSTM shape": (
        lambda p: (OPTIONS, edited_weights(p, resize("RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0", (32, 128)))),
        r"LSTMCell/W_0' has shape \(32, 128\), expected \(32, 256\)",
    ),
    "not finite": (
        lambda p: (OPTIONS, edited_weights(p, lambda f: f["CNN_proj/b_proj"].__setitem__(0, np.nan))),
        "'CNN_proj/b_proj' contains NaN",
    ),
    "not an HDF5 file": (
        lambda p: (OPTIONS, (p / "weights.hdf5", (p / "weights.hdf5").write_bytes(b"\x89HDF\0not really"))[0]),
        "not an HDF5 file",
    ),
    "truncated HDF5 file": (
        lambda p: (OPTIONS, (p / "w.hdf5", (p / "w.hdf5").write_bytes(WEIGHTS.read_bytes()[:5000]))[0]),
        "not an HDF5 file or corrupted",
    ),
    "missing weights": (lambda p: (OPTIONS, p / "absent.hdf5"), "no such weight file"),
    "bad JSON": (
        lambda p: ((p / "options.json", (p / "options.json").write_text('{"lstm": {'))[0], WEIGHTS),
        r"not valid JSON \(line 1, column 11",
    ),
    "missing options": (lambda p: (p / "absent.json", WEIGHTS), "no such options file"),
    "unknown activation": (
        lambda p: (edited_options(p, lambda o: o["char_cnn"].update(activation="gelu")), WEIGHTS),
        "char_cnn.activation must be 'relu' or 'tanh', got 'gelu'",
    ),
    "missing field": (
        lambda p: (edited_options(p, lambda o: o["lstm"].pop("projection_dim")), WEIGHTS),
        "missing field 'lstm.projection_dim'",
    ),
    "wrong type": (
        lambda p: (edited_options(p, lambda o: o["lstm"].update(dim="64")), WEIGHTS),
        "field 'lstm.dim' must be a int",
    ),
    "options disagree with weights": (
        lambda p: (edited_options(p, lambda o: o["lstm"].update(dim=32)), WEIGHTS),
        r"expected \(32, 128\)",
    ),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_converter_errors_are_one_line_and_leave_nothing(case, tmp_path, capsys):
    make_inputs, message = ERROR_CASES[case]
    options, weights = make_inputs(tmp_path)
    output = tmp_path / "out"
    before = set(tmp_path.iterdir())
    assert run_convert(options, weights, output) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert __import__("re").search(message, err), err
    assert not output.exists()
    assert set(tmp_path.iterdir()) == before, "a failed conversion left files behind"


def test_force_replaces_only_an_earlier_conversion(tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("user data")
    assert run_convert(OPTIONS, WEIGHTS, output) == 2
    assert "folder is not empty (use --force" in capsys.readouterr().err
    assert run_convert(OPTIONS, WEIGHTS, output, "--force") == 2
    assert "holds 'keep.txt', which is not part of a model folder" in capsys.readouterr().err
    assert [p.name for p in output.iterdir()] == ["keep.txt"] and (output / "keep.txt").read_text() == "user data"
    (output / "keep.txt").unlink()
    assert run_convert(OPTIONS, WEIGHTS, output) == 0
    config = (output / "config.json").read_text()
    (output / "config.json").write_text(config.replace('"cell_clip": 3', '"cell_clip": 2'))
    # A forced run that fails keeps the earlier output intact; one that succeeds replaces it.
    assert run_convert(OPTIONS, tmp_path / "absent.hdf5", output, "--force") == 2
    assert '"cell_clip": 2' in (output / "config.json").read_text()
    assert run_convert(OPTIONS, WEIGHTS, output, "--force") == 0
    assert (output / "config.json").read_text() == config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
