"""Reading bilm-tf's raw TensorFlow checkpoint without TensorFlow, and converting it to an ElmoForBiLM."""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import CHECKPOINT

from hf_elmo import ElmoForBiLM, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert.from_bilm_tf_checkpoint import convert_bilm_tf_checkpoint
from hf_elmo.convert.from_original import ElmoConversionError
from hf_elmo.convert.original_format import load_original_elmo
from hf_elmo.convert.tf_checkpoint import TFCheckpoint, TFCheckpointError, crc32c

TF_DIR = CHECKPOINT / "tf_checkpoint"
PREFIX = "model.ckpt-252"
VOCAB = CHECKPOINT / "vocab.txt"
CELL = "lm/RNN_{}/rnn/multi_rnn_cell/cell_{}/lstm_cell/"
# The variables listed in the fixture's README (its "checkpoint's variables" table).
EXPECTED_SHAPES = {
    "lm/char_embed": (261, 16),
    **{f"lm/CNN/W_cnn_{k}": (1, w, 16, n) for k, (w, n) in enumerate([[1, 16], [2, 16], [3, 32], [4, 64], [5, 64]])},
    **{f"lm/CNN/b_cnn_{k}": (n,) for k, n in enumerate([16, 16, 32, 64, 64])},
    "lm/CNN_high_0/W_carry": (192, 192),
    "lm/CNN_high_0/W_transform": (192, 192),
    "lm/CNN_high_0/b_carry": (192,),
    "lm/CNN_high_0/b_transform": (192,),
    "lm/CNN_proj/W_proj": (192, 32),
    "lm/CNN_proj/b_proj": (32,),
    **{CELL.format(d, layer) + "kernel": (64, 1024) for d in (0, 1) for layer in (0, 1)},
    **{CELL.format(d, layer) + "bias": (1024,) for d in (0, 1) for layer in (0, 1)},
    **{CELL.format(d, layer) + "projection/kernel": (256, 32) for d in (0, 1) for layer in (0, 1)},
    "lm/softmax/W": (2149, 32),
    "lm/softmax/b": (2149,),
}


def test_crc32c_check_value():
    # The CRC-32C check value of the standard test vector (RFC 3720, iSCSI).
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


def test_reads_every_variable_with_its_checksum():
    checkpoint = TFCheckpoint(TF_DIR)
    assert checkpoint.prefix == TF_DIR / PREFIX and checkpoint.num_shards == 1
    slots = {f"{name}/Adagrad": shape for name, shape in EXPECTED_SHAPES.items()}
    expected = {**EXPECTED_SHAPES, **slots, "global_step": (), "train_perplexity": ()}
    assert {name: v.shape for name, v in checkpoint.variables.items()} == expected
    assert {v.dtype_name for v in checkpoint.variables.values()} == {"float32"}
    # Reading checks each tensor against the CRC32C TensorFlow stored (large ones take the chunked path).
    values = {name: checkpoint.read(name) for name in checkpoint.variables}
    assert values["global_step"] == 252.0 and values["train_perplexity"] == 0.0
    assert all(values[name].shape == shape and values[name].dtype == np.float32 for name, shape in expected.items())
    # The same checkpoint through its prefix and through its .index file.
    for path in (TF_DIR / PREFIX, TF_DIR / f"{PREFIX}.index"):
        assert np.array_equal(TFCheckpoint(path).read("lm/softmax/b"), values["lm/softmax/b"])


def test_checkpoint_and_weights_hdf5_give_the_same_model(checkpoint_dir):
    bilm = ElmoForBiLM.from_pretrained(checkpoint_dir).eval()
    from_hdf5 = load_original_elmo(CHECKPOINT / "options.json", CHECKPOINT / "weights.hdf5")
    ours, theirs = bilm.elmo.state_dict(), from_hdf5.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    checkpoint = TFCheckpoint(TF_DIR)
    assert np.array_equal(bilm.softmax.weight.detach().numpy(), checkpoint.read("lm/softmax/W"))
    assert np.array_equal(bilm.softmax.bias.detach().numpy(), checkpoint.read("lm/softmax/b"))
    assert bilm.config.vocab_size == 2149 and bilm.config.forget_bias == 1.0
    assert bilm.config.num_softmax_samples == 256 and bilm.config.dropout == 0.1
    tokenizer = ElmoTokenizer.from_pretrained(checkpoint_dir)
    assert tokenizer.word_vocabulary == (CHECKPOINT / "vocab.txt").read_text(encoding="utf-8").split()
    lines = [line.split() for line in (CHECKPOINT / "heldout.txt").read_text(encoding="utf-8").splitlines()[:24]]
    batch = tokenizer(lines, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = bilm.elmo(**batch, output_hidden_states=True).hidden_states
        expected = from_hdf5(**batch, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(layers, expected))


def copy_checkpoint(tmp_path, *, index=True, data=True):
    folder = tmp_path / "ckpt"
    folder.mkdir(parents=True)
    for name in ("checkpoint", "options.json"):
        shutil.copy(TF_DIR / name, folder / name)
    if index:
        shutil.copy(TF_DIR / f"{PREFIX}.index", folder / f"{PREFIX}.index")
    if data:
        shutil.copy(TF_DIR / f"{PREFIX}.data-00000-of-00001", folder / f"{PREFIX}.data-00000-of-00001")
    return folder


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path, size):
    path.write_bytes(path.read_bytes()[:size])


SOFTMAX = TFCheckpoint(TF_DIR).variables["lm/softmax/W"]
READ_ERRORS = {
    "missing shard": (lambda f: (f / f"{PREFIX}.data-00000-of-00001").unlink(), "missing data shard 1 of 1"),
    "truncated shard": (
        lambda f: _truncate(f / f"{PREFIX}.data-00000-of-00001", SOFTMAX.offset + 100),
        f"truncated: variable 'lm/softmax/W' needs bytes {SOFTMAX.offset}..{SOFTMAX.offset + SOFTMAX.size} but the "
        f"file has {SOFTMAX.offset + 100}",
    ),
    "damaged shard": (
        lambda f: _flip_byte(f / f"{PREFIX}.data-00000-of-00001", SOFTMAX.offset + 7),
        "damaged: the bytes of variable 'lm/softmax/W' do not match their checksum",
    ),
    "damaged index": (lambda f: _flip_byte(f / f"{PREFIX}.index", 40), "damaged index (checksum mismatch"),
    "truncated index": (lambda f: _truncate(f / f"{PREFIX}.index", 1000), "not a TensorFlow checkpoint index"),
    "no index": (lambda f: (f / f"{PREFIX}.index").unlink(), "names checkpoint 'model.ckpt-252', but"),
    "no state file": (
        lambda f: [(f / "checkpoint").unlink(), (f / f"{PREFIX}.index").unlink()],
        "no 'checkpoint' state file and no .index file",
    ),
    "bad state file": (
        lambda f: (f / "checkpoint").write_text("all_model_checkpoint_paths: 'x'\n"),
        "no model_checkpoint_path line",
    ),
}


@pytest.mark.parametrize("case", READ_ERRORS)
def test_damaged_checkpoints_give_one_line_errors(case, tmp_path):
    damage, message = READ_ERRORS[case]
    folder = copy_checkpoint(tmp_path)
    damage(folder)
    with pytest.raises(TFCheckpointError, match=None) as error:
        checkpoint = TFCheckpoint(folder)
        for name in checkpoint.variables:
            checkpoint.read(name)
    assert message in str(error.value) and "\n" not in str(error.value)
    # The same error from the command, and no output folder.
    out = str(tmp_path / "out")
    assert cli_main(["convert", "--tf-checkpoint", str(folder), "--vocab", str(VOCAB), "--output-dir", out]) == 2
    assert not (tmp_path / "out").exists()


def _options(tmp_path, **changes):
    options = json.loads((TF_DIR / "options.json").read_text())
    for path, value in changes.items():
        *parents, key = path.split("__")
        target = options
        for parent in parents:
            target = target[parent]
        target[key] = value
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return path


def _short_vocab(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join((CHECKPOINT / "vocab.txt").read_text(encoding="utf-8").split()[:-1]) + "\n")
    return path


CONVERT_ERRORS = {
    "options disagree with a tensor": (
        lambda t: {"options_path": _options(t, lstm__dim=128)},
        "variable 'lm/RNN_0/rnn/multi_rnn_cell/cell_0/lstm_cell/kernel' has shape (64, 1024), but "
        "{tmp}/options.json implies (64, 512)",
    ),
    "filters disagree with a tensor": (
        lambda t: {"options_path": _options(t, char_cnn__filters=[[1, 16], [2, 16], [3, 32], [4, 64], [6, 64]])},
        "variable 'lm/CNN/W_cnn_4' has shape (1, 5, 16, 64), but",
    ),
    "vocabulary size in the options": (
        lambda t: {"options_path": _options(t, n_tokens_vocab=2000)},
        "n_tokens_vocab is 2000, but the checkpoint's softmax 'lm/softmax/W' has 2149 rows",
    ),
    "vocabulary file of another length": (
        lambda t: {"vocab_path": _short_vocab(t)},
        "vocab.txt: 2148 words, but the checkpoint's softmax has 2149 rows",
    ),
    "unidirectional options": (
        lambda t: {"options_path": _options(t, bidirectional=False)},
        "bidirectional is false; only bidirectional biLMs can be converted",
    ),
}


@pytest.mark.parametrize("case", CONVERT_ERRORS)
def test_conversion_errors_name_the_problem(case, tmp_path):
    arguments, message = CONVERT_ERRORS[case]
    with pytest.raises(ElmoConversionError) as error:
        convert_bilm_tf_checkpoint(TF_DIR, tmp_path / "out", **{"vocab_path": VOCAB, **arguments(tmp_path)})
    assert message.format(tmp=tmp_path) in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_missing_options_and_bad_flag_combinations(tmp_path, capsys):
    folder = copy_checkpoint(tmp_path)
    (folder / "options.json").unlink()
    with pytest.raises(ElmoConversionError, match="no options.json beside the checkpoint .* give it with --options"):
        convert_bilm_tf_checkpoint(folder, tmp_path / "out", VOCAB)
    out = str(tmp_path / "out")
    runs = {
        ("--tf-checkpoint", str(TF_DIR), "--weights", "w.hdf5"): "--tf-checkpoint takes --vocab and --options",
        ("--options", "o.json", "--weights", "w.hdf5", "--vocab", "v.txt"): "--vocab goes with --tf-checkpoint",
    }
    for arguments, message in runs.items():
        assert cli_main(["convert", *arguments, "--output-dir", out]) == 2
        assert message in capsys.readouterr().err
    # Given explicitly, an options.json elsewhere is used.
    convert_bilm_tf_checkpoint(folder, tmp_path / "out", VOCAB, options_path=TF_DIR / "options.json")
    assert (tmp_path / "out/model.safetensors").is_file()


def test_continued_training_starts_from_the_checkpoint(checkpoint_dir, tmp_path, capsys):
    """`hf-elmo train --init-from` a converted checkpoint: its softmax and vocabulary are taken over, not re-made."""
    arguments = [
        "train",
        "--init-from",
        str(checkpoint_dir),
        "--train-files",
        str(CHECKPOINT / "heldout.txt"),
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "1",
        "--per-device-train-batch-size",
        "2",
        "--window",
        "160",
        "--learning-rate",
        "1e-9",
        "--disable-tqdm",
        "--dropout",
        "0",
    ]
    assert cli_main(arguments) == 0
    assert "biLM and softmax continue from the checkpoint" in capsys.readouterr().out
    before = ElmoForBiLM.from_pretrained(checkpoint_dir).state_dict()
    after = ElmoForBiLM.from_pretrained(tmp_path / "run").state_dict()
    # One step of a negligible learning rate: the run began with the checkpoint's weights, softmax included.
    assert before.keys() == after.keys() and max((before[k] - after[k]).abs().max() for k in before) < 1e-6


def test_convert_command_with_vocabulary_and_warm_state(tmp_path, capsys):
    out = tmp_path / "bilm"
    arguments = [
        "convert",
        "--tf-checkpoint",
        str(TF_DIR / PREFIX),
        "--vocab",
        str(VOCAB),
        "--output-dir",
        str(out),
        "--warm-state-text",
        str(CHECKPOINT / "train.txt"),
        "--warm-state-sentences",
        "20",
    ]
    assert cli_main(arguments) == 0
    assert f"Converted ELMo written to {out}" in capsys.readouterr().out
    model = ElmoForBiLM.from_pretrained(out)
    assert model.config.warm_state and model.elmo.warm_hidden.abs().sum() > 0
    assert len(ElmoTokenizer.from_pretrained(out).word_vocabulary) == 2149


# --- crafted checkpoints for the error paths the real one cannot reach ----------------------------------------------


def _varint(value):
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number, value):
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def _masked(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _entry(dtype=1, shape=(), offset=0, size=0, data=b"", sliced=False):
    """A BundleEntryProto: dtype, shape, shard 0, offset, size, masked CRC32C of `data`, optional slices."""
    dims = b"".join(_field(2, _field(1, d)) for d in shape)
    message = _field(1, dtype) + _field(2, dims) + _field(4, offset) + _field(5, size)
    message += _varint(6 << 3 | 5) + _masked(data).to_bytes(4, "little")
    return message + (_field(7, b"") if sliced else b"")


def _block(entries):
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + (0).to_bytes(4, "little") + (1).to_bytes(4, "little")


def write_index(path, entries, compression=0):
    """An SSTable as TensorFlow writes it (one data block, its index block, an empty meta-index, the footer)."""
    out = bytearray()

    def add(block, kind=0):
        offset = len(out)
        out.extend(block + bytes([kind]) + _masked(block + bytes([kind])).to_bytes(4, "little"))
        return _varint(offset) + _varint(len(block))

    data_handle = add(_block(sorted(entries)), compression)
    meta_handle = add(_block([]))
    index_handle = add(_block([(b"\xff", data_handle)]))
    footer = (meta_handle + index_handle).ljust(40, b"\0") + (0xDB4775248B80FB57).to_bytes(8, "little")
    path.write_bytes(bytes(out) + footer)


HEADER = (b"", _field(1, 1))


def crafted(tmp_path, entries, data=b"", compression=0):
    folder = tmp_path / "crafted"
    folder.mkdir(exist_ok=True)
    write_index(folder / "model.ckpt-1.index", entries, compression)
    (folder / "model.ckpt-1.data-00000-of-00001").write_bytes(data)
    return folder / "model.ckpt-1"


def test_crafted_table_reads_back(tmp_path):
    values = np.arange(6, dtype="<f4").tobytes()
    prefix = crafted(tmp_path, [HEADER, (b"x", _entry(1, (2, 3), 0, 24, values))], values)
    assert np.array_equal(TFCheckpoint(prefix).read("x"), np.arange(6, dtype=np.float32).reshape(2, 3))


CRAFTED_ERRORS = {
    "string variable": ([HEADER, (b"x", _entry(7, (2,), 0, 0))], b"", "variable 'x' has type string, not a number"),
    "partitioned variable": (
        [HEADER, (b"x", _entry(1, (1,), 0, 4, b"\0" * 4, sliced=True))],
        b"\0" * 4,
        "'x' is partitioned into slices",
    ),
    "size against shape": (
        [HEADER, (b"x", _entry(1, (3,), 0, 8, b"\0" * 8))],
        b"\0" * 8,
        "variable 'x' records 8 bytes, but float32 (3,) needs 12",
    ),
    "no header": ([(b"x", _entry(1, (1,), 0, 4, b"\0" * 4))], b"\0" * 4, "no bundle header"),
    "undecodable entry": ([HEADER, (b"x", b"\x0a\x09ab")], b"", "an entry cannot be decoded"),
    "unknown variable": ([HEADER], b"", "no variable 'x' in this checkpoint"),
}


@pytest.mark.parametrize("case", CRAFTED_ERRORS)
def test_crafted_checkpoint_errors(case, tmp_path):
    entries, data, message = CRAFTED_ERRORS[case]
    with pytest.raises(TFCheckpointError, match=None) as error:
        TFCheckpoint(crafted(tmp_path, entries, data)).read("x")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_crafted_layout_errors(tmp_path):
    prefix = crafted(tmp_path, [HEADER], compression=1)
    with pytest.raises(TFCheckpointError, match="index block compressed with method 1; only uncompressed tables"):
        TFCheckpoint(prefix)
    folder = prefix.parent
    write_index(folder / "model.ckpt-2.index", [HEADER])
    with pytest.raises(TFCheckpointError, match="no 'checkpoint' state file and 2 .index files; give the checkpoint"):
        TFCheckpoint(folder)
    write_index(folder / "model.ckpt-1.index", [HEADER, (b"x", _entry(1, (1,), 0, 4, b"\0" * 4))])
    (folder / "model.ckpt-1.data-00000-of-00001").unlink()
    (folder / "model.ckpt-1.data-00000-of-00001").mkdir()
    with pytest.raises(TFCheckpointError, match="is a folder, expected the data shard holding 'x'"):
        TFCheckpoint(prefix).read("x")
    with pytest.raises(TFCheckpointError, match="no such TensorFlow checkpoint"):
        TFCheckpoint(tmp_path / "nothing-here")


def _without(tmp_path, names, replace=None, extra_data=b""):
    """The fixture's checkpoint with the index rewritten: `names` dropped, `replace` entries swapped in (their
    data appended to a copy of the shard)."""
    from hf_elmo.convert.tf_checkpoint import _table_entries

    folder = copy_checkpoint(tmp_path)
    shard = folder / f"{PREFIX}.data-00000-of-00001"
    entries = [(k, v) for k, v in _table_entries(str(TF_DIR / f"{PREFIX}.index")) if k.decode() not in names]
    if replace:
        offset = shard.stat().st_size
        shard.write_bytes(shard.read_bytes() + extra_data)
        entries = [(k, v) for k, v in entries if k.decode() not in replace]
        entries += [(name.encode(), make(offset)) for name, make in replace.items()]
    write_index(folder / f"{PREFIX}.index", entries)
    return folder


def test_converter_errors_on_crafted_variables(tmp_path):
    missing_softmax = _without(tmp_path / "a", {"lm/softmax/W"})
    with pytest.raises(ElmoConversionError, match="missing variable 'lm/softmax/W' \\(the word softmax of a bilm-tf"):
        convert_bilm_tf_checkpoint(missing_softmax, tmp_path / "out", VOCAB)
    missing_cnn = _without(tmp_path / "b", {"lm/CNN/W_cnn_0"})
    with pytest.raises(ElmoConversionError, match="missing variable 'lm/CNN/W_cnn_0' \\(char_cnn.filters\\[0\\]"):
        convert_bilm_tf_checkpoint(missing_cnn, tmp_path / "out", VOCAB)
    nan = np.full(32, np.nan, dtype="<f4").tobytes()
    with_nan = _without(tmp_path / "c", set(), {"lm/CNN_proj/b_proj": lambda o: _entry(1, (32,), o, 128, nan)}, nan)
    with pytest.raises(ElmoConversionError, match="variable 'lm/CNN_proj/b_proj' contains NaN or infinite values"):
        convert_bilm_tf_checkpoint(with_nan, tmp_path / "out", VOCAB)
    doubles = np.zeros(32, dtype="<f8").tobytes()
    as_int = _without(
        tmp_path / "d", set(), {"lm/CNN_proj/b_proj": lambda o: _entry(3, (32,), o, 128, doubles[:128])}, doubles[:128]
    )
    with pytest.raises(ElmoConversionError, match="variable 'lm/CNN_proj/b_proj' has type int32, expected float32"):
        convert_bilm_tf_checkpoint(as_int, tmp_path / "out", VOCAB)
    options = json.loads((TF_DIR / "options.json").read_text())
    del options["char_cnn"]
    (tmp_path / "words.json").write_text(json.dumps(options))
    with pytest.raises(ElmoConversionError, match="no char_cnn section; only character-input biLMs"):
        convert_bilm_tf_checkpoint(TF_DIR, tmp_path / "out", VOCAB, options_path=tmp_path / "words.json")
    assert not (tmp_path / "out").exists()
