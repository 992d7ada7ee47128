"""What the hostile-input tests share: the working folder of a case (`workspace`, with the session's `bilm_dir`), its
snapshot, the ways a case prepares it or calls the Python API, and the checks every row of a table gets.

Each row is a careless or hostile input, refused with one line, `error: ...` (a `ValueError` through Python), naming
the problem (file, field or line), that leaves every file as it was (nothing written, nothing replaced, nothing left
behind). The tables live beside what they exercise: the command line's in `tests/commands/test_hostile_<command>.py`
(`CASES` through the command line; `MEMORY_CASES`, sizes that would exhaust memory, run in a process whose address
space is limited; `SIGNAL_CASES`, SIGINT, SIGTERM and SIGHUP while an output is being written; `FULL_DISK_CASES`),
the Python API's (`API_CASES`) in the test folder of the wing they call. The fixtures are registered for the whole
suite by `tests/conftest.py`.
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
from hf_elmo.folder_files import record_cache_file
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
    of another word table would read, with its record (a file that does not match its record is prepared again)."""

    def rewrite(root):
        import pyarrow as pa

        schema = pa.schema([("positions", pa.list_(pa.int32()))])
        for path in sorted((root / cache).rglob("*.arrow")):
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                writer.write_batch(pa.record_batch([pa.array([[-1, 0, 10**6, 1, -1]], pa.list_(pa.int32()))], schema))
            record_cache_file(path)

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


def check_refused(case: Case, workspace: Path, capsys) -> None:
    """A row of `CASES`: its command exits with 2 and one line `error: ...` matching its message, and the working
    folder is left as it was."""
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
# A row of `MEMORY_CASES`: name -> (what to change in a copy of M / B / options.json, command, message).

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


def run_memory_cases(cases: dict, tmp_path_factory, converted_dirs, bilm_dir) -> dict:
    """Every row of `cases` run in one limited process, each in a working folder of its own: name -> [exit code,
    standard error, the names left in its working folder]."""
    import subprocess
    import sys

    commands = {}
    for index, (name, ((path, changes), command, _)) in enumerate(cases.items()):
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


def check_memory_refusal(case: tuple, result: list) -> None:
    """A row of `MEMORY_CASES` and what its run gave: exit code 2, its one line, no output left."""
    code, err, left = result
    lines = [line for line in err.split("\n") if line.strip() and "\r" not in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(case[2], lines[0]), lines[0]
    assert left == ["B", "M", "corpus.txt", "d", "in.txt"]  # no output


# --- the Python API: calls --------------------------------------------------------------------------------------------


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


def check_api_refusal(row: tuple, workspace: Path) -> None:
    """A row of `API_CASES`, (setup, call, message): the call raises a `ValueError` matching the message, and the
    working folder is left as it was."""
    setup, call, message = row
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


def check_signal_while_writing(row: tuple, workspace: Path) -> None:
    """A row of `SIGNAL_CASES`, (where the signal is sent from: module, class, method, on which call; the signal; the
    command): the command exits with 130 and one line, leaving the working folder (with an earlier export in
    `earlier/`) as it was."""
    import signal
    import subprocess
    import sys

    (module, owner, attribute, call), signal_name, command = row
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


# --- a full disk: the output not written, nothing left ----------------------------------------------------------------

# Each command runs in a child process whose files may not grow beyond 64 KiB (RLIMIT_FSIZE), as on a full disk:
# with SIGXFSZ ignored a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC.
_FILE_SIZE_LIMITED_RUN = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
from hf_elmo.commands.cli import main
sys.exit(main(sys.argv[1].split()))
"""


def check_full_disk(row: tuple, workspace: Path) -> None:
    """A row of `FULL_DISK_CASES`, (command, the output it names): on a full disk the command exits with 2 and one
    line naming the output, leaving the working folder as it was."""
    import errno
    import subprocess
    import sys

    command, output = row
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
