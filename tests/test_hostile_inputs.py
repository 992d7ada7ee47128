"""Careless and hostile inputs: each one is refused with one line, `error: ...`, naming the problem (file, field or
line), and leaves every file as it was (nothing written, nothing replaced, nothing left behind).

The tables: `CASES`, through the command line (how to prepare the working folder, the command, the message, the
files that must be untouched; the whole working folder is compared as well); `MEMORY_CASES`, sizes that would exhaust
memory, run in a process whose address space is limited; `API_CASES`, through Python; `SIGNAL_CASES`, SIGINT, SIGTERM
and SIGHUP while an output is being written. The tests after them check what these refusals must not break.
"""

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import pytest
from safetensors.torch import load_file, save_file

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.cli import main as cli_main

from conftest import FIXTURES

CORPUS = "the cat sat on the mat .\nthe dog sat .\na cat and a dog .\n"
TINY = dict(char_embedding_dim=4, filters=[[1, 4], [2, 4]], n_highway=1, cell_dim=8, projection_dim=4, num_layers=1)


@pytest.fixture(scope="session")
def bilm_dir(tmp_path_factory):
    """A small saved `ElmoForBiLM` with its tokenizer and word vocabulary, as `hf-elmo train` writes one."""
    folder = tmp_path_factory.mktemp("bilm") / "B"
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "a", "dog", "."])
    ElmoForBiLM(ElmoConfig(**TINY, vocab_size=9)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def workspace(tmp_path, monkeypatch, converted_dirs, bilm_dir):
    """The working folder of a case: `d/` original files, `M/` a converted model, `B/` a trained biLM, text files."""
    (tmp_path / "d").mkdir()
    for name in ("options.json", "lm_weights.hdf5"):
        shutil.copy(FIXTURES / "allennlp" / name, tmp_path / "d" / name)
    shutil.copytree(converted_dirs["allennlp"], tmp_path / "M")
    shutil.copytree(bilm_dir, tmp_path / "B")
    (tmp_path / "in.txt").write_text("The cat sat .\nA dog .\n", encoding="utf-8")
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: relative path -> (kind, permission bits, content digest or link target)."""
    entries = {}
    for folder, names, files in os.walk(root):
        for name in names + files:
            path = Path(folder) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                entries[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                entries[str(path.relative_to(root))] = ("file", stat.S_IMODE(info.st_mode), digest)
            else:
                entries[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode))
    return entries


# --- how a case prepares the working folder ---------------------------------------------------------------------


def edit_json(path, **changes):
    def edit(root):
        values = json.loads((root / path).read_text())
        for key, value in changes.items():
            target = values
            *parents, last = key.split(".")
            for parent in parents:
                target = target[parent]
            target[last] = value
        (root / path).write_text(json.dumps(values))

    return edit


def write(path, content):
    def create(root):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / path).write_bytes(content)
        else:
            (root / path).write_text(content, encoding="utf-8")

    return create


def add_dataset(root):
    with h5py.File(root / "d/lm_weights.hdf5", "a") as f:
        f.create_dataset("RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_extra", data=[1.0, 2.0])


def edit_weights(folder, edit):
    def damage(root):
        tensors = load_file(root / folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, root / folder / "model.safetensors", metadata={"format": "pt"})

    return damage


def shorten(name, length):
    return lambda tensors: tensors.__setitem__(name, tensors[name][:length])


def pickle_only_model(root):
    (root / "P").mkdir()
    shutil.copy(root / "M/config.json", root / "P/config.json")
    (root / "P/pytorch_model.bin").write_bytes(b"not read")


def alphabetical_vocabulary(root):
    words = sorted({w for line in CORPUS.split("\n") for w in line.split()})
    (root / "v.txt").write_text("\n".join(["<S>", "</S>", "<UNK>", *words]) + "\n", encoding="utf-8")


def converted_earlier(folder):
    def convert(root):
        shutil.copytree(root / "M", root / folder)

    return convert


def symlink(link, target):
    def create(root):
        (root / link).symlink_to(target)

    return create


@dataclass
class Case:
    command: str
    message: str
    setup: list = field(default_factory=list)
    untouched: tuple = ()  # besides: the whole working folder is compared


# A valid character vocabulary for a byte-level tokenizer (whose boundary words are <S> and </S>).
BYTE_FOLDER_CHARACTERS = {
    c: i + 1 for i, c in enumerate(["<bow>", "<eow>", "<pad>", "<oov>", "<S>", "</S>", *"Thecat"])
}

TRAIN = "train --train-files corpus.txt --config B --output-dir run --disable-progress-bar --data-cache-dir cache"
EMBED = "embed in.txt out.h5 --top --quiet"
CONVERT = "convert --options d/options.json --weights d/lm_weights.hdf5"

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "convert into the folder of its inputs, --force": Case(
        f"{CONVERT} --output-dir d --force",
        r"^error: d: holds the input d/options\.json; write the output elsewhere$",
        untouched=("d/options.json", "d/lm_weights.hdf5"),
    ),
    "export over the model it exports, --force": Case(
        "export --model M --output-dir M --force", r"^error: M: is the input M; write the output elsewhere$",
        untouched=("M/config.json", "M/model.safetensors"),
    ),
    "export into the model folder it reads": Case(
        "export --model M --output-dir M/original", r"^error: M/original: is inside the input M;"
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
    "export --force over a folder with other files": Case(
        "export --model M --output-dir out --force",
        r"^error: out: holds 'weights\.txt', which is not part of an original-format folder",
        [write("out/options.json", "{}"), write("out/weights.txt", "mine")],
    ),
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
    "vocab over an existing vocabulary, without --force": Case(
        "vocab corpus.txt --output v.txt",
        r"^error: v\.txt: file exists \(use --force to replace it\)$",
        [write("v.txt", "<S>\n</S>\n<UNK>\nmine\n")],
        ("v.txt",),
    ),
    "vocab over its corpus, --force": Case(
        "vocab corpus.txt --output corpus.txt --force",
        r"^error: corpus\.txt: is the input corpus\.txt; write the output elsewhere$",
        untouched=("corpus.txt",),
    ),
    "vocab --force over a file that is not a vocabulary": Case(
        "vocab corpus.txt --output notes.txt --force",
        r"^error: notes\.txt: is not a word vocabulary", [write("notes.txt", "mine")],
    ),
    "vocab into a folder": Case("vocab corpus.txt --output d", r"^error: d: is a folder, expected a file name$"),
    "train into the folder of its corpus": Case(
        "train --train-files corpus.txt --output-dir . --data-cache-dir cache",
        r"^error: \.: holds the input corpus\.txt; write the output elsewhere$",
    ),
    "train inside the model it starts from": Case(
        "train --train-files corpus.txt --init-from M --output-dir M/adapted --data-cache-dir cache",
        r"^error: M/adapted: is inside the input M;",
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
    "embed: a folder as the input": Case(f"embed M out.h5 --top --quiet --model M", r"^error: M: is a folder"),
    "perplexity: --batch-size 0": Case(
        "perplexity --model B corpus.txt --batch-size 0", r"batch_size must be >= 1, got 0"
    ),
    "perplexity: --window 0": Case("perplexity --model B corpus.txt --window 0", r"window must be >= 3 positions"),
    "train: --epochs 0": Case(f"{TRAIN} --epochs 0", r"epochs must be > 0 .*got 0\.0: nothing would be trained"),
    "train: --window 0": Case(f"{TRAIN} --window 0", r"window must be >= 3 positions .*got 0"),
    "train: --learning-rate nan": Case(f"{TRAIN} --learning-rate nan", r"learning_rate must be a finite number"),
    "train: --batch-size 0": Case(f"{TRAIN} --batch-size 0", r"batch_size must be >= 1, got 0"),
    "train: --dropout 1": Case(f"{TRAIN} --dropout 1", r"dropout must be in \[0, 1\), got 1\.0"),
    "train: vocabulary not sorted by frequency, with the sampled softmax": Case(
        f"{TRAIN} --vocab v.txt --num-softmax-samples 2",
        r"The vocabulary \(from v\.txt\) is not ordered by frequency: .*\(--num-softmax-samples 0\)",
        [alphabetical_vocabulary],
        ("v.txt",),
    ),
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
    "perplexity: a corrupt tokenizer_config.json": Case(
        "perplexity --model B corpus.txt",
        r"^error: B: tokenizer_config\.json is not valid JSON",
        [write("B/tokenizer_config.json", "{bad")],
    ),
    "embed --raw: a 10 MB word": Case(
        f"{EMBED} --model M --raw",
        r"^error: in\.txt: line 2: the text has more than 100,000 characters without whitespace \(from character 2\)",
        [write("in.txt", "The cat .\nA " + "a" * 10**7 + " dog\n")],
    ),
    "train --split pretokenizer: a 10 MB word": Case(
        f"{TRAIN} --split pretokenizer",
        r"^error: corpus\.txt, line 3: the text has more than 100,000 characters without whitespace",
        [write("corpus.txt", "the cat\nsat .\n" + "x" * 200_001 + "\n")],
    ),
    "train: invalid UTF-8 in the corpus": Case(
        f"{TRAIN}",
        r"Training file 'corpus\.txt': line 2 is not valid UTF-8 \(byte 5: invalid start byte\)",
        [write("corpus.txt", b"the cat\nthe \xff dog\n")],
    ),
    "train: --init-from a folder with only a pickle checkpoint": Case(
        "train --train-files corpus.txt --init-from P --output-dir run --disable-progress-bar --data-cache-dir cache",
        r"P: ELMo loads weights only from safetensors",
        [pickle_only_model],
    ),
    "train: --config with a NaN": Case(
        "train --train-files corpus.txt --config M/config.json --output-dir run --data-cache-dir cache",
        r"^error: ElmoConfig\.cell_clip must be finite, got nan\.$",
        [edit_json("M/config.json", cell_clip=float("nan"))],
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
    "vocab: an empty corpus": Case(
        "vocab empty.txt --output v.txt", r"Corpus file 'empty\.txt' is empty", [write("empty.txt", "\n \n")]
    ),
    "vocab: invalid UTF-8": Case(
        "vocab bad.txt --output v.txt",
        r"Corpus file 'bad\.txt': line 3 is not valid UTF-8 \(byte 1",
        [write("bad.txt", b"a b\r\nc\r\xe9t\xe9\n")],
    ),
    "perplexity: invalid UTF-8": Case(
        "perplexity --model B bad.txt",
        r"Evaluation file 'bad\.txt': line 1 is not valid UTF-8",
        [write("bad.txt", b"\xc3(")],
    ),
    "perplexity: config.json's softmax larger than the vocabulary": Case(
        "perplexity --model B corpus.txt",
        r"B: the model's softmax has 100,000,000 words \(config\.json vocab_size\) but its vocabulary "
        r"\(vocab\.txt\) has 9",
        [edit_json("B/config.json", vocab_size=10**8)],
    ),
    # --- training defaults and presets (a sentence longer than the window is no longer refused: it is cut, see
    # tests/test_data_bilm.py) ---
    "train: --config naming neither a preset nor a file": Case(
        TRAIN.replace("--config B", "--config huge"),
        r"--config 'huge' is neither a preset \(tiny, small, medium, original\) nor an existing file or folder\.$",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    case = CASES[name]
    for prepare in case.setup:
        prepare(workspace)
    before = snapshot(workspace)
    assert cli_main(case.command.split()) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.split("\n") if line.strip() and "\r" not in line]  # progress bars aside
    assert "Traceback" not in captured.err and len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and re.search(case.message, lines[0]), lines[0]
    after = snapshot(workspace)
    for path in case.untouched:
        assert after[path] == before[path], path
    assert after == before


# --- sizes that would exhaust memory: refused from the configuration and the weight files' headers -----------------

MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    "options.json lstm.dim 10**9": (
        ("d/options.json", {"lstm.dim": 10**9}),
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"d/options\.json: ElmoConfig describes 5\.92e\+11 parameters, more than the limit of 2\*\*31",
    ),
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
    "config.json n_highway 10**7": (
        ("M/config.json", {"n_highway": 10**7}),
        "export --model M --output-dir out",
        r"ElmoConfig\.n_highway describes 10,000,000 layers, more than the limit of 1,000",
    ),
    "config.json vocab_size 10**8": (
        ("B/config.json", {"vocab_size": 10**8}),
        "perplexity --model B corpus.txt",
        r"B: the model's softmax has 100,000,000 words",
    ),
}

# Runs every case in one process whose address space may grow by at most 2 GiB once the libraries are loaded, so that
# a regression fails with an allocation error instead of taking the machine down. No GPU is visible to it: the cases
# fail before any device work, and a CUDA context alone would not fit.
_LIMITED_RUNS = """
import contextlib, io, json, os, resource, sys
from hf_elmo.cli import main
loaded = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize:")).split()[1]) << 10
resource.setrlimit(resource.RLIMIT_AS, (loaded + (2 << 30), loaded + (2 << 30)))
results = {}
for name, (folder, command) in json.loads(sys.argv[1]).items():
    os.chdir(folder)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(command.split())
        except BaseException as error:
            code, err = None, io.StringIO(f"{type(error).__name__}: {error}")
    results[name] = [code, err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory, converted_dirs, bilm_dir):
    import subprocess
    import sys

    commands = {}
    for index, (name, ((path, changes), command, _)) in enumerate(MEMORY_CASES.items()):
        root = tmp_path_factory.mktemp(f"memory{index}")
        (root / "d").mkdir()
        for file in ("options.json", "lm_weights.hdf5"):
            shutil.copy(FIXTURES / "allennlp" / file, root / "d" / file)
        shutil.copytree(converted_dirs["allennlp"], root / "M")
        shutil.copytree(bilm_dir, root / "B")
        (root / "in.txt").write_text("The cat sat .\n", encoding="utf-8")
        (root / "corpus.txt").write_text(CORPUS, encoding="utf-8")
        edit_json(path, **changes)(root)
        commands[name] = (root, command)
    argument = json.dumps({name: [str(root), command] for name, (root, command) in commands.items()})
    # No GPU in these capped processes, and no CUDA probe: on a GPU machine its failure under the cap is a warning.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _LIMITED_RUNS, argument], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (root, _) in commands.items():
        results[name].append(sorted(p.name for p in root.iterdir()))
    return results


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_sizes_are_checked_before_anything_is_allocated(name, memory_results):
    code, err, left = memory_results[name]
    lines = [line for line in err.split("\n") if line.strip() and "\r" not in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(MEMORY_CASES[name][2], lines[0]), lines[0]
    assert left == ["B", "M", "corpus.txt", "d", "in.txt"]  # no output


# --- the same through the Python API ---------------------------------------------------------------------------------


def padded_batch(root):
    return ElmoTokenizer()(["The cat sat .", "A"], padding=True, return_tensors="pt")


def mask_over_padding(root):
    import torch

    from hf_elmo import ElmoModel

    batch = padded_batch(root)
    ElmoModel.from_pretrained(root / "M")(batch["input_ids"], attention_mask=torch.ones_like(batch["attention_mask"]))


def load(model_class, folder):
    def run(root):
        import hf_elmo

        getattr(hf_elmo, model_class).from_pretrained(root / folder)

    return run


API_CASES = {
    "attention_mask of 1 over padding rows": (
        [],
        mask_over_padding,
        r"attention_mask is 1 at row 1, position 3, whose input_ids are all zeros \(padding\)",
    ),
    "from_pretrained with a missing tensor": (
        [edit_weights("M", lambda t: t.pop("char_encoder.highways.1.bias"))],
        load("ElmoModel", "M"),
        r"M: the weights \(model\.safetensors\) lack 1 tensor\(s\) .*'char_encoder\.highways\.1\.bias' \(248,\)",
    ),
    "a task head from a folder with a missing biLM tensor": (
        [edit_weights("M", lambda t: t.pop("encoder.backward_layers.0.state_linearity.bias"))],
        load("ElmoForTokenClassification", "M"),
        r"lack 1 tensor\(s\) .*'encoder\.backward_layers\.0\.state_linearity\.bias'",
    ),
    "a saved biLM without its softmax": (
        [edit_weights("B", lambda t: [t.pop(k) for k in ("softmax.weight", "softmax.bias")])],
        load("ElmoForBiLM", "B"),
        r"B: the weights \(model\.safetensors\) lack 2 tensor\(s\) .*'softmax\.",
    ),
    "from_pretrained of weights holding a NaN": (
        [edit_weights("M", lambda t: t["encoder.forward_layers.0.state_linearity.bias"].__setitem__(3, float("nan")))],
        load("ElmoModel", "M"),
        r"M: the weights hold NaN or infinite values in 'encoder\.forward_layers\.0\.state_linearity\.bias'",
    ),
    "from_pretrained with a NaN in config.json": (
        [edit_json("M/config.json", cell_clip=float("nan"))],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.cell_clip must be finite, got nan\.",
    ),
    "the tokenizer on raw text with a 10 MB word": (
        [],
        lambda root: ElmoTokenizer()("The cat " + "a" * 10**7),
        r"^the text has more than 100,000 characters without whitespace \(from character 8\)",
    ),
    "ElmoModel from the folder of another model type": (
        [edit_json("M/config.json", model_type="bert")],
        load("ElmoModel", "M"),
        r"model_type 'bert', not 'elmo'",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    setup, call, message = API_CASES[name]
    for prepare in setup:
        prepare(workspace)
    before = snapshot(workspace)
    with pytest.raises(ValueError, match=message):
        call(workspace)
    assert snapshot(workspace) == before


# --- signals: SIGINT, SIGTERM and SIGHUP while an output is being written leave nothing half-written ---------------

# The command runs in a child process that sends itself the signal from inside the write, at a chosen call.
_SIGNALLED_RUN = """
import importlib, os, signal, sys
# SIGINT as in a terminal: a test run started in the background inherits it ignored, and Python keeps that.
signal.signal(signal.SIGINT, signal.default_int_handler)
module, name, attribute, call, number, argv = sys.argv[1:7]
owner = getattr(importlib.import_module(module), name) if name else importlib.import_module(module)
original, calls = getattr(owner, attribute), [0]
def signalled(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(call):
        os.kill(os.getpid(), int(number))
    return original(*args, **kwargs)
setattr(owner, attribute, signalled)
from hf_elmo.cli import main
sys.exit(main(argv.split()))
"""

SIGNAL_CASES = {
    # name: (where the signal is sent from: module, class, method, on which call; the signal; the command)
    "convert, SIGINT after the weights are written": (
        ("hf_elmo.tokenization_elmo", "ElmoTokenizer", "save_pretrained", 1), "SIGINT",
        f"{CONVERT} --output-dir out",
    ),
    "export --force over an earlier export, SIGHUP between two datasets": (
        ("h5py", "Group", "create_dataset", 3), "SIGHUP", "export --model M --output-dir earlier --force"
    ),
    "embed, SIGHUP after some datasets": (
        ("hf_elmo.embed_elmo", "Embedder", "__call__", 2), "SIGHUP", f"{EMBED} --model M --batch-size 1"
    ),
    "vocab, SIGTERM": (
        ("hf_elmo.data_bilm", "", "write_word_vocabulary", 1), "SIGTERM", "vocab corpus.txt --output v.txt"
    ),
}


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_signal_while_writing_leaves_nothing(name, workspace):
    import signal
    import subprocess
    import sys

    (module, owner, attribute, call), signal_name, command = SIGNAL_CASES[name]
    (workspace / "earlier").mkdir()
    for file in ("options.json", "weights.hdf5"):
        (workspace / "earlier" / file).write_text("an earlier export")
    before = snapshot(workspace)
    number = str(int(getattr(signal, signal_name)))
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_RUN, module, owner, attribute, str(call), number, command],
        cwd=workspace, capture_output=True, timeout=300,
    )
    stderr = done.stderr.decode()  # not text=True, which would turn the progress bars' \r into line ends
    lines = [line for line in stderr.split("\n") if line.strip() and "\r" not in line]
    assert done.returncode == 130 and "Traceback" not in stderr, stderr
    assert lines == [f"interrupted by {signal_name}: the output in progress was not written"], stderr
    assert snapshot(workspace) == before


def test_sigterm_while_a_checkpoint_is_written_keeps_the_earlier_ones(workspace):
    import signal
    import subprocess
    import sys

    command = (f"{TRAIN} --batch-size 1 --max-steps 6 --save-steps 2 --num-softmax-samples 0 --logging-steps 100 "
               "--window 12")
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_RUN, "hf_elmo.train_bilm", "ElmoTrainer", "_save_rng_state", "2",
         str(int(signal.SIGTERM)), command],
        cwd=workspace, capture_output=True, timeout=300,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().split("\n")[-1] == "interrupted by SIGTERM: the output in progress was not written"
    assert sorted(p.name for p in (workspace / "run").iterdir()) == ["bilm_training_options.json", "checkpoint-2"]


def test_outputs_get_the_permissions_of_any_new_file(workspace):
    umask = os.umask(0o022)
    try:
        assert cli_main(f"{CONVERT} --output-dir converted".split()) == 0
        assert cli_main("export --model M --output-dir exported".split()) == 0
        assert cli_main(f"{EMBED} --model M".split()) == 0
        assert cli_main("vocab corpus.txt --output v.txt".split()) == 0
    finally:
        os.umask(umask)
    for path, mode in [("converted", 0o755), ("exported", 0o755), ("out.h5", 0o644), ("v.txt", 0o644),
                       ("converted/config.json", 0o644), ("exported/weights.hdf5", 0o644)]:
        assert stat.S_IMODE((workspace / path).stat().st_mode) == mode, path


def test_force_replaces_an_earlier_output_of_each_command(workspace, capsys):
    for command in (f"{CONVERT} --output-dir out", "export --model M --output-dir exported", f"{EMBED} --model M",
                    "vocab corpus.txt --output v.txt"):
        assert cli_main(command.split()) == 0
        before = snapshot(workspace)
        assert cli_main(command.split()) == 2 and "(use --force to replace it)" in capsys.readouterr().err
        assert cli_main([*command.split(), "--force"]) == 0
        assert snapshot(workspace).keys() == before.keys()  # replaced, nothing left beside it


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


def test_a_byte_order_mark_is_not_part_of_a_training_word(workspace):
    from hf_elmo.data_bilm import build_word_vocabulary, load_bilm_dataset

    (workspace / "bom.txt").write_bytes(b"\xef\xbb\xbf" + CORPUS.encode())
    words = build_word_vocabulary(["bom.txt"])
    assert words == build_word_vocabulary(["corpus.txt"]) and "\ufeffthe" not in words
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(words)
    with_mark, without = (load_bilm_dataset([name], tokenizer, cache_dir="cache") for name in ("bom.txt", "corpus.txt"))
    assert with_mark[0]["input_ids"].tolist() == without[0]["input_ids"].tolist()


def test_embed_quiet_reports_the_lines_it_embedded(workspace, capsys):
    assert cli_main(f"{EMBED} --model M".split()) == 0
    assert capsys.readouterr().err.strip().split("\n")[-1] == "2 sentences embedded to out.h5"


def test_the_word_splitter_takes_runs_up_to_its_limit():
    from hf_elmo.pre_tokenizer import MAX_RUN_LENGTH

    tokenizer = ElmoTokenizer()
    # The patterns that make the regex engine work hardest, at the limit: each gives its words, no panic.
    for run, words in [("a", 1), ("a'", 2), ("\U0001d400", 1), ("1.", 2), ("n't", 1), ("-", 1)]:
        text = run * (MAX_RUN_LENGTH // len(run))
        assert len(tokenizer.split_words(f"x {text} y")) == words + 2
    # Separated by whitespace, any length is fine; a Python-only separator (\x1c) does not separate.
    assert len(tokenizer.split_words(("a" * 60_000 + "\u3000") * 3)) == 3
    with pytest.raises(ValueError, match="without whitespace"):
        tokenizer.split_words(("a" * 60_000 + "\x1c") * 3)


def test_a_panic_of_the_regex_engine_is_a_value_error():
    from hf_elmo.pre_tokenizer import split_words

    class PanicException(BaseException):  # what pyo3 raises for a Rust panic: not an Exception
        pass

    class Panicking:
        def pre_tokenize_str(self, text):
            raise PanicException("Onig: Regex search error: retry-limit-in-match over")

    with pytest.raises(ValueError, match=r"the word splitter failed on this text \(Onig: .*retry-limit-in-match"):
        split_words(Panicking(), "text")
