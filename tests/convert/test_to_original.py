"""`hf-elmo export`: back to the original options.json + weights.hdf5, bit for bit."""

import json

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURE_SETS

from hf_elmo import ElmoConfig, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.configuration_elmo import ARCHITECTURE_FIELDS
from hf_elmo.convert.original_format import config_from_options, load_original_elmo

SENTENCES = [["The", "bank", "of", "the", "river", "."], ["Über", "naïve", "日本語"], ["a"]]


def datasets(path):
    found = {}

    def collect(name, obj):  # returning a value would stop visititems
        if isinstance(obj, h5py.Dataset):
            found[name] = obj[...]

    with h5py.File(path, "r") as f:
        f.visititems(collect)
    return found


def export(model_dir, output_dir, *extra):
    return cli_main(["export", "--model", str(model_dir), "--output-dir", str(output_dir), *extra])


def layers(model):
    batch = ElmoTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.stack(model(**batch, output_hidden_states=True).hidden_states)


@pytest.mark.parametrize("name", FIXTURE_SETS)
def test_convert_then_export_gives_the_original_file_bit_for_bit(name, converted_dirs, tmp_path):
    folder = FIXTURE_SETS[name][0]
    assert export(converted_dirs[name], tmp_path / "out") == 0
    original, exported = datasets(folder / "lm_weights.hdf5"), datasets(tmp_path / "out/weights.hdf5")
    assert sorted(exported) == sorted(original) and len(original) == 33
    for key, array in original.items():
        assert exported[key].dtype == array.dtype == np.float32 and exported[key].shape == array.shape, key
        assert exported[key].tobytes() == array.tobytes(), key
    options = json.loads((folder / "options.json").read_text())
    exported_options = json.loads((tmp_path / "out/options.json").read_text())
    for section in ("lstm", "char_cnn"):
        assert exported_options[section] == options[section]
    assert config_from_options(exported_options).to_dict() == config_from_options(options).to_dict()


def test_fine_tuned_model_round_trips_exactly(converted_dirs, tmp_path):
    """A converted model changed here (as by fine-tuning): export -> convert gives the same weights and outputs."""
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"]).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    model.save_pretrained(tmp_path / "tuned")
    assert export(tmp_path / "tuned", tmp_path / "original") == 0
    again = load_original_elmo(tmp_path / "original/options.json", tmp_path / "original/weights.hdf5")
    fields = (*ARCHITECTURE_FIELDS, "forget_bias")
    assert [getattr(again.config, f) for f in fields] == [getattr(model.config, f) for f in fields]
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    assert torch.equal(layers(again), layers(model))


def test_model_trained_here_exports_with_the_forget_bias_folded(tmp_path):
    """A model built here adds no forget bias at run time; TF adds 1.0, so the file's bias is ours - 1 (rounded)."""
    config = ElmoConfig(char_embedding_dim=4, filters=[[1, 4], [2, 6]], n_highway=1, cell_dim=12, projection_dim=6)
    model = ElmoModel(config).eval()
    model.save_pretrained(tmp_path / "scratch")
    assert export(tmp_path / "scratch", tmp_path / "original") == 0
    exported = datasets(tmp_path / "original/weights.hdf5")
    bias = model.encoder.forward_layers[0].state_linearity.bias.detach()
    tf_bias = exported["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"]
    D = config.cell_dim
    # ours [i, f, g, o], TF's [i, j(=g), f, o]
    np.testing.assert_array_equal(tf_bias[:D], bias[:D].numpy())
    np.testing.assert_array_equal(tf_bias[D : 2 * D], bias[2 * D : 3 * D].numpy())
    np.testing.assert_allclose(tf_bias[2 * D : 3 * D], bias[D : 2 * D].numpy() - 1.0, rtol=0, atol=1e-7)
    again = load_original_elmo(tmp_path / "original/options.json", tmp_path / "original/weights.hdf5")
    np.testing.assert_allclose(layers(again).numpy(), layers(model).numpy(), rtol=1e-5, atol=1e-6)


def test_export_refuses_what_the_format_cannot_hold(tmp_path, capsys):
    config = ElmoConfig(
        char_embedding_dim=4,
        filters=[[1, 4]],
        n_highway=0,
        cell_dim=8,
        projection_dim=4,
        n_characters=30,
        char_vocabulary=True,
        input_word_vocab_size=10,
        input_word_dim=3,
    )
    ElmoModel(config).save_pretrained(tmp_path / "manylangs")
    capsys.readouterr()
    assert export(tmp_path / "manylangs", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "character vocabulary or word embeddings" in err
    assert not (tmp_path / "out").exists()


def test_export_needs_an_empty_output_folder(converted_dirs, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/notes.txt").write_text("mine")
    assert export(converted_dirs["allennlp"], tmp_path / "out") == 2
    assert "folder is not empty" in capsys.readouterr().err
    assert export(converted_dirs["allennlp"], tmp_path / "out", "--force") == 2  # --force replaces only an export
    assert "holds 'notes.txt', which is not part of an original-format folder" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
    (tmp_path / "out/notes.txt").unlink()
    assert export(converted_dirs["allennlp"], tmp_path / "out") == 0
    (tmp_path / "out/options.json").write_text("{}")
    assert export(converted_dirs["allennlp"], tmp_path / "out", "--force") == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["options.json", "weights.hdf5"]
    assert json.loads((tmp_path / "out/options.json").read_text())["lstm"]["dim"] == 64
