"""`hf-elmo embed` given careless or hostile input (text files, model folders, output files, options): refused with one
line, nothing changed; interrupted or out of disk while writing, nothing left; text files read as text mode reads
them.
"""

import json
import os

import h5py
import pytest
from hostile import (
    BYTE_FOLDER_CHARACTERS,
    EMBED,
    Case,
    check_api_refusal,
    check_full_disk,
    check_memory_refusal,
    check_refused,
    check_signal_while_writing,
    edit_json,
    edit_weights,
    embed_in_parts,
    run_memory_cases,
    shards_outside,
    shorten,
    symlink,
    write,
)

from hf_elmo.commands.cli import main as cli_main

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "embed over its input, --force": Case(
        f"{EMBED} --model M --force".replace("out.h5", "in.txt"),
        r"^error: in\.txt: is the input in\.txt; write the output elsewhere$",
        untouched=("in.txt",),
    ),
    "embed into the model folder": Case(
        f"{EMBED} --model M".replace("out.h5", "M/out.h5"), r"^error: M/out\.h5: is inside the input M;"
    ),
    "embed over a pipe (not a regular file), --force": Case(
        f"{EMBED} --model M --force".replace("out.h5", "pipe"),
        r"^error: pipe: exists and is not a regular file; name a new file$",
        [lambda root: os.mkfifo(root / "pipe")],
    ),
    "embed --force over a file that is not HDF5": Case(
        f"{EMBED} --model M --force".replace("out.h5", "notes.txt"),
        r"^error: notes\.txt: is not an HDF5 file; --force replaces only that",
        [write("notes.txt", "mine")],
        ("notes.txt",),
    ),
    "embed to a symbolic link": Case(
        f"{EMBED} --model M --force".replace("out.h5", "link.h5"),
        r"^error: link\.h5: is a symbolic link; give the file itself or a new name$",
        [symlink("link.h5", "in.txt")],
        ("in.txt",),
    ),
    # --- silent wrong answers: NaN, zero sizes, options that do not describe the weights ---
    "embed: NaN proj_clip in config.json": Case(
        f"{EMBED} --model M",
        r"M: config\.json: ElmoConfig\.proj_clip must be finite, got nan",
        [edit_json("M/config.json", proj_clip=float("nan"))],
        ("M/config.json", "in.txt"),
    ),
    "embed: NaN forget_bias as the converter once wrote it": Case(
        f"{EMBED} --model M",
        r"M: config\.json: ElmoConfig\.forget_bias must be finite, got nan",
        [edit_json("M/config.json", forget_bias={"__float__": "NaN"})],
    ),
    "embed: --scalar-mix-weights nan": Case(
        "embed in.txt out.h5 --model M --quiet --scalar-mix-weights nan 0 0",
        r"--scalar-mix-weights must be finite numbers, got \[nan, 0\.0, 0\.0\]",
    ),
    "embed: --scalar-mix-weights inf": Case(
        "embed in.txt out.h5 --model M --quiet --scalar-mix-weights 0 inf 0", r"--scalar-mix-weights must be finite"
    ),
    "embed: a folder as the input": Case("embed M out.h5 --top --quiet --model M", r"^error: M: is a folder"),
    "embed: a char_vocab.json dropped into a folder of a model that reads UTF-8 bytes": Case(
        f"{EMBED} --model M",
        r"^error: M: the tokenizer files hold char_vocab\.json but the model reads UTF-8 bytes \(config\.json "
        r"char_vocabulary: false\)",
        [lambda root: (root / "M/char_vocab.json").write_text(json.dumps(BYTE_FOLDER_CHARACTERS))],
    ),
    # --- stack traces and unclear messages ---
    "embed: a corrupt tokenizer_config.json": Case(
        f"{EMBED} --model M",
        r"^error: M: tokenizer_config\.json is not valid JSON \(line 1, column 2: Expecting property name",
        [write("M/tokenizer_config.json", "{bad")],
    ),
    "embed: an empty tokenizer_config.json": Case(
        f"{EMBED} --model M",
        r"^error: M: tokenizer_config\.json is not valid JSON \(line 1, column 1: Expecting value\)$",
        [write("M/tokenizer_config.json", "")],
    ),
    "embed: model_type bert in config.json": Case(
        f"{EMBED} --model M",
        r"^error: M: config\.json: The configuration has model_type 'bert', not 'elmo': it is not an ELMo model\.$",
        [edit_json("M/config.json", model_type="bert")],
    ),
    "embed --raw: a 10 MB word": Case(
        f"{EMBED} --model M --raw",
        r"^error: in\.txt: line 2: the text has more than 100,000 characters without whitespace \(from character 2\)",
        [write("in.txt", "The cat .\nA " + "a" * 10**7 + " dog\n")],
    ),
    "embed: config.json dtype float8": Case(
        f"{EMBED} --model M",
        r"ElmoConfig\.dtype must name a torch dtype such as 'float32', got 'float8'",
        [edit_json("M/config.json", dtype="float8")],
    ),
    "embed: config.json of another model type": Case(
        f"{EMBED} --model M",
        r"model_type 'bert', not 'elmo': it is not an ELMo model",
        [edit_json("M/config.json", model_type="bert")],
    ),
    "embed: a tensor of the wrong shape": Case(
        f"{EMBED} --model M",
        r"^error: M: the weights \(model\.safetensors\) hold 'char_encoder\.projection\.bias' of shape \(3,\), but "
        r"config\.json implies \(16,\)",
        [edit_weights("M", shorten("char_encoder.projection.bias", 3))],
    ),
    # --- embedding, perplexity, export and warm-state commands: output dtypes, devices, the model's text split ---
    # The character embedding row of 'Z' (ids are bytes + 1, rows ids - 1) made large: the first layer of its words
    # goes beyond float16's range (about 1e5), the others' stays small.
    "embed --all --output-dtype float16: a value beyond float16's range": Case(
        "embed in.txt out.h5 --all --quiet --model M --output-dtype float16",
        r"^error: in\.txt: line 2: a vector value, -?\d[\d.e+]*, is beyond the range of --output-dtype float16 "
        r"\(largest 65,504\); use a wider --output-dtype$",
        [
            edit_weights("M", lambda t: t["char_encoder.char_embedding.weight"][ord("Z")].fill_(1e5)),
            write("in.txt", "The cat sat .\nA Zed .\n"),
        ],
    ),
    "embed --layout packed --output-dtype float16: a value beyond float16's range": Case(
        "embed in.txt out.h5 --all --quiet --model M --output-dtype float16 --layout packed",
        r"^error: in\.txt: line 2: a vector value, -?\d[\d.e+]*, is beyond the range of --output-dtype float16",
        [
            edit_weights("M", lambda t: t["char_encoder.char_embedding.weight"][ord("Z")].fill_(1e5)),
            write("in.txt", "The cat sat .\nA Zed .\n"),
        ],
    ),
    "embed --dtype float16: the model computes beyond float16's range": Case(
        "embed in.txt out.h5 --all --quiet --model M --dtype float16 --device cpu",
        r"^error: in\.txt: line 2: the model, running in float16, computed a vector value of -?(nan|inf) \(float16 "
        r"holds at most 65,504\): use --dtype float32 or bfloat16$",
        [
            edit_weights("M", lambda t: t["char_encoder.char_embedding.weight"][ord("Z")].fill_(1e5)),
            write("in.txt", "The cat sat .\nA Zed .\n"),
        ],
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "embed: config.json dtype float8_e4m3fn": Case(
        f"{EMBED} --model M",
        r"ElmoConfig\.dtype must name a torch dtype such as 'float32', got 'float8_e4m3fn'; the model computes in",
        [edit_json("M/config.json", dtype="float8_e4m3fn")],
    ),
    "embed: config.json a bare number": Case(
        f"{EMBED} --model M",
        r"M/config\.json: expected a JSON object \(configuration fields\), got int",
        [write("M/config.json", "5")],
    ),
    "embed: config.json cell_dim of the wrong type": Case(
        f"{EMBED} --model M", r"ElmoConfig\.cell_dim must be int, got '16'", [edit_json("M/config.json", cell_dim="16")]
    ),
    "embed: a shard index that points outside the model folder": Case(
        f"{EMBED} --model M",
        r"^error: M: model\.safetensors\.index\.json names the shard '\.\./x\.safetensors', outside the model folder",
        [shards_outside],
    ),
    # --- the paths (config.paths, ElmoPaths) ---
    "embed: config.json paths naming no path": Case(
        f"{EMBED} --model M",
        r"^error: M: config\.json: paths\.lstm must be one of \('auto', 'reference', 'sorted', 'static'\), got "
        r"'fast'\.$",
        [edit_json("M/config.json", paths={"lstm": "fast"})],
    ),
    "embed: config.json paths with a field of no part": Case(
        f"{EMBED} --model M",
        r"^error: M: config\.json: paths has no field 'lstm_path'; the fields are \('char_cnn', 'window_max',",
        [edit_json("M/config.json", paths={"lstm_path": "sorted"})],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    "config.json cell_dim 10**7": (
        ("M/config.json", {"cell_dim": 10**7}),
        f"{EMBED} --model M",
        r"M: config\.json: ElmoConfig describes .* parameters, more than the limit of 2\*\*31 \(num_layers x cell_dim",
    ),
    "config.json projection_dim 10**7": (
        ("M/config.json", {"projection_dim": 10**7}),
        f"{EMBED} --model M",
        r"M: config\.json: ElmoConfig describes .* parameters, more than the limit",
    ),
    "config.json n_characters 10**9": (
        ("M/config.json", {"n_characters": 10**9}),
        f"{EMBED} --model M",
        r"more than the limit of 2\*\*31 \(n_characters x char_embedding_dim: 4e\+09\)",
    ),
    "config.json cell_dim 40960 (within the limit, not the weights)": (
        ("M/config.json", {"cell_dim": 40960}),
        f"{EMBED} --model M",
        r"^error: M: the weights \(model\.safetensors\) hold 'encoder\.forward_layers\.0\.input_linearity\.weight' of "
        r"shape \(256, 16\), but config\.json implies \(163840, 16\)",
    ),
    "config.json num_layers 10**6": (
        ("M/config.json", {"num_layers": 10**6}),
        f"{EMBED} --model M",
        r"ElmoConfig\.num_layers describes 1,000,000 layers, more than the limit of 1,000",
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "config.json max_characters_per_token 10**9": (
        ("M/config.json", {"max_characters_per_token": 10**9}),
        f"{EMBED} --model M",
        r"^error: M: config\.json: ElmoConfig\.max_characters_per_token is 1,000,000,000, more than the limit",
    ),
}


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory, converted_dirs, bilm_dir):
    return run_memory_cases(MEMORY_CASES, tmp_path_factory, converted_dirs, bilm_dir)


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_sizes_are_checked_before_anything_is_allocated(name, memory_results):
    check_memory_refusal(MEMORY_CASES[name], memory_results[name])


API_CASES = {
    # --- compact training data, its guard-rails and embedding in several processes ---
    "embed split between two processes from standard input": (
        [],
        lambda root: embed_in_parts("-", "--top"),
        r"^standard input cannot be split between 2 processes \(each embeds one line in 2\): embed with one process$",
    ),
    "embed split between two processes with --carry-state": (
        [],
        lambda root: embed_in_parts("in.txt", "--top", "--carry-state"),
        r"^--carry-state cannot be split between 2",
    ),
    "embed split between two processes into the packed layout": (
        [],
        lambda root: embed_in_parts("in.txt", "--top", "--layout", "packed"),
        r"^--layout packed cannot be split between 2",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)


SIGNAL_CASES = {
    # name: (where the signal is sent from: module, class, method, on which call; the signal; the command)
    "embed, SIGHUP after some datasets": (
        ("hf_elmo.features.embed", "Embedder", "__call__", 2),
        "SIGHUP",
        f"{EMBED} --model M --batch-size 1",
    ),
}


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_signal_while_writing_leaves_nothing(name, workspace):
    check_signal_while_writing(SIGNAL_CASES[name], workspace)


FULL_DISK_CASES = {
    # name: (command, the output it names)
    "embed, one dataset per line": ("embed in.txt out.h5 --all --quiet --model M --batch-size 8", "out.h5"),
    "embed --layout packed": ("embed in.txt out.h5 --all --quiet --model M --batch-size 8 --layout packed", "out.h5"),
}


@pytest.mark.parametrize("name", FULL_DISK_CASES)
def test_a_full_disk_is_one_line_and_leaves_nothing(name, workspace):
    check_full_disk(FULL_DISK_CASES[name], workspace)


def embedded(path):
    with h5py.File(path, "r") as f:
        return {name: f[name].asstr()[0] if name == "sentence_to_index" else f[name][...].tobytes() for name in f}


@pytest.mark.parametrize(
    "variant",
    [b"\xef\xbb\xbfThe cat sat .\nA dog .\n", b"The cat sat .\nA dog .\r", b"The cat sat .\r\nA dog .\r\n"],
    ids=["byte-order mark", "lone CR at the end", "CRLF"],
)
def test_embed_reads_text_files_as_text_mode_does(variant, workspace):
    # The plain file: two lines, two datasets and the map of the lines to their keys (on the CPU, bit for bit).
    assert cli_main(f"{EMBED} --model M --device cpu".split()) == 0
    (workspace / "variant.txt").write_bytes(variant)
    command = f"{EMBED} --model M --device cpu".replace("in.txt", "variant.txt").replace("out.h5", "variant.h5")
    assert cli_main(command.split()) == 0
    expected = embedded(workspace / "out.h5")
    assert sorted(expected) == ["0", "1", "sentence_to_index"]
    assert embedded(workspace / "variant.h5") == expected


def test_embed_quiet_reports_the_lines_it_embedded(workspace, capsys):
    assert cli_main(f"{EMBED} --model M".split()) == 0
    assert capsys.readouterr().err.strip().split("\n")[-1] == "2 sentences embedded to out.h5"
