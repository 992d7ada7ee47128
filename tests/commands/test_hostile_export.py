"""`hf-elmo export` given careless or hostile input (model folders, output folders, ONNX options): refused with one
line, nothing changed; interrupted or out of disk while writing, nothing left.
"""

import pytest
from hostile import (
    Case,
    check_full_disk,
    check_memory_refusal,
    check_refused,
    check_signal_while_writing,
    edit_json,
    edit_weights,
    run_memory_cases,
    write,
)

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "export over the model it exports, --force": Case(
        "export --model M --output-dir M --force",
        r"^error: M: is the input M; write the output elsewhere$",
        untouched=("M/config.json", "M/model.safetensors"),
    ),
    "export into the model folder it reads": Case(
        "export --model M --output-dir M/original", r"^error: M/original: is inside the input M;"
    ),
    "export --force over a folder with other files": Case(
        "export --model M --output-dir out --force",
        r"^error: out: holds 'weights\.txt', which is not part of an original-format folder",
        [write("out/options.json", "{}"), write("out/weights.txt", "mine")],
    ),
    # --- stack traces and unclear messages ---
    "export: a missing tensor": Case(
        "export --model M --output-dir out",
        r"^error: M: the weights \(model\.safetensors\) lack 1 tensor\(s\) .*'encoder\.forward_layers\.1\.state_"
        r"projection\.weight' \(16, 64\)",
        [edit_weights("M", lambda t: t.pop("encoder.forward_layers.1.state_projection.weight"))],
    ),
    "export: config.json with fewer layers than the weights": Case(
        "export --model M --output-dir out",
        r"hold 'encoder\.backward_layers\.1\.input_linearity\.weight', which the biLM of config\.json \(num_layers=1",
        [edit_json("M/config.json", num_layers=1)],
    ),
    # --- export to ONNX (hf-elmo export --format onnx) ---
    "export --format onnx --force over a folder with other files": Case(
        "export --format onnx --model M --output-dir out --force",
        r"^error: out: holds 'notes\.txt', which is not part of an ONNX export folder \(model\.onnx\); --force "
        r"replaces only such a folder",
        [write("out/model.onnx", "an earlier export"), write("out/notes.txt", "mine")],
        ("out/model.onnx", "out/notes.txt"),
    ),
    "export --format onnx --force over an original-format export": Case(
        "export --format onnx --model M --output-dir out --force",
        r"^error: out: holds 'options\.json', which is not part of an ONNX export folder",
        [write("out/options.json", "{}"), write("out/weights.hdf5", "an earlier export")],
    ),
    "export --with-state of the original format": Case(
        "export --model M --output-dir out --with-state",
        r"^error: --with-state: only --format onnx has the LSTM state as inputs and outputs$",
    ),
    # --- export of the task heads (model.onnx of a folder saved as a head: its logits) ---
    "export --format onnx --with-state of a task head": Case(
        "export --format onnx --model M --output-dir out --with-state",
        r"^error: --with-state: M holds a task head \(ElmoForTokenClassification\), whose model\.onnx computes its "
        r"logits from each sentence's start state; only a biLM's \(ElmoModel, ElmoForBiLM\) has the LSTM state as "
        r"inputs and outputs$",
        [edit_json("M/config.json", architectures=["ElmoForTokenClassification"])],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    "config.json n_highway 10**7": (
        ("M/config.json", {"n_highway": 10**7}),
        "export --model M --output-dir out",
        r"ElmoConfig\.n_highway describes 10,000,000 layers, more than the limit of 1,000",
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
    "export --force over an earlier export, SIGHUP between two datasets": (
        ("h5py", "Group", "create_dataset", 3),
        "SIGHUP",
        "export --model M --output-dir earlier --force",
    ),
}


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_signal_while_writing_leaves_nothing(name, workspace):
    check_signal_while_writing(SIGNAL_CASES[name], workspace)


FULL_DISK_CASES = {
    # name: (command, the output it names)
    "export": ("export --model M --output-dir out", "out"),
}


@pytest.mark.parametrize("name", FULL_DISK_CASES)
def test_a_full_disk_is_one_line_and_leaves_nothing(name, workspace):
    check_full_disk(FULL_DISK_CASES[name], workspace)
