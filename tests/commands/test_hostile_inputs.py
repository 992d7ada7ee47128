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
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import pytest
from conftest import CHECKPOINT, FIXTURES
from safetensors.torch import load_file, save_file

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert.to_onnx import export_onnx
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.streams import StreamWindowDataset
from hf_elmo.training.word_table import WordTable, load_compact_bilm_dataset

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


# --- training runs and their checkpoints, for the cases of `hf-elmo train` ---


def trained(folder, options=""):
    """A finished run of `TRAIN` (defined below) into `folder`; it also fills the data cache that a case's run then
    reads without writing to it."""

    def train(root):
        assert cli_main(f"{TRAIN} --output-dir {folder} --logging-steps 100 {options}".split()) == 0

    return train


def copy(source, target):
    return lambda root: shutil.copy(root / source, root / target)


def truncate(path, cut):
    return lambda root: os.truncate(root / path, (root / path).stat().st_size - cut)


def nan_accumulator(path):
    def damage(root):
        import torch

        state = torch.load(root / path, weights_only=True)
        state["state"][0]["sum"].view(-1)[0] = float("nan")  # the first parameter's
        torch.save(state, root / path)

    return damage


def windows_of_another_table(cache):
    """Each prepared windows file of `cache` rewritten as one window of a word index beyond any table, as the windows
    of another word table (or a damaged file) would read."""

    def rewrite(root):
        import pyarrow as pa

        schema = pa.schema([("positions", pa.list_(pa.int32()))])
        for path in sorted((root / cache).rglob("*.arrow")):
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                writer.write_batch(pa.record_batch([pa.array([[-1, 0, 10**6, 1, -1]], pa.list_(pa.int32()))], schema))

    return rewrite


# --- checkpoint conversion, configuration and model-input checks: preparing the working folder ---


def tf_checkpoint(root):
    """`t/`: the bilm-tf training checkpoint with its options.json and vocabulary."""
    shutil.copytree(CHECKPOINT / "tf_checkpoint", root / "t")
    shutil.copy(CHECKPOINT / "vocab.txt", root / "t/vocab.txt")


def rewrite_tf_index(edit):
    """`t/`'s index rewritten: `edit(entries)` takes and returns the list of (name, serialized entry)."""

    def rewrite(root):
        from test_tf_checkpoint import write_index

        from hf_elmo.convert.tf_checkpoint import _table_entries

        index = root / "t/model.ckpt-252.index"
        write_index(index, edit(_table_entries(str(index))))

    return rewrite


def with_entry(name, value_of):
    """Adds or replaces the entry `name`; `value_of(entries)` gives its serialized `BundleEntryProto`."""
    return lambda entries: [(k, v) for k, v in entries if k != name.encode()] + [(name.encode(), value_of(entries))]


def entry_of(name):
    return lambda entries: dict(entries)[name.encode()]


def shards_outside(root):
    """`M`'s weights moved beside the folder, and a shard index in `M` pointing at them."""
    tensors = load_file(root / "M/model.safetensors")
    (root / "M/model.safetensors").rename(root / "x.safetensors")
    index = {"metadata": {}, "weight_map": {name: "../x.safetensors" for name in tensors}}
    (root / "M/model.safetensors.index.json").write_text(json.dumps(index))


def scalar_softmax(root):
    from test_tf_checkpoint import _entry

    first = (root / "t/model.ckpt-252.data-00000-of-00001").read_bytes()[:4]
    rewrite_tf_index(with_entry("lm/softmax/W", lambda entries: _entry(1, (), 0, 4, first)))(root)


# --- lazy streams (train --stream over shards): preparing the working folder ---

STREAM_SHARDS = (
    "train --train-files shards --config B --output-dir run --disable-tqdm --data-cache-dir cache --stream "
    "--per-device-train-batch-size 2 --window 8"
)


def stream_run_on_shards():
    """Two shards and a `--stream` run over them with checkpoints at steps 1 and 2."""
    shards = [write("shards/a.txt", CORPUS), write("shards/b.txt", "the dog sat .\n")]

    def train(root):
        command = f"{STREAM_SHARDS} --max-steps 2 --save-steps 1 --logging-steps 100"
        assert cli_main(command.split()) == 0

    return [*shards, train]


def edit_stream_position(change):
    """Replaces the saved stream position of the last checkpoint of `stream_run_on_shards` by `change(position)`."""

    def edit(root):
        path = root / "run/checkpoint-2/stream_state-0.safetensors"
        state = load_file(path)
        save_file({**state, "position": change(state["position"]).contiguous()}, path)

    return edit


def line_beyond_the_shard(position):
    """The first row's sentence on a line its shard does not have."""
    position = position.clone()
    position[2, 2] = 99
    return position


def read_beyond_the_sentence(position):
    """The second row having read a million positions of its sentence."""
    position = position.clone()
    position[3, 3] = 10**6
    return position


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

TRAIN = "train --train-files corpus.txt --config B --output-dir run --disable-tqdm --data-cache-dir cache"
EMBED = "embed in.txt out.h5 --top --quiet"
CONVERT = "convert --options d/options.json --weights d/lm_weights.hdf5"
TF_CONVERT = "convert --tf-checkpoint t --vocab t/vocab.txt"

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "convert into the folder of its inputs, --force": Case(
        f"{CONVERT} --output-dir d --force",
        r"^error: d: holds the input d/options\.json; write the output elsewhere$",
        untouched=("d/options.json", "d/lm_weights.hdf5"),
    ),
    "export over the model it exports, --force": Case(
        "export --model M --output-dir M --force",
        r"^error: M: is the input M; write the output elsewhere$",
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
        r"^error: notes\.txt: is not a word vocabulary",
        [write("notes.txt", "mine")],
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
    # --- training: non-finite values, resuming, the output folder (hf-elmo train) ---
    # Step 1's loss is that of the initial weights; its update at a learning rate of 1e30 leaves none finite after.
    "train: --learning-rate 1e30 (Adagrad)": Case(
        f"{TRAIN} --learning-rate 1e30 --max-steps 3",
        r"^error: training stopped: the loss of step 2 is (nan|inf); nothing from that step on was saved \(no "
        r"checkpoint was written before\)$",
        [trained("earlier", "--max-steps 1")],
    ),
    "train: --learning-rate 1e30 (AdamW)": Case(
        f"{TRAIN} --optim adamw_torch --learning-rate 1e30 --max-steps 3",
        r"^error: training stopped: the loss of step 2 is (nan|inf); nothing from that step on was saved",
        [trained("earlier", "--max-steps 1")],
    ),
    "train --resume: an optimizer.pt with a NaN accumulator": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/optimizer\.pt: the optimizer state holds NaN or infinite values \('sum' "
        r"of 'elmo\.char_encoder\.char_embedding\.weight'\)$",
        [trained("run", "--max-steps 2 --save-steps 1"), nan_accumulator("run/checkpoint-2/optimizer.pt")],
    ),
    "train --resume: the optimizer.pt of an earlier checkpoint": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/optimizer\.pt: the optimizer state is at step 1, but trainer_state\.json "
        r"there is at step 2: the file belongs to another checkpoint$",
        [
            trained("run", "--max-steps 2 --save-steps 1"),
            copy("run/checkpoint-1/optimizer.pt", "run/checkpoint-2/optimizer.pt"),
        ],
    ),
    "train --resume: a truncated model.safetensors in the last checkpoint": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/model\.safetensors: not a readable safetensors file \(.*\); checkpoint-1 "
        r"is intact: move checkpoint-2 out of run to continue from it\.$",
        [trained("run", "--max-steps 2 --save-steps 1"), truncate("run/checkpoint-2/model.safetensors", 100)],
    ),
    "train --resume --stream: a truncated stream state": Case(
        f"{TRAIN} --stream --per-device-train-batch-size 2 --window 8 --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: not a readable safetensors file \(.*\); "
        r"checkpoint-1 is intact",
        [
            trained("run", "--stream --per-device-train-batch-size 2 --window 8 --max-steps 2 --save-steps 1"),
            truncate("run/checkpoint-2/stream_state-0.safetensors", 10),
        ],
    ),
    "train --resume: an option given again with another value than the recorded one": Case(
        # the default, given: not replaced by the record
        "train --output-dir run --resume --per-device-train-batch-size 128",
        r"^error: --resume: the run in run has other options \(bilm_training_options\.json\): "
        r"--per-device-train-batch-size 4 there, "
        r"128 given; leave them out to continue with the recorded ones\.$",
        [trained("run", "--max-steps 2 --save-steps 1 --per-device-train-batch-size 4")],
    ),
    "train --output-dir a symbolic link": Case(
        f"{TRAIN} --output-dir link",
        r"^error: link: is a symbolic link; give the folder itself or a new name$",
        [write("elsewhere/notes.txt", "mine"), symlink("link", "elsewhere")],
    ),
    # --- training options: ELMo's next to Trainer's TrainingArguments (hf-elmo train) ---
    "train without --output-dir": Case(
        "train --train-files corpus.txt --config B --data-cache-dir cache",
        r"^error: output_dir \(--output_dir\) is needed: the folder of the run\.$",
    ),
    "train: Trainer's --resume-from-checkpoint instead of --resume": Case(
        f"{TRAIN} --resume-from-checkpoint run/checkpoint-1",
        r"^error: --resume_from_checkpoint: give --resume, which continues from the run's last checkpoint\.$",
    ),
    "train: --all-clip-norm-val -1": Case(
        f"{TRAIN} --all-clip-norm-val -1", r"^error: all_clip_norm_val must be >= 0, got -1\.0\.$"
    ),
    "train: --per-device-eval-batch-size 0": Case(
        f"{TRAIN} --per-device-eval-batch-size 0", r"^error: per_device_eval_batch_size must be >= 1, got 0\.$"
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
    "embed: a folder as the input": Case("embed M out.h5 --top --quiet --model M", r"^error: M: is a folder"),
    "perplexity: --batch-size 0": Case(
        "perplexity --model B corpus.txt --batch-size 0", r"batch_size must be >= 1, got 0"
    ),
    "perplexity: --window 0": Case("perplexity --model B corpus.txt --window 0", r"window must be >= 3 positions"),
    "train: --num-train-epochs 0": Case(
        f"{TRAIN} --num-train-epochs 0", r"epochs must be > 0 .*got 0\.0: nothing would be trained"
    ),
    "train: --window 0": Case(f"{TRAIN} --window 0", r"window must be >= 3 positions .*got 0"),
    "train: --learning-rate nan": Case(f"{TRAIN} --learning-rate nan", r"learning_rate must be a finite number"),
    "train: --per-device-train-batch-size 0": Case(
        f"{TRAIN} --per-device-train-batch-size 0", r"per_device_train_batch_size must be >= 1, got 0"
    ),
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
        "train --train-files corpus.txt --init-from P --output-dir run --disable-tqdm --data-cache-dir cache",
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
    "perplexity --device bogus": Case(
        "perplexity --model B corpus.txt --device bogus", r"^error: --device: unknown device 'bogus' \(e\.g\. cpu,"
    ),
    "perplexity --device cuda:99": Case(
        "perplexity --model B corpus.txt --device cuda:99",
        r"^error: --device cuda:99: (CUDA is not available on this machine|this machine has \d+ CUDA device\(s\))$",
    ),
    "warm-state --device bogus": Case(
        "warm-state --model M corpus.txt --device bogus",
        r"^error: --device: unknown device 'bogus'",
        untouched=("M/model.safetensors", "M/config.json"),
    ),
    "perplexity: a training options file with an unknown split": Case(
        "perplexity --model B corpus.txt",
        r"^error: B/bilm_training_options\.json: field 'split' must be one of whitespace, pretokenizer, got 'words'$",
        [write("B/bilm_training_options.json", json.dumps({"split": "words"}))],
    ),
    "warm-state: a training options file that is not JSON": Case(
        "warm-state --model M corpus.txt",
        r"^error: M/bilm_training_options\.json: not valid JSON \(line 1, column 1",
        [write("M/bilm_training_options.json", "split: pretokenizer")],
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
    "perplexity: tokenizer_class BertTokenizer": Case(
        "perplexity --model B corpus.txt",
        r"^error: B: tokenizer_config\.json names tokenizer_class 'BertTokenizer', expected 'ElmoTokenizer'",
        [edit_json("B/tokenizer_config.json", tokenizer_class="BertTokenizer")],
    ),
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
    # --- training defaults and presets (a sentence longer than the window is no longer refused: it is cut, see
    # tests/training/test_training_data.py) ---
    "train: --config naming neither a preset nor a file": Case(
        TRAIN.replace("--config B", "--config huge"),
        r"--config 'huge' is neither a preset \(tiny, small, medium, original\) nor an existing file or folder\.$",
    ),
    # --- pipelines, sentence embeddings and model cards ---
    "convert --force over a folder whose README.md someone else wrote": Case(
        f"{CONVERT} --output-dir out --force",
        r"^error: out: holds 'README\.md', which is not part of a model folder",
        [converted_earlier("out"), write("out/README.md", "# My notes on this model\n")],
        ("out/README.md", "out/model.safetensors"),
    ),
    # --- compact training data and its guard-rails ---
    "train: a pattern of shards that matches no file": Case(
        TRAIN.replace("corpus.txt", "shards/*.txt"),
        r"^error: Training files 'shards/\*\.txt': no file matches the pattern\.$",
    ),
    "train: a folder of shards that holds no file": Case(
        TRAIN.replace("corpus.txt", "shards"),
        r"^error: Training folder 'shards' holds no file\.$",
        [lambda root: (root / "shards" / ".hidden").mkdir(parents=True)],
    ),
    # --- lazy streams (train --stream over shards) ---
    "train --stream: an empty shard": Case(
        f"{STREAM_SHARDS} --max-steps 2",
        r"^error: Training file 'shards/b\.txt' is empty: it has no words\.$",
        [write("shards/a.txt", CORPUS), write("shards/b.txt", "\n \n")],
    ),
    "train --stream: a shard that is not UTF-8": Case(
        f"{STREAM_SHARDS} --max-steps 2",
        r"^error: Training file 'shards/b\.txt': line 2 is not valid UTF-8 \(byte 1: invalid start byte\)\.$",
        [write("shards/a.txt", CORPUS), write("shards/b.txt", b"the cat .\n\xff dog .\n")],
    ),
    "train --resume --stream: a shard gone since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: 'shards/b\.txt', a shard the run read \(stream_corpus\.json in run/checkpoint-2\), is no "
        r"longer among the training files: resume with the run's shards$",
        [*stream_run_on_shards(), lambda root: (root / "shards/b.txt").unlink()],
    ),
    "train --resume --stream: a shard changed since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: training file 'shards/b\.txt' changed since the run read it \(14 bytes then, 12 now; "
        r"stream_corpus\.json in run/checkpoint-2\): resume with the run's shards$",
        [*stream_run_on_shards(), write("shards/b.txt", "the dog sat\n")],
    ),
    "train --resume --stream: a shard of the same size changed since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: training file 'shards/b\.txt' changed since the run read it \(14 bytes then, 14 now;",
        [*stream_run_on_shards(), write("shards/b.txt", "the cat sat .\n")],
    ),
    "train --resume --stream: a shard added since the run started": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: the training files now include 'shards/c\.txt', which the run did not read "
        r"\(stream_corpus\.json in run/checkpoint-2\): resume with the run's shards$",
        [*stream_run_on_shards(), write("shards/c.txt", CORPUS)],
    ),
    "train --resume --stream: a checkpoint of the earlier --stream, without the record of its shards": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2: no stream_corpus\.json: written by an earlier version of --stream, which "
        r"laid the streams out otherwise; start a new run",
        [*stream_run_on_shards(), lambda root: (root / "run/checkpoint-2/stream_corpus.json").unlink()],
    ),
    # --- the saved position of --stream's streams (resumed without reading the text before it) ---
    "train --resume --stream: a stream position of another number of rows": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: expected \(4, 4\) non-negative "
        r"integers \(the streams of 2 rows\), got \(3, 4\) int64$",
        [*stream_run_on_shards(), edit_stream_position(lambda position: position[:-1])],
    ),
    "train --resume --stream: a stream position naming a line the shards do not have": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: names a line that the training "
        r"files do not have$",
        [*stream_run_on_shards(), edit_stream_position(line_beyond_the_shard)],
    ),
    # --- review of the batches made on the device and of --stream's saved position ---
    # A count of positions read past the sentence made the layout read the corpus on, for ever where large.
    "train --resume --stream: a stream position read past a sentence's end": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: row 1 has read 1000000 positions "
        r"of a sentence that offers 1 to \d+ \(shards/[ab]\.txt, line \d\)$",
        [*stream_run_on_shards(), edit_stream_position(read_beyond_the_sentence)],
    ),
    # Trainer's label smoothing took the labels away from the model and looked for logits (a KeyError).
    "train: --label-smoothing-factor 0.1": Case(
        f"{TRAIN} --label-smoothing-factor 0.1",
        r"^error: label_smoothing_factor must be 0 for ElmoForBiLM, got 0\.1: the model computes its loss itself, "
        r"Trainer's label smoothing would read logits it does not return\.$",
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
    # --- the command line: hf-elmo env ---
    "env --model of a folder without config.json": Case(
        "env --model d",
        r"^error: d: no config\.json \(expected a folder written by hf-elmo convert or save_pretrained\)$",
    ),
    "env --model with a damaged config.json": Case(
        "env --model X",
        r"^error: X: cannot read the configuration \(X/config\.json: not valid JSON \(line 1, column 2: ",
        [write("X/config.json", "{")],
    ),
    "env --device of an unknown device": Case(
        "env --device tpu9", r"^error: --device: unknown device 'tpu9' \(e\.g\. cpu, cuda, cuda:1\)$"
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
    # --- export of the task heads (model.onnx of a folder saved as a head: its logits) ---
    "export --format onnx --with-state of a task head": Case(
        "export --format onnx --model M --output-dir out --with-state",
        r"^error: --with-state: M holds a task head \(ElmoForTokenClassification\), whose model\.onnx computes its "
        r"logits from each sentence's start state; only a biLM's \(ElmoModel, ElmoForBiLM\) has the LSTM state as "
        r"inputs and outputs$",
        [edit_json("M/config.json", architectures=["ElmoForTokenClassification"])],
    ),
    # --- training batches collated in data-loader workers ---
    "train: a batch refused while a loader worker collates it": Case(
        f"{TRAIN} --dataloader-num-workers 1",
        r"^error: Example 0: stored word indices must be in \[-1, \d+\], got \[-1, 1000000\]: the window was prepared "
        r"with another word table\.$",
        [trained("first"), windows_of_another_table("cache")],
    ),
    # --- train: --max-steps 0, which Trainer would run as one step ---
    "train: --max-steps 0": Case(
        f"{TRAIN} --max-steps 0",
        r"^error: max_steps must be > 0 \(the steps to train\) or -1 \(the default: num_train_epochs decides\), "
        r"got 0\.$",
    ),
    "train --stream: --max-steps 0": Case(
        f"{TRAIN} --stream --max-steps 0", r"^error: max_steps must be > 0 \(the steps to train\) or -1"
    ),
    # --- train: --stream with --streaming, two ways of reading lazily ---
    "train: --stream with --streaming": Case(
        f"{TRAIN} --stream --streaming --max-steps 2",
        r"^error: --streaming reads windows lazily; --stream reads its shards lazily anyway: give one of the two\.$",
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
    # --- embedding, perplexity, export and warm-state commands ---
    "perplexity --stream --batch-size 10**9": (
        ("B/config.json", {}),
        "perplexity --model B corpus.txt --stream --batch-size 1000000000",
        r"^error: 3 lines cannot fill one batch of 1000000000 streams: every row needs a line of its own",
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "options.json max_characters_per_token 10**9": (
        ("d/options.json", {"char_cnn.max_characters_per_token": 10**9}),
        "convert --options d/options.json --weights d/lm_weights.hdf5 --output-dir out",
        r"^error: d/options\.json: ElmoConfig\.max_characters_per_token is 1,000,000,000, more than the limit of 1,000 "
        r"slots per word\.$",
    ),
    "config.json max_characters_per_token 10**9": (
        ("M/config.json", {"max_characters_per_token": 10**9}),
        f"{EMBED} --model M",
        r"^error: M: config\.json: ElmoConfig\.max_characters_per_token is 1,000,000,000, more than the limit",
    ),
    "tokenizer_config.json max_characters_per_token 10**9": (
        ("B/tokenizer_config.json", {"max_characters_per_token": 10**9}),
        "perplexity --model B corpus.txt",
        r"^error: B: .*max_characters_per_token is 1,000,000,000, more than the limit of 1,000 slots per word",
    ),
    # --- compact training data and its guard-rails ---
    "train: weights, gradients and optimizer state beyond the memory": (
        ("B/config.json", {"projection_dim": 10**5, "cell_dim": 1000}),
        TRAIN,
        r"^error: the weights, their gradients and the adagrad state need 20\.1 GiB before activations \(0\.0\d+ GiB "
        r"of it for the softmax of \d+ words x 100001\), more than the [\d.]+ GiB of this process's address space "
        r"limit",
    ),
}

# Runs every case in one process whose address space may grow by at most 2 GiB once the libraries are loaded, so that
# a regression fails with an allocation error instead of taking the machine down. No GPU is visible to it: the cases
# fail before any device work, and a CUDA context alone would not fit.
_LIMITED_RUNS = """
import contextlib, io, json, os, resource, sys
from hf_elmo.commands.cli import main
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
        [sys.executable, "-c", _LIMITED_RUNS, argument], capture_output=True, text=True, timeout=900, env=env
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


def without_module(name, function, *args):
    """`function(*args)` where importing `name` fails, as where it is not installed."""
    import sys
    from unittest import mock

    with mock.patch.dict(sys.modules, {name: None}):
        return function(*args)


# --- the paths (config.paths, ElmoPaths): calls ---


def load_with(folder, **kwargs):
    from hf_elmo import ElmoModel

    return ElmoModel.from_pretrained(folder, **kwargs)


def run_bfloat16(folder, **kwargs):
    import torch

    model = load_with(folder, **kwargs).to(torch.bfloat16)
    model(**padded_batch(folder))


# --- checkpoint conversion, configuration and model-input checks: calls -----------------------------------------


def run_model(transform, model_class="ElmoModel", labels=None, **load_kwargs):
    """`model_class` from `M` called on `transform(batch, model)` (a dict of keyword arguments)."""

    def call(root):
        import hf_elmo

        model = getattr(hf_elmo, model_class).from_pretrained(root / "M", **load_kwargs).eval()
        return model(**transform(dict(padded_batch(root)), model))

    return call


def with_ids_as(dtype_or_device):
    import torch

    to = getattr(torch, dtype_or_device, dtype_or_device)
    return lambda batch, model: {**batch, "input_ids": batch["input_ids"].to(to)}


def with_nan_state(batch, model):
    hidden, memory = model(**batch, use_cache=True).state
    memory[0, 1, 2] = float("nan")
    return {**batch, "state": (hidden, memory)}


def with_labels(*values):
    import torch

    return lambda batch, model: {**batch, "labels": torch.tensor(values)}


# --- pipelines, sentence embeddings and model cards: calls ---


def tag(inputs, **options):
    """The `token-classification` pipeline of a tagger head on `M` called on `inputs`."""

    def call(root):
        from transformers import pipeline

        return pipeline("token-classification", model=str(root / "M"))(inputs, **options)

    return call


# --- sentence pairs and question answering: calls ---


def warm_state_of_shapes(folder, hidden_shape, memory_shape):
    """`ElmoModel.set_warm_state` of the model in `folder` given zeros of these shapes."""
    import torch

    from hf_elmo import ElmoModel

    ElmoModel.from_pretrained(folder).set_warm_state((torch.zeros(hidden_shape), torch.zeros(memory_shape)))


def with_pair(second_sentences, **positions):
    """The batch's sentences paired with `second_sentences` (`pair_...` inputs), plus `positions` (keyword arguments
    of the model) as tensors."""
    import torch

    def transform(batch, model):
        second = ElmoTokenizer()(second_sentences, padding=True, return_tensors="pt")
        extra = {key: torch.tensor(value) for key, value in positions.items()}
        return {**batch, **{"pair_" + key: value for key, value in second.items()}, **extra}

    return transform


def answer(**inputs):
    """The question-answering pipeline of a `ElmoForQuestionAnswering` from `M` called on `inputs`."""

    def call(root):
        from hf_elmo import ElmoForQuestionAnswering, ElmoQuestionAnsweringPipeline

        model = ElmoForQuestionAnswering.from_pretrained(root / "M").eval()
        return ElmoQuestionAnsweringPipeline(model=model, tokenizer=ElmoTokenizer())(**inputs)

    return call


def question_answering_pipeline(task, model_class):
    """`pipeline(task)` of a `model_class` from `M` with its tokenizer."""

    def call(root):
        from transformers import pipeline

        import hf_elmo

        model = getattr(hf_elmo, model_class).from_pretrained(root / "M")
        return pipeline(task, model=model, tokenizer=ElmoTokenizer())

    return call


def sentence_model(**options):
    """The sentence-transformers recipe on `M` with `options`, encoding a sentence."""

    def call(root):
        from hf_elmo.features.sentence_embeddings import elmo_sentence_transformer

        return elmo_sentence_transformer(root / "M", **options).encode(["The cat sat ."])

    return call


# --- compact training data, its guard-rails and embedding in several processes: calls ---


def word_table(words=()):
    """The word table of `words` with the vocabulary of `B`."""
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "a", "dog", "."])
    return WordTable(tokenizer, words)


def collate_compact(*windows):
    return lambda root: DataCollatorForBiLM(words=word_table())([{"positions": window} for window in windows])


def embed_in_parts(*arguments):
    from hf_elmo.commands.cli import build_parser
    from hf_elmo.commands.embed import check_split_between_processes

    options = build_parser().parse_args(["embed", arguments[0], "out.h5", "--model", "M", *arguments[1:]])
    check_split_between_processes(options, 2)


def compact_windows(root, table_words):
    table = word_table(table_words)
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(list(table.words[:9]))
    return load_compact_bilm_dataset(["corpus.txt"], table, tokenizer, cache_dir=root / "cache")


# --- lazy streams (train --stream over shards): calls ---


def stream_dataset_then(edit, shards=(CORPUS, "the dog sat .\n"), **options):
    """The setup that writes `shards` into `shards/`, makes a `StreamWindowDataset` of them (as a run starts) and then
    changes them with `edit`, and the call that asks that dataset for its last step's batch (past every shard)."""
    made = {}

    def make(root):
        for number, text in enumerate(shards):
            write(f"shards/{'abc'[number]}.txt", text)(root)
        tokenizer = ElmoTokenizer()
        tokenizer.set_word_vocabulary(["<S>", "</S>", "<UNK>", "the", "cat", "sat", "a", "dog", "."])
        made["dataset"] = StreamWindowDataset("shards", tokenizer, 2, 8, seed=0, steps=40, **options)
        edit(root)

    def last_batch(root):
        dataset = made["dataset"]
        first = ((dataset.steps - 1) * dataset.processes + dataset.rank) * dataset.rows
        return [dataset[first + row] for row in range(dataset.rows)]

    return [make], last_batch


# --- TorchScript tracing (torch.jit.trace): calls ---


def traced(model_class, folder):
    """`torch.jit.trace` of `model_class` from `folder` on a padded batch (a question and its context for the
    question-answering head), as transformers' TorchScript recipe traces a model with `return_dict=False`."""

    def trace(root):
        import torch

        import hf_elmo

        model = getattr(hf_elmo, model_class).from_pretrained(root / folder, return_dict=False).eval()
        if model_class == "ElmoForQuestionAnswering":
            batch = ElmoTokenizer()(["Who sat ?", "A"], ["The cat sat .", "A dog"], padding=True, return_tensors="pt")
            example = {name: batch[name] for name in ("input_ids", "attention_mask", "pair_input_ids")}
        else:
            example = {name: padded_batch(root)[name] for name in ("input_ids", "attention_mask")}
        with warnings.catch_warnings():  # TorchScript's own deprecation notices, beside the point here
            warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
            torch.jit.trace(model, example_kwarg_inputs=example)

    return trace


# --- ElmoTrainer in a script of one's own: the rows of one collator given to the other: calls ---


def full_row():
    """A window of three positions as `load_bilm_dataset` stores it: character rows and targets."""
    return {"input_ids": [0] * 150, "labels": [-100] * 6}


def collate_with_another_table(root):
    """The windows of corpus.txt prepared with its word table, as a data loader reads them, collated with the table of
    one more word, sorted before the others: their indices would be other words. Prepared in a cache of its own, the
    working folder being left as it was."""
    import tempfile

    table = word_table(CORPUS.split())
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(list(table.words[:9]))
    with tempfile.TemporaryDirectory() as cache:
        windows = load_compact_bilm_dataset(["corpus.txt"], table, tokenizer, cache_dir=cache)
        DataCollatorForBiLM(words=word_table([*CORPUS.split(), "aardvark"]))(windows.__getitems__([0, 1]))


def windows_split_otherwise(root):
    """The windows of raw.txt split by the tokenizer, with the table of its whitespace-separated words."""
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(list(word_table().words))
    table = WordTable.of_files(["raw.txt"], tokenizer, split="whitespace")
    load_compact_bilm_dataset(["raw.txt"], table, tokenizer, split="pretokenizer", cache_dir=root / "cache")


def trainer_of_a_smaller_softmax(root):
    """`ElmoTrainer` of a model whose softmax has fewer words than the vocabulary of the word table it collates with
    (its output folder, which `Trainer` makes, outside the working folder)."""
    import tempfile

    from transformers import TrainingArguments

    from hf_elmo.training.trainer import ElmoTrainer

    with tempfile.TemporaryDirectory() as output_dir:
        ElmoTrainer(
            model=ElmoForBiLM(ElmoConfig(**TINY, vocab_size=5)),
            args=TrainingArguments(output_dir, use_cpu=True, report_to=[]),
            data_collator=DataCollatorForBiLM(words=word_table()),
            word_tokenizer=ElmoTokenizer(),
            clip_norm=0.0,
        )


def trainer_with(training_arguments: dict | None = None, **options):
    """A call making an `ElmoTrainer` of `options` and `TrainingArguments` of `training_arguments` (its output
    folder, which `Trainer` makes, outside the working folder)."""

    def make(root):
        import tempfile

        from transformers import TrainingArguments

        from hf_elmo.training.trainer import ElmoTrainer

        with tempfile.TemporaryDirectory() as output_dir:
            ElmoTrainer(
                model=ElmoForBiLM(ElmoConfig(**TINY, vocab_size=9)),
                args=TrainingArguments(output_dir, use_cpu=True, report_to=[], **(training_arguments or {})),
                data_collator=DataCollatorForBiLM(words=word_table()),
                word_tokenizer=ElmoTokenizer(),
                clip_norm=0.0,
                **options,
            )

    return make


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
    # --- checkpoint conversion, configuration and model-input checks ---
    "ElmoConfig num_labels 10**9": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=10**9),
        r"^ElmoConfig\.num_labels must be an int from 1 to 100,000, got 1000000000\.$",
    ),
    "ElmoConfig num_labels 0": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=0),
        r"^ElmoConfig\.num_labels .* got 0\.$",
    ),
    "ElmoConfig num_labels -1": (
        [],
        lambda root: ElmoConfig(**TINY, num_labels=-1),
        r"^ElmoConfig\.num_labels .* got -1\.$",
    ),
    "num_labels set on a config": (
        [],
        lambda root: setattr(ElmoConfig(**TINY), "num_labels", 10**9),
        r"^ElmoConfig\.num_labels must be an int",
    ),
    "a classifier from a config.json with num_labels 10**9": (
        [edit_json("M/config.json", num_labels=10**9)],
        load("ElmoForSequenceClassification", "M"),
        r"M: config\.json: ElmoConfig\.num_labels must be an int from 1 to 100,000, got 1000000000\.$",
    ),
    "ElmoConfig: a field of the wrong type": (
        [],
        lambda root: ElmoConfig(**{**TINY, "cell_dim": "8"}),
        r"^ElmoConfig\.cell_dim must be int, got '8'\.$",
    ),
    "ElmoConfig: a field set to the wrong type": (
        [],
        lambda root: setattr(ElmoConfig(**TINY), "filters", 3),
        r"^ElmoConfig\.filters must be list\[list\[int\]\]",
    ),
    "ElmoConfig: a value its validator refuses": (
        [],
        lambda root: ElmoConfig(**TINY, dropout=1.5),
        r"^ElmoConfig\.dropout must be in \[0, 1\), got 1\.5\.$",
    ),
    "ElmoModel from a config.json that is a bare number": (
        [write("M/config.json", "5")],
        load("ElmoModel", "M"),
        r"M/config\.json: expected a JSON object \(configuration fields\), got int$",
    ),
    "ElmoModel from a config.json with torch_dtype float8": (
        [edit_json("M/config.json", torch_dtype="float8_e4m3fn")],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.torch_dtype must name a torch dtype such as 'float32', got 'float8_e4m3fn'; the "
        r"model computes in float32, float16, bfloat16, float64\.$",
    ),
    "ElmoModel from a shard index that points outside the folder": (
        [shards_outside],
        load("ElmoModel", "M"),
        r"M: model\.safetensors\.index\.json names the shard '\.\./x\.safetensors', outside the model folder",
    ),
    "int8 input_ids": (
        [],
        run_model(with_ids_as("int8")),
        r"^input_ids of dtype torch\.int8 cannot hold this model's character ids \(up to 261\); use torch\.int64",
    ),
    "uint8 input_ids": ([], run_model(with_ids_as("uint8")), r"^input_ids of dtype torch\.uint8 cannot hold"),
    "state with a NaN": ([], run_model(with_nan_state), r"^state holds NaN or infinite values"),
    "input_ids on the meta device": (
        [],
        run_model(with_ids_as("meta")),
        r"^input_ids is on the meta device, which holds shapes but no values",
    ),
    "a NaN regression label": (
        [],
        run_model(with_labels(1.0, float("nan")), "ElmoForSequenceClassification", num_labels=1),
        r"^labels hold NaN or infinite values \(regression\): the loss would be NaN\.$",
    ),
    "a NaN multi-label label": (
        [],
        run_model(
            with_labels([1.0, float("nan")], [0.0, 1.0]),
            "ElmoForSequenceClassification",
            num_labels=2,
            problem_type="multi_label_classification",
        ),
        r"^labels hold NaN or infinite values \(multi_label_classification\)",
    ),
    "ElmoTokenizer from a folder whose tokenizer_class is BertTokenizer": (
        [edit_json("M/tokenizer_config.json", tokenizer_class="BertTokenizer")],
        lambda root: ElmoTokenizer.from_pretrained(root / "M"),
        r"M: tokenizer_config\.json names tokenizer_class 'BertTokenizer', expected 'ElmoTokenizer'",
    ),
    # --- pipelines, sentence embeddings and model cards ---
    "token-classification pipeline: lists of words without is_split_into_words": (
        [],
        tag([["The", "cat"]]),
        r"^ElmoTokenClassificationPipeline expects raw text \(str\), or lists of words with "
        r"is_split_into_words=True; got list\.$",
    ),
    "token-classification pipeline: raw text with is_split_into_words=True": (
        [],
        tag("The cat", is_split_into_words=True),
        r"^With is_split_into_words=True each input must be a list of "
        r"words \(str\), got str\.$",
    ),
    "token-classification pipeline: a word that is not a str": (
        [],
        tag(["The", 3], is_split_into_words=True),
        r"^With is_split_into_words=True each word must be a str, got "
        r"int at 1\.$",
    ),
    "token-classification pipeline: an unknown aggregation_strategy": (
        [],
        tag("The cat", aggregation_strategy="longest"),
        r"^aggregation_strategy must be one of \['none', "
        r"'simple', 'first', 'average', 'max'\], got 'longest'$",
    ),
    "token-classification pipeline: stride, which reads subword tokens": (
        [],
        tag("The cat", stride=2),
        r"^ElmoTokenClassificationPipeline got unsupported arguments \['stride'\]",
    ),
    "sentence embeddings: max_seq_length leaving no room for a word": (
        [],
        sentence_model(max_seq_length=2),
        r"^max_seq_length must be an int of at least 3 positions \(<S>, a word, "
        r"</S>\), got 2$",
    ),
    "sentence embeddings: a pooling mode that reads the boundary positions": (
        [],
        sentence_model(pooling_mode="cls"),
        r"^pooling_mode must be one of \('mean', 'max'\) \(over the words\), "
        r"got 'cls'$",
    ),
    # --- compact training data, its guard-rails and embedding in several processes ---
    "compact windows of a file with the word table of other files": (
        [],
        lambda root: compact_windows(root, table_words=[]),
        r"^corpus\.txt: the word 'on' is not in the word table: the file changed after the table was made from it, or "
        r"the table was made from other files$",
    ),
    "a compact window too short": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [0, 50]),
        r"^Example 1: expected a stored window of 3 entries or more, got \(2,\)\.$",
    ),
    "compact windows collated with the word table of other files": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, 50, 1, -1]),
        r"^Example 1: stored word indices must be in \[-1, 8\], got \[-1, 50\]: the window was prepared with another "
        r"word table\.$",
    ),
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
    "a word table without a word vocabulary": (
        [],
        lambda root: WordTable(ElmoTokenizer(), ["a"]),
        r"^The tokenizer has no word vocabulary for the LM targets",
    ),
    # --- lazy streams (train --stream over shards) ---
    "a stream dataset's shard removed after the run started": (
        *stream_dataset_then(lambda root: (root / "shards/b.txt").unlink()),
        r"^shards/b\.txt: cannot read input \(No such file or directory\)$",
    ),
    "a stream dataset's shard emptied after the run started": (
        *stream_dataset_then(write("shards/b.txt", "")),
        r"^Training file 'shards/b\.txt' is empty: it has no words\.$",
    ),
    "a stream dataset's shard made invalid UTF-8 after the run started": (
        *stream_dataset_then(write("shards/a.txt", b"the cat .\n\xff\n")),
        r"^shards/a\.txt: line 2 is not valid UTF-8 \(byte 1: invalid start byte\)$",
    ),
    "a stream dataset of one line for two processes": (
        *stream_dataset_then(lambda root: None, shards=("the cat .\n",), rank=1, processes=2),
        r"^Process 1 of 2 has no sentence of the training text to read: use fewer processes or more text\.$",
    ),
    # --- sentence pairs and question answering ---
    "a pair of one sentence and a batch": (
        [],
        lambda root: ElmoTokenizer()("A man sleeps .", ["Someone rests ."]),
        r"^text and text_pair must both be one sentence or both a batch of sentences, got one sentence and a batch$",
    ),
    "pairs of batches of different lengths": (
        [],
        lambda root: ElmoTokenizer()(["A man sleeps .", "Hi"], ["Someone rests ."]),
        r"^text has 2 sentences but text_pair has 1: each sentence needs its pair$",
    ),
    "truncation only_second without a pair": (
        [],
        lambda root: ElmoTokenizer()("A man sleeps .", truncation="only_second", max_length=3),
        r"^truncation='only_second' needs sequence pairs: pass text_pair$",
    ),
    "a pair whose second sentence has no words": (
        [],
        run_model(with_pair(["Someone rests .", ""]), "ElmoForSequenceClassification", sentence_pairs=True),
        r"^pair_input_ids row 1 has no words: each side of a sentence pair needs at least one word$",
    ),
    "a pair classifier given more second sentences than first": (
        [],
        run_model(with_pair(["a", "b", "c"]), "ElmoForSequenceClassification", sentence_pairs=True),
        r"^input_ids has 2 rows but pair_input_ids has 3: each sentence needs its pair$",
    ),
    "a pair classifier without the second sentences": (
        [],
        run_model(lambda batch, model: batch, "ElmoForSequenceClassification", sentence_pairs=True),
        r"^ElmoForSequenceClassification reads sentence pairs: pass pair_input_ids",
    ),
    "second sentences given to a single-sentence classifier": (
        [],
        run_model(with_pair(["a", "b"]), "ElmoForSequenceClassification"),
        r"^pair_input_ids given to a single-sentence classifier: build a pair classifier with sentence_pairs=True",
    ),
    "cached layers of the second sentences of the wrong shape": (
        [],
        run_model(
            with_pair(["a b", "c"], pair_elmo_hidden_states=[[[[0.0] * 32]] * 4] * 2), "ElmoForQuestionAnswering"
        ),
        r"^the second sentences \(pair_\.\.\.\): elmo_hidden_states must have shape \(2, 4, 3, 32\)",
    ),
    "an answer span outside the context": (
        [],
        run_model(with_pair(["a b c", "d"], start_positions=[1, 1], end_positions=[3, 2]), "ElmoForQuestionAnswering"),
        r"^end_positions\[1\] = 2 is outside the context: its words are at positions 1 to 1 of pair_input_ids "
        r"\(0: no answer\)$",
    ),
    "an answer span that ends before it starts": (
        [],
        run_model(with_pair(["a b c", "d"], start_positions=[3, 1], end_positions=[2, 1]), "ElmoForQuestionAnswering"),
        r"^start_positions\[0\] = 3 comes after end_positions\[0\] = 2: an answer ends at or after its start$",
    ),
    "float answer positions": (
        [],
        run_model(with_pair(["a", "b"], start_positions=[1.0, 1.0], end_positions=[1, 1]), "ElmoForQuestionAnswering"),
        r"^start_positions must be integer positions of shape \(2,\) \(one per question\), got torch\.float32 \(2,\)$",
    ),
    "a question-answering pipeline given an empty context": (
        [],
        answer(question="Who sat?", context="  "),
        r"^the context has no words$",
    ),
    "a question-answering pipeline given more questions than contexts": (
        [],
        answer(question=["Who sat?", "Where?"], context=["The cat sat."]),
        r"^2 questions but 1 contexts: each needs its context$",
    ),
    "a question-answering pipeline whose windows would not move": (
        [],
        answer(question="Who sat?", context="The cat sat.", max_context_words=4, stride=4),
        r"^stride must be in \[0, max_context_words\) = \[0, 4\), got 4$",
    ),
    # --- the question-answering task (pipeline("question-answering"), "elmo-question-answering") ---
    "the question-answering task given an ELMo model without the question-answering head": (
        [],
        question_answering_pipeline("question-answering", "ElmoModel"),
        r"^ElmoQuestionAnsweringPipeline needs an ElmoForQuestionAnswering model \(start and end logits over the "
        r"context\), got ElmoModel$",
    ),
    "the elmo-question-answering task given a tagger": (
        [],
        question_answering_pipeline("elmo-question-answering", "ElmoForTokenClassification"),
        r"^ElmoQuestionAnsweringPipeline needs an ElmoForQuestionAnswering model \(start and end logits over the "
        r"context\), got ElmoForTokenClassification$",
    ),
    # --- export to ONNX ---
    "export_onnx without onnxscript installed": (
        [],
        lambda root: without_module("onnxscript", export_onnx, root / "M", root / "out"),
        r"^--format onnx needs the package onnxscript: pip install 'hf-elmo\[onnx\]'",
    ),
    # --- the paths (config.paths, ElmoPaths) ---
    "from_pretrained with paths= naming no path": (
        [],
        lambda root: load_with(root / "M", paths={"char_cnn": "fused"}),
        r"^paths\.char_cnn must be one of \('auto', 'reference', 'distinct_words', 'every_word'\), got 'fused'\.$",
    ),
    "config.json paths that are a string": (
        [edit_json("M/config.json", paths="reference")],
        load("ElmoModel", "M"),
        r"M: config\.json: ElmoConfig\.paths must be dict \| hf_elmo\.paths\.ElmoPaths \| None, got "
        r"'reference'\.$",
    ),
    "compiled window max forced on a bfloat16 model": (
        [],
        lambda root: run_bfloat16(root / "M", paths={"window_max": "compiled"}),
        r"^paths\.window_max='compiled' needs the compiled CPU loops \(float32 CPU tensors, a C\+\+ compiler\); got "
        r"torch\.bfloat16 tensors on cpu\.$",
    ),
    "Triton LSTM kernels forced on the sorted path": (
        [],
        lambda root: run_bfloat16(root / "M", paths={"lstm": "sorted", "lstm_kernels": "triton"}),
        r"^paths\.lstm_kernels='triton' (needs Triton|runs on paths\.lstm='static', got 'sorted')",
    ),
    # --- checks the model file calls from input_checks: the question-answering head, the warm state ---
    "a question-answering model without contexts": (
        [],
        run_model(lambda batch, model: batch, "ElmoForQuestionAnswering"),
        r"^ElmoForQuestionAnswering reads sentence pairs: pass pair_input_ids \(and pair_attention_mask\)",
    ),
    "a warm state of the wrong shape": (
        [],
        lambda root: warm_state_of_shapes(root / "M", (2, 3), (2, 3)),
        r"^A warm state must be \(hidden, memory\) of shapes \(\d+, \d+\) and \(\d+, \d+\) \(num_layers, 2 \* "
        r"projection_dim / 2 \* cell_dim\), got \[\(2, 3\), \(2, 3\)\]\.$",
    ),
    # --- TorchScript: torch.jit.trace of every model class is refused, pointing to torch.export and ONNX ---
    "torch.jit.trace of ElmoModel": (
        [],
        traced("ElmoModel", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript, as torch\.onnx\.export\(dynamo=False\) "
        r"does\): the trace would keep the length and the sentence lengths of its example as constants; use "
        r"torch\.export\.export with dynamic batch and length, or hf-elmo export --format onnx \(docs/export\.md\)\.$",
    ),
    "torch.jit.trace of ElmoForBiLM": (
        [],
        traced("ElmoForBiLM", "B"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForTokenClassification": (
        [],
        traced("ElmoForTokenClassification", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForSequenceClassification": (
        [],
        traced("ElmoForSequenceClassification", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    "torch.jit.trace of ElmoForQuestionAnswering": (
        [],
        traced("ElmoForQuestionAnswering", "M"),
        r"^ELMo models cannot be traced by torch\.jit\.trace \(TorchScript",
    ),
    # --- the question-answering pipeline's arguments: top_k, max_context_words ---
    "a question-answering pipeline asked for no answer at all (top_k=0)": (
        [],
        answer(question="Who sat?", context="The cat sat.", top_k=0),
        r"^top_k must be >= 1, got 0$",
    ),
    "a question-answering pipeline given windows of no word (max_context_words=0)": (
        [],
        answer(question="Who sat?", context="The cat sat.", max_context_words=0),
        r"^max_context_words must be >= 1, got 0$",
    ),
    # --- ElmoTrainer in a script of one's own: the rows of one collator given to the other ---
    "rows of load_bilm_dataset collated with a word table": (
        [],
        lambda root: DataCollatorForBiLM(words=word_table())([full_row()]),
        r"^Example 0: DataCollatorForBiLM\(words=\.\.\.\) takes stored windows \(positions, the rows of "
        r"load_compact_bilm_dataset\), got \['input_ids', 'labels'\]: rows of load_bilm_dataset need "
        r"DataCollatorForBiLM\(\) without words\.$",
    ),
    "stored windows collated without their word table": (
        [],
        lambda root: DataCollatorForBiLM()([{"positions": [-1, 0, 3, 1, -1]}]),
        r"^Example 0: expected input_ids and labels \(a row of load_bilm_dataset\), got \['positions'\]: stored "
        r"windows need DataCollatorForBiLM\(words=<their WordTable>\)\.$",
    ),
    "stored windows whose word indices are not integers": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, 3.5, 1, -1]),
        r"^Example 1: stored word indices must be integers, got float64\.$",
    ),
    "stored windows collated with the word table of other files": (
        [],
        collate_with_another_table,
        r"^Example 0: the window was prepared with another word table than the collator's \(of 13 words\): give "
        r"DataCollatorForBiLM the WordTable given to load_compact_bilm_dataset\.$",
    ),
    "a stored window with a neighbour's -1 among its positions": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, -1, 1, -1]),
        r"^Example 1: the positions of a stored window must be word indices in \[0, 8\], got -1 \(-1 is only the "
        r"neighbour before or after them\)\.$",
    ),
    "compact windows split otherwise than the words of their word table": (
        [write("raw.txt", "A bird flew.\n")],
        windows_split_otherwise,
        r"^The word table was made of the words of split='whitespace', the windows would be split with "
        r"split='pretokenizer': give both the same split\.$",
    ),
    "ElmoTrainer of a model whose softmax is smaller than the word table's vocabulary": (
        [],
        trainer_of_a_smaller_softmax,
        r"^The word table's targets are word ids up to 8, the model's softmax has 5 \(vocab_size\): make the table "
        r"with the model's tokenizer, or the model with vocab_size=len\(tokenizer\.word_vocabulary\)\.$",
    ),
    # --- review of the batches made on the device: Trainer's losses of their own took the labels from the model ---
    "ElmoTrainer with label smoothing": (
        [],
        trainer_with({"label_smoothing_factor": 0.1}),
        r"^label_smoothing_factor must be 0 for ElmoForBiLM, got 0\.1: the model computes its loss itself, Trainer's "
        r"label smoothing would read logits it does not return\.$",
    ),
    "ElmoTrainer with a compute_loss_func": (
        [],
        trainer_with(compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss),
        r"^compute_loss_func: ElmoTrainer takes none, ElmoForBiLM computes its loss itself from the labels and "
        r"returns no logits; override compute_loss in a subclass instead\.$",
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
from hf_elmo.commands.cli import main
sys.exit(main(argv.split()))
"""

SIGNAL_CASES = {
    # name: (where the signal is sent from: module, class, method, on which call; the signal; the command)
    "convert, SIGINT after the weights are written": (
        ("hf_elmo.tokenization_elmo", "ElmoTokenizer", "save_pretrained", 1),
        "SIGINT",
        f"{CONVERT} --output-dir out",
    ),
    "export --force over an earlier export, SIGHUP between two datasets": (
        ("h5py", "Group", "create_dataset", 3),
        "SIGHUP",
        "export --model M --output-dir earlier --force",
    ),
    "embed, SIGHUP after some datasets": (
        ("hf_elmo.features.embed", "Embedder", "__call__", 2),
        "SIGHUP",
        f"{EMBED} --model M --batch-size 1",
    ),
    "vocab, SIGTERM": (
        ("hf_elmo.commands.vocab", "", "write_word_vocabulary", 1),
        "SIGTERM",
        "vocab corpus.txt --output v.txt",
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
        cwd=workspace,
        capture_output=True,
        timeout=900,
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

    command = (
        f"{TRAIN} --per-device-train-batch-size 1 --max-steps 6 --save-steps 2 --num-softmax-samples 0 "
        "--logging-steps 100 "
        "--window 12"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIGNALLED_RUN,
            "hf_elmo.commands.train",
            "ElmoTrainer",
            "_save_rng_state",
            "2",
            str(int(signal.SIGTERM)),
            command,
        ],
        cwd=workspace,
        capture_output=True,
        timeout=900,
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
    for path, mode in [
        ("converted", 0o755),
        ("exported", 0o755),
        ("out.h5", 0o644),
        ("v.txt", 0o644),
        ("converted/config.json", 0o644),
        ("exported/weights.hdf5", 0o644),
    ]:
        assert stat.S_IMODE((workspace / path).stat().st_mode) == mode, path


def test_force_replaces_an_earlier_output_of_each_command(workspace, capsys):
    for command in (
        f"{CONVERT} --output-dir out",
        "export --model M --output-dir exported",
        f"{EMBED} --model M",
        "vocab corpus.txt --output v.txt",
    ):
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
    from hf_elmo.training.corpus import build_word_vocabulary
    from hf_elmo.training.windows import load_bilm_dataset

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


# --- embedding, perplexity, export and warm-state commands: a full disk, permissions, one reader, the text split ---

# Each command runs in a child process whose files may not grow beyond 64 KiB (RLIMIT_FSIZE), as on a full disk:
# with SIGXFSZ ignored a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC.
_FILE_SIZE_LIMITED_RUN = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
from hf_elmo.commands.cli import main
sys.exit(main(sys.argv[1].split()))
"""

FULL_DISK_CASES = {
    # name: (command, the output it names)
    "embed, one dataset per line": ("embed in.txt out.h5 --all --quiet --model M --batch-size 8", "out.h5"),
    "embed --layout packed": ("embed in.txt out.h5 --all --quiet --model M --batch-size 8 --layout packed", "out.h5"),
    "export": ("export --model M --output-dir out", "out"),
}


@pytest.mark.parametrize("name", FULL_DISK_CASES)
def test_a_full_disk_is_one_line_and_leaves_nothing(name, workspace):
    import errno
    import subprocess
    import sys

    command, output = FULL_DISK_CASES[name]
    (workspace / "in.txt").write_text("".join(f"the cat sat on the mat {n} times .\n" for n in range(300)))
    before = snapshot(workspace)
    done = subprocess.run(
        [sys.executable, "-c", _FILE_SIZE_LIMITED_RUN, command],
        cwd=workspace,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    stderr = done.stderr.decode()
    lines = [line for line in stderr.split("\n") if line.strip() and "\r" not in line]
    assert done.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert lines == [f"error: {output}: not written ({os.strerror(errno.EFBIG)})"], stderr[-3000:]
    assert snapshot(workspace) == before


def test_weights_get_the_permissions_of_any_new_file(workspace):
    umask = os.umask(0o027)
    try:
        assert cli_main(f"{CONVERT} --output-dir converted".split()) == 0
        assert cli_main("warm-state --model M corpus.txt --device cpu".split()) == 0  # replaces M's weights
    finally:
        os.umask(umask)
    for path in ("converted/model.safetensors", "converted/config.json", "M/model.safetensors"):
        assert stat.S_IMODE((workspace / path).stat().st_mode) == 0o640, path


HELD_OUT = (FIXTURES / "bilm-tf-checkpoint" / "heldout.txt").read_text(encoding="utf-8").split("\n")[:40]


def perplexity_printed(capsys, model, *arguments) -> list[str]:
    assert cli_main(["perplexity", "--model", str(model), *map(str, arguments)]) == 0
    return capsys.readouterr().out.strip().split("\n")


# The bilm-tf checkpoint's biLM: a trained model, whose perplexity tells a word from another.
@pytest.mark.parametrize("mode", [[], ["--stream", "--batch-size", "4"], ["--start", "zero"]], ids=str)
@pytest.mark.parametrize("variant", ["byte-order mark", "CR and CRLF"])
def test_perplexity_reads_text_files_as_text_mode_does(variant, mode, checkpoint_dir, tmp_path, capsys):
    text = "\n".join(HELD_OUT) + "\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    if variant == "byte-order mark":
        (tmp_path / "variant.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    else:
        (tmp_path / "variant.txt").write_bytes(text.replace("\n", "\r", 3).replace("\n", "\r\n", 3).encode())
    plain = perplexity_printed(capsys, checkpoint_dir, tmp_path / "plain.txt", "--window", "60", *mode)
    assert perplexity_printed(capsys, checkpoint_dir, tmp_path / "variant.txt", "--window", "60", *mode) == plain


@pytest.mark.parametrize("mode", [[], ["--stream", "--batch-size", "4"], ["--start", "zero"]], ids=str)
def test_perplexity_splits_text_as_the_model_was_trained(mode, checkpoint_dir, tmp_path, capsys):
    model = tmp_path / "bilm"
    shutil.copytree(checkpoint_dir, model)
    # Raw text: the held-out sentences with their punctuation attached to the words before it.
    raw = "".join(re.sub(r" ([.,:;?!])", r"\1", line) + "\n" for line in HELD_OUT)
    (tmp_path / "raw.txt").write_text(raw, encoding="utf-8")
    # The truth: the words of the tokenizer's splitter, written out separated by spaces, read as they are.
    tokenizer = ElmoTokenizer.from_pretrained(model)
    split = "".join(" ".join(tokenizer.split_words(line)) + "\n" for line in raw.splitlines())
    (tmp_path / "split.txt").write_text(split, encoding="utf-8")
    window = ["--window", "60"]
    truth = perplexity_printed(capsys, model, tmp_path / "split.txt", "--split", "whitespace", *window, *mode)
    assert truth[0] == "text split             whitespace"
    (model / "bilm_training_options.json").write_text(json.dumps({"split": "pretokenizer"}))
    recorded = perplexity_printed(capsys, model, tmp_path / "raw.txt", *window, *mode)
    assert recorded == [truth[0].replace("whitespace", "pretokenizer"), *truth[1:]]
    # An explicit --split overrides the recorded one; on the raw text, whitespace gives other words and numbers.
    whitespace = perplexity_printed(capsys, model, tmp_path / "raw.txt", "--split", "whitespace", *window, *mode)
    assert whitespace[0] == truth[0] and whitespace[2:] != truth[2:]


# --- checkpoint conversion, configuration and model-input checks: the right results ---------------------------------


def test_a_config_json_without_forget_bias_is_read_as_the_folders_that_lacked_it(workspace):
    """Folders converted before `forget_bias` existed hold TensorFlow's 1.0 folded into the stored bias and no such
    field; a missing field therefore means 0, and such a folder gives the original's vectors."""
    import numpy as np
    import torch
    from conftest import fixture_batches

    from hf_elmo import ElmoModel

    values = json.loads((workspace / "M/config.json").read_text())
    assert values.pop("forget_bias") == 1.0
    (workspace / "M/config.json").write_text(json.dumps(values))
    D = values["cell_dim"]

    def fold(tensors):
        for name, tensor in tensors.items():
            if name.endswith("state_linearity.bias"):  # gates [i, f, g, o]
                tensor[D : 2 * D] += 1.0

    edit_weights("M", fold)(workspace)
    model = ElmoModel.from_pretrained(workspace / "M").eval()
    words, expected = fixture_batches("allennlp")[0]
    batch = ElmoTokenizer()(words, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        top = model(**batch).last_hidden_state
    for k, sentence in enumerate(words):  # the original's rule, as tests/model/test_modeling_elmo.py compares
        np.testing.assert_allclose(top[k, 1 : len(sentence) + 1].numpy(), expected[k], atol=1e-6, rtol=1e-5)


def test_a_token_batch_without_labels_gives_what_bert_gives(workspace):
    """All -100: NaN, the mean over no positions, as transformers' BERT token classifier gives."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from hf_elmo import ElmoForTokenClassification

    batch = padded_batch(workspace)
    no_labels = torch.full(batch["attention_mask"].shape, -100)
    ours = ElmoForTokenClassification.from_pretrained(workspace / "M", num_labels=3).eval()
    bert = BertForTokenClassification(
        BertConfig(
            vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, num_labels=3
        )
    ).eval()
    assert torch.isnan(ours(**batch, labels=no_labels).loss)
    assert torch.isnan(bert(input_ids=torch.ones_like(no_labels), labels=no_labels).loss)
