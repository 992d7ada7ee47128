"""`hf-elmo convert` given careless or hostile input (original files, bilm-tf checkpoints, output folders): refused
with one line, nothing changed; interrupted while writing, nothing left.
"""

import shutil

import pytest
from hostile import (
    CONVERT,
    TF_CONVERT,
    Case,
    add_dataset,
    check_memory_refusal,
    check_refused,
    check_signal_while_writing,
    converted_earlier,
    edit_json,
    entry_of,
    rewrite_tf_index,
    run_memory_cases,
    scalar_softmax,
    symlink,
    tf_checkpoint,
    with_entry,
    write,
)

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "convert into the folder of its inputs, --force": Case(
        f"{CONVERT} --output-dir d --force",
        r"^error: d: holds the input d/options\.json; write the output elsewhere$",
        untouched=("d/options.json", "d/lm_weights.hdf5"),
    ),
    "convert --force over a folder with other files": Case(
        f"{CONVERT} --output-dir out --force",
        r"^error: out: holds 'notes\.txt', which is not part of a model folder .*--force replaces only such a folder",
        [converted_earlier("out"), write("out/notes.txt", "mine")],
        ("out/notes.txt", "out/model.safetensors"),
    ),
    "convert --force over a folder with a subfolder": Case(
        f"{CONVERT} --output-dir out --force",
        r"^error: out: holds 'sub', which is not part of a model folder",
        [converted_earlier("out"), write("out/sub/a.txt", "mine")],
        ("out/sub/a.txt",),
    ),
    "convert --force over the folder of another model type": Case(
        f"{CONVERT} --output-dir out --force",
        r"^error: out: holds 'config\.json', which is not part of a model folder",
        [converted_earlier("out"), edit_json("out/config.json", model_type="bert")],
    ),
    "convert to a symbolic link to a folder": Case(
        f"{CONVERT} --output-dir link --force",
        r"^error: link: is a symbolic link; give the folder itself or a new name$",
        [converted_earlier("out"), symlink("link", "out")],
    ),
    "convert into the current folder, --force": Case(
        f"{CONVERT} --output-dir . --force", r"^error: \.: is \(or holds\) the current folder; name another"
    ),
    "convert where nothing can be written": Case(
        f"{CONVERT} --output-dir /proc/elmo-out", r"^error: /proc/elmo-out: cannot write there \("
    ),
    # --- silent wrong answers: NaN, zero sizes, options that do not describe the weights ---
    "convert: NaN cell_clip in options.json": Case(
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"d/options\.json: field 'lstm\.cell_clip' must be a finite number, got nan",
        [edit_json("d/options.json", **{"lstm.cell_clip": float("nan")})],
        ("d/options.json", "d/lm_weights.hdf5"),
    ),
    "convert: options with fewer LSTM layers than the weights": Case(
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"d/lm_weights\.hdf5: dataset 'RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B' \(and 5 more\) is not part of the "
        r"model the options describe \(lstm\.n_layers = 1",
        [edit_json("d/options.json", **{"lstm.n_layers": 1})],
        ("d/lm_weights.hdf5",),
    ),
    "convert: options with fewer highway layers than the weights": Case(
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"dataset 'CNN_high_1/W_carry' \(and 3 more\) is not part of the model the options describe .*n_highway = 1",
        [edit_json("d/options.json", **{"char_cnn.n_highway": 1})],
    ),
    "convert: a dataset the options know nothing of": Case(
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"dataset 'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_extra' is not part of the model the options describe",
        [add_dataset],
    ),
    "convert: n_characters 100": Case(
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"d/options\.json: char_cnn\.n_characters must be 261 or 262 .*got 100",
        [edit_json("d/options.json", **{"char_cnn.n_characters": 100})],
    ),
    "convert: a folder as the weight file": Case(
        "convert --options d/options.json --weights d --output-dir out",
        r"^error: d: is a folder, expected the weight file",
    ),
    "convert: a folder as options.json": Case(
        "convert --options d --weights d/lm_weights.hdf5 --output-dir out", r"^error: d: is a folder, expected"
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "convert --tf-checkpoint: options beside it with fewer LSTM layers": Case(
        f"{TF_CONVERT} --output-dir out",
        r"^error: t/model\.ckpt-252\.index: variable 'lm/RNN_0/rnn/multi_rnn_cell/cell_1/lstm_cell/bias' \(and 5 "
        r"more\) is not part of the model the options describe \(lstm\.n_layers = 1,",
        [tf_checkpoint, edit_json("t/options.json", **{"lstm.n_layers": 1})],
    ),
    "convert --tf-checkpoint: --options with fewer highway layers": Case(
        f"{TF_CONVERT} --options o.json --output-dir out",
        r"^error: t/model\.ckpt-252\.index: variable 'lm/CNN_high_0/W_carry' \(and 3 more\) is not part of the model "
        r"the options describe .*char_cnn\.n_highway = 0",
        [
            tf_checkpoint,
            lambda root: shutil.copy(root / "t/options.json", root / "o.json"),
            edit_json("o.json", **{"char_cnn.n_highway": 0}),
        ],
    ),
    "convert --tf-checkpoint: a variable the options know nothing of": Case(
        f"{TF_CONVERT} --output-dir out",
        r"^error: t/model\.ckpt-252\.index: variable 'lm/CNN_proj/W_extra' is not part of the model the options",
        [tf_checkpoint, rewrite_tf_index(with_entry("lm/CNN_proj/W_extra", entry_of("lm/CNN_proj/b_proj")))],
    ),
    "convert --tf-checkpoint: a scalar softmax": Case(
        f"{TF_CONVERT} --output-dir out",
        r"^error: t/model\.ckpt-252\.index: variable 'lm/softmax/W' has shape \(\), expected \(vocabulary size, "
        r"lstm\.projection_dim = 32\)$",
        [tf_checkpoint, scalar_softmax],
    ),
    "convert --tf-checkpoint without --vocab": Case(
        "convert --tf-checkpoint t --output-dir out",
        r"^error: t: no vocabulary given \(--vocab\): the checkpoint's softmax holds one row per word but not the "
        r"words",
        [tf_checkpoint],
    ),
    # --- pipelines, sentence embeddings and model cards ---
    "convert --force over a folder whose README.md someone else wrote": Case(
        f"{CONVERT} --output-dir out --force",
        r"^error: out: holds 'README\.md', which is not part of a model folder",
        [converted_earlier("out"), write("out/README.md", "# My notes on this model\n")],
        ("out/README.md", "out/model.safetensors"),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    "options.json lstm.dim 10**9": (
        ("d/options.json", {"lstm.dim": 10**9}),
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"d/options\.json: ElmoConfig describes 5\.92e\+11 parameters, more than the limit of 2\*\*31",
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "options.json max_characters_per_token 10**9": (
        ("d/options.json", {"char_cnn.max_characters_per_token": 10**9}),
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"^error: d/options\.json: ElmoConfig\.max_characters_per_token is 1,000,000,000, more than the limit of 1,000 "
        r"slots per word\.$",
    ),
}


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory, converted_dirs, bilm_dir):
    return run_memory_cases(MEMORY_CASES, tmp_path_factory, converted_dirs, bilm_dir)


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_sizes_are_checked_before_anything_is_allocated(name, memory_results):
    check_memory_refusal(MEMORY_CASES[name], memory_results[name])


SIGNAL_CASES = {
    # name: (where the signal is sent from: module, class, method, on which call; the signal; the command)
    "convert, SIGINT after the weights are written": (
        ("hf_elmo.tokenization_elmo", "ElmoTokenizer", "save_pretrained", 1),
        "SIGINT",
        f"{CONVERT} --output-dir out",
    ),
}


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_signal_while_writing_leaves_nothing(name, workspace):
    check_signal_while_writing(SIGNAL_CASES[name], workspace)
