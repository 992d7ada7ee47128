"""`hf-elmo train`: pre-train the biLM on a corpus, or adapt released weights to a domain, with `Trainer`.

The defaults are the original recipe (bilm-tf `bin/train_elmo.py`): Adagrad with learning rate 0.2 and
initial accumulator 1.0, gradients clipped to a global norm of 10, dropout 0.1, windows of 20 positions,
batches of 128 windows per device, sampled softmax with 8192 negatives, 10 epochs, constant learning rate.

bilm-tf differentiates `window x loss` (its loss is a mean over the window's tokens, its gradient is taken
of the loss times `unroll_steps`). Here the loss stays the mean (what is logged and compared); the factor is
folded into the optimizer instead, which gives the same updates: with gradient `g = c * g'`, Adagrad's
`lr * g / sqrt(a0 + sum g^2)` equals `lr * g' / sqrt(a0 / c^2 + sum g'^2)`, and clipping `g` to norm `n` is
clipping `g'` to `n / c`. So `max_grad_norm` and `adagrad_initial_accumulator` are given on the original
scale and divided by `window` and `window ** 2` before they reach `Trainer`.

Runs unchanged under `torchrun --nproc_per_node=N` and `accelerate launch --multi_gpu --num_processes N` (DDP; without
`--multi_gpu` accelerate starts one process on a machine without a GPU, which the log's process count shows):
`batch_size` is per process, and the loss is normalised by the number of targets over all processes, so N processes
with batch b train like one process with batch N * b.

The examples are windows of whole sentences, each from the start state (`data_bilm`). `stream=True` (`--stream`)
trains the way bilm-tf did instead: every batch row reads one continuous stream of the (each epoch reshuffled)
sentences in pieces of `window` positions, its LSTM state carried from batch to batch (`StreamTrainer`, data in
`streams_bilm`); the carried states are saved with each checkpoint (one file per process) and restored by `resume`,
and the saved model gets a warm start state estimated from the first 2,000 training sentences. On the bundled
Shakespeare at equal wall-clock the windows gave the better model (docs/warm-state.md), so they stay the
default.
"""

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import pickle
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from accelerate.utils import DistributedType
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..adagrad import Adagrad
from ..configuration_elmo import ARCHITECTURE_FIELDS, ELMO_PRESETS, WEIGHT_FORMAT_FIELDS, ElmoConfig
from ..convert_original_elmo import config_from_options
from ..data_bilm import (
    SPLIT_HELP,
    SPLITS,
    TRAINING_OPTIONS_FILE,
    DataCollatorForBiLM,
    WordTable,
    build_word_vocabulary,
    check_text_files,
    iter_sentences,
    load_bilm_dataset,
    load_compact_bilm_dataset,
    window_positions,
)
from ..file_io import ElmoInputError, check_not_an_input, deferred_signals, read_json_object, write_atomically
from ..freed_memory import keep_freed_memory
from ..hub_elmo import add_origin, describe_source
from ..input_checks import check_bilm_batch, values_checked_on_host
from ..model_io import check_finite_weights, safetensors_shapes
from ..modeling_elmo import ElmoForBiLM
from ..streams_bilm import DataCollatorForBiLMStreams, StreamWindowDataset
from ..tokenization_elmo import ElmoTokenizer
from ..warm_state import estimate_warm_state
from ..word_vocabulary import WORD_VOCABULARY_FILE, WORD_VOCABULARY_SPECIALS, read_word_vocabulary

OPTIONS_FILE = TRAINING_OPTIONS_FILE
STAGING_DIR = ".staging"
"""Folder in the output folder where a checkpoint or the final model is written, then moved into place."""
STREAM_STATE_FILE = "stream_state-{rank}.safetensors"
"""The carried LSTM state of process `rank`'s rows, in every checkpoint of a `--stream` run."""
# What a run leaves in its output folder before its first checkpoint (removed when it fails or is stopped; a new run
# may start in a folder holding only these).
LEFT_BEFORE_FIRST_CHECKPOINT = (OPTIONS_FILE, STAGING_DIR)
# Files every checkpoint holds (besides the random state of each process), all read by --resume.
CHECKPOINT_FILES = (
    "config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", TRAINER_STATE_NAME, WORD_VOCABULARY_FILE
)
# Options a resumed run may change: where things go, how often they are reported, how long to go on.
RESUMABLE_CHANGES = {
    "output_dir", "resume", "data_cache_dir", "disable_progress_bar", "report_to", "logging_steps", "eval_steps",
    "save_steps", "save_total_limit", "dataloader_workers", "keep_freed_memory", "max_minutes", "max_steps", "epochs",
}

OPTIMIZERS = ("adagrad", "adamw")


def _option(default=dataclasses.MISSING, help: str = "", **argparse_options):
    """A field of `BiLMTrainingOptions` with its command-line help: `HfArgumentParser` makes `--name` of each field,
    with the field's type and default."""
    metadata = {"help": help, **argparse_options}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class BiLMTrainingOptions:
    """Everything `train_bilm` needs, and the options of `hf-elmo train`; the defaults are the original recipe (see
    the module docstring)."""

    # data
    output_dir: str = _option(help="folder of the run: checkpoints, then the trained biLM")
    train_files: list[str] = _option(
        [],
        help="text files, one sentence per line, or folders of them, or patterns such as 'shards/*.txt' (needed, except "
        "with --resume: then the run's own by default)",
    )
    eval_files: list[str] = _option([], help="held-out text files (or folders, or patterns) for periodic perplexity")
    vocab: str | None = _option(
        None,
        help="vocabulary file (one word per line, <S>, </S>, <UNK> first); default: the --init-from model's, else "
        "built from the training files with --min-count and --max-vocab-size",
    )
    min_count: int = _option(1, help="when building the vocabulary: keep words seen at least this often")
    max_vocab_size: int | None = _option(None, help="when building the vocabulary: at most this many entries")
    split: str = _option("pretokenizer", help=SPLIT_HELP, choices=SPLITS)
    window: int = _option(20, help="positions per example, <S> and </S> included; with --stream, positions per piece")
    stream: bool = _option(
        False,
        help="train the way the original did: every batch row reads one continuous stream of sentences in pieces of "
        "--window positions, its LSTM state carried from batch to batch (the saved model gets a warm start state "
        "estimated from the training text); default: windows of whole sentences, each from the start state",
    )
    streaming: bool = _option(False, help="read the corpus lazily (needs --max-steps)")
    data_cache_dir: str | None = _option(
        None, help="where the datasets library keeps the packed windows (default: its cache, HF_DATASETS_CACHE)"
    )
    # model
    config: str | None = _option(
        None,
        help=f"{'|'.join(ELMO_PRESETS)}|PATH (config.json, model folder or bilm-tf options.json); default: the "
        "--init-from model's, else small",
    )
    init_from: str | None = _option(
        None, help="folder of an ElmoModel (e.g. converted released weights) or ElmoForBiLM to continue from"
    )
    dropout: float = _option(0.1)
    num_softmax_samples: int = _option(8192, help="negatives of the sampled softmax; 0: full softmax")
    # optimisation
    resume: bool = _option(
        False,
        help="continue from the last checkpoint in --output-dir, with the options recorded there; options given again "
        "must agree with them, except where they may change (where things go, how often they are reported, how long "
        "to go on)",
    )
    batch_size: int = _option(128, help="windows per process and step")
    gradient_accumulation_steps: int = _option(1)
    optimizer: str = _option("adagrad", choices=OPTIMIZERS)
    learning_rate: float = _option(0.2)
    adagrad_initial_accumulator: float = _option(1.0)
    max_grad_norm: float = _option(10.0, help="global norm clip of the gradient of window x loss, as in the original")
    lr_scheduler: str = _option("constant", help="a transformers scheduler name")
    warmup_steps: int = _option(0)
    epochs: float = _option(10.0)
    max_steps: int = _option(-1, help="overrides --epochs when > 0")
    logging_steps: int = _option(100)
    eval_steps: int = _option(1250)
    save_steps: int = _option(1250)
    save_total_limit: int = _option(2)
    max_minutes: float | None = _option(None, help="stop (and save) after this many minutes of training")
    seed: int = _option(42)
    bf16: bool = _option(False, help="bfloat16 autocast (GPU, or CPU)")
    dataloader_workers: int | None = _option(
        None,
        help="data loader processes; default: 2 when training on a GPU (batches are read and checked while the GPU "
        "computes), 0 on the CPU (whose cores do the training)",
    )
    keep_freed_memory: bool = _option(
        True,
        help="keep the memory each step frees in the process for the next step (glibc: hf_elmo.freed_memory): CPU "
        "training up to 1.2x as fast (the original size; about 1.04-1.08x for a mid-size model), the process holding "
        "its busiest step's memory between steps",
    )
    report_to: str = _option("none", help="none, tensorboard, wandb, ...")
    disable_progress_bar: bool = _option(False)

    def __post_init__(self):
        if isinstance(self.train_files, (str, os.PathLike)):
            self.train_files = [self.train_files]
        if isinstance(self.eval_files, (str, os.PathLike)):
            self.eval_files = [self.eval_files]
        self.train_files = [os.fspath(f) for f in self.train_files]
        self.eval_files = [os.fspath(f) for f in self.eval_files]
        self.output_dir = os.fspath(self.output_dir)
        if not self.train_files:
            raise ValueError("train_files (--train-files) must name at least one text file, got none.")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}.")
        if self.stream and self.streaming:
            raise ValueError(
                "--stream (continuous streams per batch row) reads the training text into memory; it cannot be "
                "combined with --streaming (lazy reading)."
            )
        if self.streaming and self.max_steps <= 0:
            raise ValueError("Streaming data has no known length: give max_steps (--max-steps) as well.")
        at_least_one = ("batch_size", "gradient_accumulation_steps", "logging_steps", "eval_steps", "save_steps")
        for name in (*at_least_one, "min_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("warmup_steps", "num_softmax_samples", "dataloader_workers"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        for field_ in dataclasses.fields(self):
            value = getattr(self, field_.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{field_.name} must be a finite number, got {value}.")
        for name in ("learning_rate", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")
        if self.adagrad_initial_accumulator <= 0:  # as TensorFlow's Adagrad: the step divides by its square root
            raise ValueError(f"adagrad_initial_accumulator must be > 0, got {self.adagrad_initial_accumulator}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")
        if self.window < 3:
            raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {self.window}.")
        if self.max_steps <= 0 and self.epochs <= 0:
            raise ValueError(f"epochs must be > 0 (or max_steps given), got {self.epochs}: nothing would be trained.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}.")


def _log(message: str):
    # One line per run, not per process.
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


def load_config(spec: str) -> ElmoConfig:
    """A preset name, a folder or config.json written by `save_pretrained`, or a bilm-tf `options.json`."""
    if spec in ELMO_PRESETS:
        return ElmoConfig.from_preset(spec)
    path = Path(spec)
    if path.is_dir():
        return ElmoConfig.from_pretrained(path)
    if not path.is_file():
        raise ValueError(
            f"--config {spec!r} is neither a preset ({', '.join(ELMO_PRESETS)}) nor an existing file or folder."
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--config {spec!r} is not a JSON file: {error}.") from None
    if "lstm" in values and "char_cnn" in values:
        return config_from_options(values, source=str(path))
    return ElmoConfig.from_json_file(path)


def _check_same_architecture(config: ElmoConfig, checkpoint: ElmoConfig, config_spec: str, init_from: str):
    different = [
        f"{name}: --config has {getattr(config, name)!r}, the weights have {getattr(checkpoint, name)!r}"
        for name in ARCHITECTURE_FIELDS
        if getattr(config, name) != getattr(checkpoint, name)
    ]
    if different:
        raise ValueError(
            f"--config {config_spec} does not match the --init-from weights in {init_from}: " + "; ".join(different)
        )


def _prepare_output_dir(options: BiLMTrainingOptions) -> Path:
    config_file = options.config if options.config not in ELMO_PRESETS else None
    inputs = [*options.train_files, *options.eval_files, options.vocab, config_file, options.init_from]
    if Path(options.output_dir).is_symlink():  # as every command's output (file_io.check_output)
        raise ElmoInputError(f"{options.output_dir}: is a symbolic link; give the folder itself or a new name")
    output_dir = check_not_an_input(options.output_dir, inputs)
    if not options.resume and output_dir.exists() and {p.name for p in output_dir.iterdir()} - set(
        LEFT_BEFORE_FIRST_CHECKPOINT
    ):
        raise ValueError(
            f"Output folder {output_dir} is not empty: pass --resume to continue the run in it, or choose another folder."
        )
    return output_dir


def _resumed_options(given: dict) -> BiLMTrainingOptions:
    """The options of a resumed run: those recorded in its folder (`OPTIONS_FILE`), with the ones `given` again, which
    must agree with the record except those a resumed run may change (`RESUMABLE_CHANGES`)."""
    if given.get("output_dir") is None:
        raise ValueError("--resume needs the folder of the run to continue (--output-dir).")
    output_dir = Path(given["output_dir"])
    saved = output_dir / OPTIONS_FILE
    if not saved.is_file() or not _checkpoints(output_dir):
        raise ValueError(f"--resume: {output_dir} holds no checkpoint of an earlier run to continue from.")
    recorded = read_json_object(saved, "options file of the earlier run")
    fields = {f.name: f for f in dataclasses.fields(BiLMTrainingOptions)}
    if set(given) - set(fields):
        raise TypeError(f"Unknown training options: {', '.join(sorted(set(given) - set(fields)))}.")
    try:
        options = BiLMTrainingOptions(**{**{k: v for k, v in recorded.items() if k in fields}, **given})
    except TypeError as error:
        raise ElmoInputError(f"{saved}: not the options of a training run ({error})") from None

    def earlier(name):  # a field the record lacks (written before the field existed) had its default
        if name in recorded:
            return recorded[name]
        field_ = fields[name]
        return field_.default_factory() if field_.default is dataclasses.MISSING else field_.default

    now = dataclasses.asdict(options)
    different = [
        f"--{name.replace('_', '-')} {earlier(name)!r} there, {now[name]!r} given"
        for name in given
        if name in fields and name not in RESUMABLE_CHANGES and now[name] != earlier(name)
    ]
    if different:
        raise ValueError(
            f"--resume: the run in {output_dir} has other options ({OPTIONS_FILE}): " + "; ".join(different)
            + "; leave them out to continue with the recorded ones."
        )
    return options


def _checkpoint_problems(checkpoint: Path, world_size: int, stream: bool = False) -> list[str]:
    """What a resume from `checkpoint` would lack: missing files, or a trainer state that cannot be read."""
    rng_files = [f"rng_state_{rank}.pth" for rank in range(world_size)] if world_size > 1 else ["rng_state.pth"]
    rng_files += [STREAM_STATE_FILE.format(rank=rank) for rank in range(world_size)] if stream else []
    problems = [f"no {name}" for name in (*CHECKPOINT_FILES, *rng_files) if not (checkpoint / name).is_file()]
    if not problems:
        try:
            json.loads((checkpoint / TRAINER_STATE_NAME).read_text(encoding="utf-8"))["global_step"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
            problems.append(f"unreadable {TRAINER_STATE_NAME} ({error})")
    return problems


def _checkpoints(output_dir: Path) -> list[Path]:
    """The `checkpoint-N` folders of a run, by step."""
    found = [p for p in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def _last_complete_checkpoint(output_dir: Path, world_size: int, stream: bool = False) -> Path:
    """The checkpoint --resume continues from: the last one holding everything a resume reads; later incomplete ones
    (written by an older version, or files removed since) are named in the log and left alone. A damaged one (a
    safetensors file that cannot be read, e.g. truncated) is an error naming the file and the intact one before it:
    whether to go back to that is the user's choice."""
    skipped, damaged = [], None
    for checkpoint in reversed(_checkpoints(output_dir)):
        problems = _checkpoint_problems(checkpoint, world_size, stream)
        if problems:
            skipped.append(f"{checkpoint.name} ({', '.join(problems)})")
            continue
        try:
            safetensors_shapes(sorted(str(path) for path in checkpoint.glob("*.safetensors")))
        except OSError as error:
            damaged = damaged or (checkpoint, error)
            continue
        if damaged:
            raise ValueError(
                f"--resume: {damaged[1]}; {checkpoint.name} is intact: move {damaged[0].name} out of {output_dir} to "
                "continue from it."
            )
        if skipped:
            _log(f"--resume: continuing from {checkpoint.name}; skipped incomplete " + "; ".join(skipped) + ".")
        return checkpoint
    if damaged:
        raise ValueError(f"--resume: {damaged[1]}; no earlier checkpoint is intact.")
    raise ValueError(
        f"--resume: {output_dir} holds no complete checkpoint of an earlier run to continue from"
        + (f" (incomplete: {'; '.join(skipped)})" if skipped else "")
        + "."
    )


def _remove_run_leftovers(output_dir: Path, created: bool):
    """After a run failed or was stopped before its first checkpoint: remove what it wrote, so that the same command
    can simply be run again."""
    if _checkpoints(output_dir):
        return
    for name in LEFT_BEFORE_FIRST_CHECKPOINT:
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file():
            path.unlink()
    if created and output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()


def _record_training(options: BiLMTrainingOptions, config: ElmoConfig, checkpoint_config: ElmoConfig | None):
    """Adds this run to the history the model card tells (`hub_elmo`), after that of the --init-from checkpoint."""
    if checkpoint_config is not None:
        config.elmo_origin = getattr(checkpoint_config, "elmo_origin", None)
    start = "from scratch" if options.init_from is None else f"from the weights of {describe_source(options.init_from)}"
    names = ", ".join(f"`{Path(file).name}`" for file in options.train_files[:5])
    more = f" and {len(options.train_files) - 5:,} more" if len(options.train_files) > 5 else ""
    add_origin(
        config,
        f"biLM trained {start} by `hf-elmo train` on {names}{more}; the run's arguments are in `{OPTIONS_FILE}` in "
        "its output folder.",
    )


def _tokenizer_and_config(options: BiLMTrainingOptions) -> tuple[ElmoTokenizer, ElmoConfig]:
    """The tokenizer with its word vocabulary and the run's config, checked against the --init-from checkpoint."""
    checkpoint_config = None
    if options.init_from is not None:
        if not (Path(options.init_from) / "config.json").is_file():
            raise ValueError(
                f"--init-from {options.init_from}: no config.json there; expected a folder saved by save_pretrained."
            )
        checkpoint_config = ElmoConfig.from_pretrained(options.init_from)
    if options.config is not None:
        config = load_config(options.config)
        if checkpoint_config is not None:
            _check_same_architecture(config, checkpoint_config, options.config, options.init_from)
            # How the checkpoint's weights are read is the checkpoint's: converted weights need TensorFlow's
            # forget bias added at run time, which a --config preset does not know about.
            for name in WEIGHT_FORMAT_FIELDS:
                setattr(config, name, getattr(checkpoint_config, name))
    else:
        config = checkpoint_config if checkpoint_config is not None else ElmoConfig.from_preset("small")

    _record_training(options, config, checkpoint_config)
    tokenizer = ElmoTokenizer(max_characters_per_token=config.max_characters_per_token)
    checkpoint_words = None
    if options.init_from is not None and (Path(options.init_from) / WORD_VOCABULARY_FILE).is_file():
        checkpoint_words = read_word_vocabulary(Path(options.init_from) / WORD_VOCABULARY_FILE)
    if options.vocab is not None:
        words = read_word_vocabulary(options.vocab)
        source = f"from {options.vocab}"
    elif checkpoint_words is not None:
        words, source = checkpoint_words, f"from {Path(options.init_from) / WORD_VOCABULARY_FILE}"
    else:
        words = build_word_vocabulary(
            options.train_files, options.split, tokenizer, options.min_count, options.max_vocab_size
        )
        source = "built"
    tokenizer.set_word_vocabulary(words)
    if source == "built":
        source = f"built from the training files with min count {options.min_count}"

    if checkpoint_config is not None and checkpoint_config.vocab_size:
        if checkpoint_config.vocab_size != len(words):
            raise ValueError(
                f"--init-from {options.init_from} has a softmax of {checkpoint_config.vocab_size} words but the "
                f"vocabulary ({source}) has {len(words)}; use the checkpoint's vocab.txt."
            )
        if checkpoint_words is not None and checkpoint_words != words:
            raise ValueError(
                f"The vocabulary ({source}) lists other words than the one of --init-from {options.init_from}, whose "
                "softmax rows belong to its own words; use the checkpoint's vocab.txt."
            )
    if source != "built" and 0 < options.num_softmax_samples < len(words):
        _check_frequency_order(words, options, source)
    config.vocab_size = len(words)
    config.dropout = options.dropout
    config.num_softmax_samples = options.num_softmax_samples
    config.validate_architecture()
    _log(f"Word vocabulary: {len(words):,} words, {source}.")
    return tokenizer, config


ORDER_SAMPLE_LINES = 100_000


def _check_frequency_order(words: list[str], options: BiLMTrainingOptions, source: str):
    """The sampled softmax draws word ids log-uniformly, i.e. as if id order were frequency order: a vocabulary in
    another order (alphabetical, shuffled) trains with badly wrong negatives. Refused when the ids and the word counts
    of the first lines of the training files are not clearly anti-correlated (a sorted vocabulary gives about -1, also
    one sorted on another corpus of the language; alphabetical or shuffled ones about 0)."""
    index = {word: i for i, word in enumerate(words)}
    counts = np.zeros(len(words))
    lines = itertools.islice(iter_sentences(options.train_files, options.split, ElmoTokenizer()), ORDER_SAMPLE_LINES)
    for sentence in lines:
        for word in sentence:
            if word in index:
                counts[index[word]] += 1
    counts = counts[len(WORD_VOCABULARY_SPECIALS) :]
    if counts.size < 3 or counts.min() == counts.max():
        return
    ranks = np.empty(counts.size)
    ranks[np.argsort(counts, kind="stable")] = np.arange(counts.size)
    values, inverse = np.unique(counts, return_inverse=True)
    ranks = (np.bincount(inverse, ranks) / np.bincount(inverse))[inverse]  # ties share their mean rank
    correlation = float(np.corrcoef(np.arange(counts.size), ranks)[0, 1])
    if correlation > -0.2:
        raise ValueError(
            f"The vocabulary ({source}) is not ordered by frequency: the rank correlation of word id and count in the "
            f"first lines of the training files is {correlation:+.2f} (about -1 when sorted). The sampled softmax "
            "draws ids as if they were: sort the words, most frequent first (hf-elmo vocab does), or train with the "
            "full softmax (--num-softmax-samples 0)."
        )


OPTIMIZER_STATES = {"adagrad": 1, "adamw": 2}
"""Values the optimizer keeps per weight: Adagrad its accumulator, AdamW two moments."""


def _memory_available(device: torch.device) -> tuple[int, str]:
    """Bytes a training on `device` may allocate at most, and what holds them."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, torch.cuda.get_device_name(device)
    available, holder = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's memory"
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        with open("/proc/self/status") as status:
            used = int(next(line for line in status if line.startswith("VmSize:")).split()[1]) << 10
        if limit - used < available:
            available, holder = max(limit - used, 0), "this process's address space limit"
    return available, holder


def _check_training_memory(options: BiLMTrainingOptions, config: ElmoConfig, device: torch.device):
    """Logs the memory of the weights, their gradients and the optimizer's state, computed from the configuration and
    the vocabulary before anything is allocated, and refuses a run that cannot hold them."""
    counts = config.parameter_counts()
    copies = 2 + OPTIMIZER_STATES[options.optimizer]  # float32 weights and gradients, the optimizer's state
    needed = sum(counts.values()) * 4 * copies
    softmax = counts["vocab_size x projection_dim"] * 4 * copies
    available, holder = _memory_available(device)
    what = (
        f"the weights, their gradients and the {options.optimizer} state need {needed / 2**30:.3g} GiB before "
        f"activations ({softmax / 2**30:.3g} GiB of it for the softmax of {config.vocab_size:,} words x "
        f"{config.projection_dim + 1})"
    )
    if needed > available:
        raise ValueError(
            f"{what}, more than the {available / 2**30:.3g} GiB of {holder}: use a smaller vocabulary "
            "(--max-vocab-size, --min-count) or model (--config)"
        )
    _log(f"Memory: {what}; {holder}: {available / 2**30:.3g} GiB.")


def _build_model(options: BiLMTrainingOptions, config: ElmoConfig) -> ElmoForBiLM:
    set_seed(options.seed)
    if options.init_from is None:
        return ElmoForBiLM(config)
    model, info = ElmoForBiLM.from_pretrained(options.init_from, config=config, output_loading_info=True)
    softmax_keys = {"softmax.weight", "softmax.bias"}
    missing = set(info["missing_keys"])
    if missing - softmax_keys or info["mismatched_keys"]:
        raise ValueError(
            f"--init-from {options.init_from} does not hold the weights of this model: missing "
            f"{sorted(missing - softmax_keys)}, mismatched {sorted(info['mismatched_keys'])}."
        )
    if missing:
        _log(
            f"--init-from {options.init_from} has no word softmax (e.g. converted released weights): a fresh softmax "
            f"of {config.vocab_size:,} words is initialised; the biLM starts from the checkpoint."
        )
    else:
        _log(f"--init-from {options.init_from}: biLM and softmax continue from the checkpoint.")
    return model


class TimeLimitCallback(TrainerCallback):
    """Ends training after `minutes`; every process stops at the same step (rank 0 decides)."""

    def __init__(self, minutes: float):
        self.seconds = 60.0 * minutes
        self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        stop = torch.tensor([time.monotonic() - self.start > self.seconds], dtype=torch.int32)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            stop = stop.to(args.device)
            torch.distributed.broadcast(stop, src=0)
        if stop.item():
            _log(f"Time limit of {self.seconds / 60:g} minutes reached at step {state.global_step}.")
            control.should_training_stop = True
            control.should_save = True


def _steps_per_epoch(windows: int, options: BiLMTrainingOptions, world_size: int) -> int:
    """Optimizer steps in one pass over `windows`, as `Trainer` takes them: each process reads its share (padded to
    equal shares), in batches, `gradient_accumulation_steps` batches a step."""
    batches = -(-(-(-windows // world_size)) // options.batch_size)
    return max(batches // options.gradient_accumulation_steps, 1)


class EpochTimeCallback(TrainerCallback):
    """Logs, once `logging_steps` steps have run after the first (which also warms up), how long an epoch and the run
    take at the rate of those steps."""

    def __init__(self, steps_per_epoch: int):
        self.steps_per_epoch = steps_per_epoch
        self.start = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.start is None:
            self.start = (time.monotonic(), state.global_step)
            return
        started, first = self.start
        if state.global_step - first != args.logging_steps:
            return
        per_step = (time.monotonic() - started) / args.logging_steps
        remaining = state.max_steps - state.global_step
        _log(
            f"Steps {first + 1}-{state.global_step}: {per_step:.3g} s a step; an epoch of {self.steps_per_epoch:,} "
            f"steps takes about {_duration(per_step * self.steps_per_epoch)}, the remaining {remaining:,} steps of "
            f"the run about {_duration(per_step * remaining)}."
        )


def _duration(seconds: float) -> str:
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min" if minutes else f"{seconds:.0f} s"


def _on_accelerator(args: TrainingArguments) -> bool:
    return args.device.type != "cpu"


class HostCheckedCollator:
    """`collate`, then the model's checks of the batch on the host (in the data loader's processes), with a mark that
    lets `ElmoTrainer` skip them on the device: there each is a wait for the GPU at every step, which then idles
    until the host has issued the next step."""

    MARK = "values_checked_on_host"

    def __init__(self, collate, config: ElmoConfig):
        self.collate, self.config = collate, config

    def __call__(self, examples) -> dict:
        batch = self.collate(examples)
        check_bilm_batch(self.config, batch["input_ids"], batch.get("attention_mask"), batch["labels"])
        return {**batch, self.MARK: True}


class ElmoTrainer(Trainer):
    """`Trainer` that also reports exact (token-weighted) forward, backward and mean perplexity when evaluating, and
    writes each checkpoint into a staging folder renamed when complete (tokenizer included, so that every checkpoint
    is a complete model folder), so that an interrupted save leaves the earlier checkpoints as they were.

    The tokenizer is not `Trainer(processing_class=...)`: that copies its character-level special ids into the config,
    where they would be read as word ids.
    """

    _direction_sums: torch.Tensor | None = None
    _staging: str | None = None
    _split_directions = False  # as the model is called in training (`StreamTrainer`: True)
    # The first step whose training loss was not finite (0: none so far) and that loss, on the loss's device.
    _non_finite_step: torch.Tensor | None = None
    _non_finite_loss: torch.Tensor | None = None

    def __init__(self, *args, word_tokenizer: ElmoTokenizer | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.word_tokenizer = word_tokenizer
        if _on_accelerator(self.args):
            self.data_collator = HostCheckedCollator(self.data_collator, self.accelerator.unwrap_model(self.model).config)

    def _get_output_dir(self, trial) -> str:
        return self._staging or super()._get_output_dir(trial)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        # Noted on the device, without waiting for it: `check_finite` reads it where Trainer waits anyway.
        if self._non_finite_step is None:
            self._non_finite_step = torch.zeros((), dtype=torch.int64, device=loss.device)
            self._non_finite_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        first = torch.isfinite(loss).logical_not_().logical_and_(self._non_finite_step == 0)
        self._non_finite_step = torch.where(first, self.state.global_step + 1, self._non_finite_step)
        self._non_finite_loss = torch.where(first, loss.float(), self._non_finite_loss)
        return loss

    def check_finite(self, weights: bool = False):
        """A `ValueError` naming the first step whose training loss was not finite (on any process) and, with
        `weights`, one for weights that are not finite. Called where the host waits for the device anyway (when
        Trainer logs the loss) and before every save: the loss of each step is checked exactly, with no wait per
        step, and nothing non-finite is saved. Every process calls it at the same points (the losses are gathered)."""
        if self._non_finite_step is not None:
            noted = torch.stack([self._non_finite_step.double(), self._non_finite_loss.double()])[None]
            found = [(int(step), loss) for step, loss in self.accelerator.gather(noted).tolist() if step > 0]
            if found:
                step, loss = min(found)
                raise ValueError(f"training stopped: the loss of step {step} is {loss}; {self._what_was_kept()}")
        if weights:
            model = self.accelerator.unwrap_model(self.model)
            try:
                check_finite_weights(model, f"training stopped at step {self.state.global_step}")
            except ValueError as error:
                raise ValueError(f"{error}; {self._what_was_kept()}") from None

    def _what_was_kept(self) -> str:
        checkpoints = _checkpoints(Path(self.args.output_dir))
        kept = f"the last checkpoint is {checkpoints[-1].name}" if checkpoints else "no checkpoint was written before"
        return f"nothing from that step on was saved ({kept})"

    def log(self, logs: dict, start_time=None):
        if "loss" in logs:  # the training loss, which Trainer has just waited for
            self.check_finite()
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        self.check_finite(weights=True)
        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = run_dir / STAGING_DIR
        if self.args.should_save and staging.exists():
            shutil.rmtree(staging)
        self.accelerator.wait_for_everyone()
        self._staging = str(staging)
        try:
            super()._save_checkpoint(model, trial)  # into staging/name; every process adds its random state
            if self.args.should_save and self.word_tokenizer is not None:
                self.word_tokenizer.save_pretrained(staging / name)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                with deferred_signals():
                    if (run_dir / name).exists():  # an incomplete one, from before a resume that skipped it
                        shutil.rmtree(run_dir / name)
                    (staging / name).rename(run_dir / name)
                limit = self.args.save_total_limit
                for old in _checkpoints(run_dir)[: -limit if limit and limit > 0 else 0]:
                    shutil.rmtree(old)
        finally:
            self._staging = None
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)

    def _clip_grad_norm(self, model):
        """With `hf_elmo.adagrad.Adagrad` and plain or DDP training, the clipping happens inside the optimizer's step
        (`Adagrad.clip_grad_norm_`: same norm, same update, one pass over the gradients less); else `Trainer`'s."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps it
        if (
            isinstance(optimizer, Adagrad)
            and self.accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
            and getattr(self.accelerator, "scaler", None) is None
        ):
            return optimizer.clip_grad_norm_(self.args.max_grad_norm, eps=0.0)  # bilm-tf's clip, at the mean's scale
        return super()._clip_grad_norm(model)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with _one_line_load_errors(resume_from_checkpoint, "model weights"):
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.accelerator.unwrap_model(model if model is not None else self.model)
        check_finite_weights(model, f"--resume: {Path(resume_from_checkpoint) / 'model.safetensors'}")

    def _load_optimizer_and_scheduler(self, checkpoint):
        with _one_line_load_errors(checkpoint, "optimizer or scheduler state"):
            super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self._check_optimizer_state(Path(checkpoint))

    def _check_optimizer_state(self, checkpoint: Path):
        """The optimizer state just loaded from `checkpoint` must be finite and have taken as many steps as the
        checkpoint's trainer state says (not, say, an optimizer.pt copied from an earlier checkpoint)."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps it
        names = {param: name for name, param in self.accelerator.unwrap_model(self.model).named_parameters()}
        where = checkpoint / "optimizer.pt"
        taken = 0
        for param, state in optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                    raise ValueError(
                        f"--resume: {where}: the optimizer state holds NaN or infinite values ('{key}' of "
                        f"'{names.get(param, 'a parameter')}')"
                    )
            if "step" in state:  # each parameter's count of the steps that updated it
                taken = max(taken, int(state["step"]))
        if taken != self.state.global_step:
            raise ValueError(
                f"--resume: {where}: the optimizer state is at step {taken}, but {TRAINER_STATE_NAME} there is at "
                f"step {self.state.global_step}: the file belongs to another checkpoint"
            )

    def _load_rng_state(self, checkpoint):
        with _one_line_load_errors(checkpoint, "random state"):
            super()._load_rng_state(checkpoint)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        checked = inputs.pop(HostCheckedCollator.MARK, False)
        with values_checked_on_host() if checked else contextlib.nullcontext():
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if not model.training and self._direction_sums is not None:
            counts = inputs["labels"].ne(-100).sum(dim=(0, 1)).double()
            sums = torch.stack([outputs.forward_loss.double() * counts[0], outputs.backward_loss.double() * counts[1]])
            self._direction_sums += torch.cat([sums.detach(), counts])
        return (loss, outputs) if return_outputs else loss

    def floating_point_ops(self, inputs) -> int:
        """The biLM's own count (`ElmoForBiLM.floating_point_ops`); `Trainer`'s counts each character slot as a
        position, and walks every parameter to do so at every step."""
        return self.accelerator.unwrap_model(self.model).floating_point_ops(inputs, self._split_directions)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        self._direction_sums = torch.zeros(4, dtype=torch.float64, device=self.args.device)
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
            totals = self.accelerator.reduce(self._direction_sums, reduction="sum").tolist()
        finally:
            self._direction_sums = None
        forward_sum, backward_sum, forward_count, backward_count = totals
        if forward_count and backward_count:
            forward, backward = math.exp(forward_sum / forward_count), math.exp(backward_sum / backward_count)
            output.metrics[f"{metric_key_prefix}_forward_perplexity"] = forward
            output.metrics[f"{metric_key_prefix}_backward_perplexity"] = backward
            output.metrics[f"{metric_key_prefix}_perplexity"] = math.sqrt(forward * backward)
        return output


@contextlib.contextmanager
def _one_line_load_errors(checkpoint, what: str):
    """A checkpoint file that cannot be read (damaged, tampered with: torch refuses unsafe pickles) as one line."""
    try:
        yield
    except (pickle.UnpicklingError, EOFError, RuntimeError, OSError, KeyError, ValueError, SafetensorError) as error:
        message = " ".join(str(error).split())[:300] or type(error).__name__
        raise ValueError(f"--resume: {checkpoint}: cannot read the {what} ({message}).") from None



class StreamTrainer(ElmoTrainer):
    """`ElmoTrainer` for `StreamWindowDataset` batches: each process carries its rows' LSTM state from batch to batch
    (detached, as bilm-tf feeds it), and saves it with every checkpoint so that `--resume` continues the streams."""

    carried: tuple[torch.Tensor, torch.Tensor] | None = None
    _split_directions = True  # each direction's LSTMs run on its own half of the rows

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:  # evaluation runs windows from the model's start state
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {**inputs, "state": self.carried, "use_cache": True, "split_directions": True}
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        self.carried = tuple(t.detach() for t in outputs.state)
        return (loss, outputs) if return_outputs else loss

    def _save_rng_state(self, output_dir: str):
        super()._save_rng_state(output_dir)
        if self.carried is not None:
            from safetensors.torch import save_file

            hidden, memory = (t.contiguous().cpu() for t in self.carried)
            path = Path(output_dir) / STREAM_STATE_FILE.format(rank=self.args.process_index)
            save_file({"hidden": hidden, "memory": memory}, path)

    def load_carried_state(self, checkpoint: str | os.PathLike):
        """Restores this process's carried state from `checkpoint` (a folder `_save_rng_state` wrote into)."""
        from safetensors.torch import load_file

        files = sorted(Path(checkpoint).glob(STREAM_STATE_FILE.format(rank="*")))
        path = Path(checkpoint) / STREAM_STATE_FILE.format(rank=self.args.process_index)
        if len(files) != self.args.world_size or not path.is_file():
            raise ValueError(
                f"--resume: {checkpoint} holds the stream states of {len(files)} processes, this run has "
                f"{self.args.world_size}; resume --stream runs with the same number of processes."
            )
        with _one_line_load_errors(checkpoint, "stream state"):
            state = load_file(path)
        if not all(torch.isfinite(tensor).all() for tensor in state.values()):
            raise ValueError(f"--resume: {path}: the stream state holds NaN or infinite values")
        self.carried = (state["hidden"].to(self.args.device), state["memory"].to(self.args.device))


def _loader_workers(chosen: int | None, on_gpu: bool) -> int:
    # On a GPU a step of the original size at batch 128 takes about 15 ms, and reading and checking its batch in the
    # main process 4-8 ms of host time, in series with the rest of the step's host work.
    return chosen if chosen is not None else (2 if on_gpu else 0)


def _training_arguments(options: BiLMTrainingOptions, has_eval: bool) -> TrainingArguments:
    on_gpu = torch.cuda.is_available()
    # Streams are one pass holding every epoch (StreamWindowDataset), read in order.
    stream = {"train_sampling_strategy": "sequential"} if options.stream else {}
    return TrainingArguments(
        output_dir=options.output_dir,
        per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=options.batch_size,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        learning_rate=options.learning_rate,
        lr_scheduler_type=options.lr_scheduler,
        warmup_steps=options.warmup_steps,
        max_grad_norm=options.max_grad_norm / options.window,
        num_train_epochs=1 if options.stream else options.epochs,
        max_steps=options.max_steps,
        logging_steps=options.logging_steps,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=options.eval_steps,
        save_strategy="steps",
        save_steps=options.save_steps,
        save_total_limit=options.save_total_limit,
        seed=options.seed,
        bf16=options.bf16,
        use_cpu=not on_gpu,
        report_to=options.report_to,
        remove_unused_columns=False,
        label_names=["labels"],
        dataloader_num_workers=_loader_workers(options.dataloader_workers, on_gpu),
        # Batches go to the GPU from pinned memory without waiting, and no per-step check of the loss makes the
        # host wait for the GPU (a non-finite loss is noted on the device and stops training when it is read:
        # `ElmoTrainer.check_finite`).
        dataloader_pin_memory=on_gpu,
        accelerator_config={"non_blocking": on_gpu},
        logging_nan_inf_filter=False,
        ddp_find_unused_parameters=False,
        disable_tqdm=options.disable_progress_bar,
        **stream,
    )


def _eval_windows(options: BiLMTrainingOptions, tokenizer: ElmoTokenizer, cache_dir, words: WordTable | None):
    """The evaluation windows: compact with the training's word table `words`, else as `load_bilm_dataset` makes
    them."""
    if not options.eval_files:
        return None
    if words is None:
        return load_bilm_dataset(
            options.eval_files, tokenizer, options.window, options.split, False, cache_dir, "evaluation"
        )
    return load_compact_bilm_dataset(
        options.eval_files, words, tokenizer, options.window, options.split, cache_dir, "evaluation"
    )


def train_bilm(options: BiLMTrainingOptions | None = None, **kwargs) -> dict:
    """Train an `ElmoForBiLM` and save it (safetensors, tokenizer with its vocabulary, remote code) to `output_dir`.

    Call with a `BiLMTrainingOptions` or with its fields as keyword arguments; with `resume=True` the keyword
    arguments left out are the ones recorded in `output_dir`. All inputs are checked before training starts.
    Training stops with a `ValueError` at the first step whose loss is not finite, and before saving weights that are
    not (the checkpoints before are kept). Returns the final metrics: `train_loss`, `train_runtime` (seconds),
    `steps` and, with evaluation files, `eval_forward_perplexity`, `eval_backward_perplexity`, `eval_perplexity`
    (their geometric mean).
    """
    if options is None:
        options = _resumed_options(kwargs) if kwargs.get("resume") else BiLMTrainingOptions(**kwargs)
    elif options.resume:
        options = _resumed_options(dataclasses.asdict(options))
    if options.keep_freed_memory:
        keep_freed_memory()
    output_dir = _prepare_output_dir(options)
    created = not output_dir.exists()
    check_text_files(options.train_files, "training")
    if options.eval_files:
        check_text_files(options.eval_files, "evaluation")
    tokenizer, config = _tokenizer_and_config(options)

    args = _training_arguments(options, has_eval=bool(options.eval_files))
    _check_training_memory(options, config, args.device)
    resume_from = _last_complete_checkpoint(output_dir, args.world_size, options.stream) if options.resume else None
    try:
        return _train(options, output_dir, tokenizer, config, args, resume_from)
    except BaseException:
        if args.process_index == 0:
            shutil.rmtree(output_dir / STAGING_DIR, ignore_errors=True)
            if not options.resume:
                _remove_run_leftovers(output_dir, created)
        raise


def _train(options, output_dir, tokenizer, config, args, resume_from) -> dict:
    model = _build_model(options, config)  # before the data: --init-from problems are found before any work
    cache_dir, words = options.data_cache_dir, None
    with args.main_process_first(desc="preparing the data"):
        if options.stream:
            train_dataset = StreamWindowDataset(
                list(iter_sentences(options.train_files, options.split, tokenizer)),
                tokenizer,
                rows=options.batch_size * args.world_size,
                window=options.window,
                seed=options.seed,
                epochs=options.epochs,
                steps=options.max_steps * options.gradient_accumulation_steps if options.max_steps > 0 else None,
            )
            eval_dataset = _eval_windows(options, tokenizer, cache_dir, None)
        elif options.streaming:
            train_dataset = load_bilm_dataset(
                options.train_files, tokenizer, options.window, options.split, True, cache_dir, "training"
            )
            eval_dataset = _eval_windows(options, tokenizer, cache_dir, None)
        else:
            # One table for both: the collator makes the training and the evaluation batches.
            words = WordTable.of_files([*options.train_files, *options.eval_files], tokenizer, options.split)
            train_dataset = load_compact_bilm_dataset(
                options.train_files, words, tokenizer, options.window, options.split, cache_dir, "training"
            )
            eval_dataset = _eval_windows(options, tokenizer, cache_dir, words)
    if options.streaming:
        train_dataset = train_dataset.shuffle(seed=options.seed, buffer_size=10_000)

    if args.process_index == 0 and not options.resume:
        # What --resume fills in and checks: a resumed run must be the same run.
        output_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(output_dir / OPTIONS_FILE, json.dumps(dataclasses.asdict(options), indent=2) + "\n")
    softmax = "full softmax"
    if model.uses_sampled_softmax():
        softmax = f"sampled softmax ({config.num_softmax_samples} negatives)"
    layout = f"windows of {options.window} positions, batch {options.batch_size} per process"
    if options.stream:
        layout = (
            f"{options.batch_size} continuous streams per process in pieces of {options.window} positions, "
            f"{train_dataset.steps_per_epoch:,} steps per epoch"
        )
    processes = f"{args.world_size} process" + ("es" if args.world_size > 1 else "")
    _log(
        f"ElmoForBiLM: {sum(p.numel() for p in model.parameters()):,} parameters, {softmax} in training; {layout}; "
        f"{processes} training."
    )
    steps_per_epoch = None
    if options.stream:
        steps_per_epoch = train_dataset.steps_per_epoch
    elif words is not None:
        steps_per_epoch = _steps_per_epoch(len(train_dataset), options, args.world_size)
        _log(
            f"Training data: {len(train_dataset):,} windows, {window_positions(train_dataset):,} positions, "
            f"{steps_per_epoch:,} steps per epoch."
        )

    optimizer = None
    if options.optimizer == "adagrad":
        optimizer = (
            Adagrad,
            {
                "lr": options.learning_rate,
                "initial_accumulator_value": options.adagrad_initial_accumulator / options.window**2,
                # bilm-tf's Adagrad adds no epsilon (its accumulator starts above 0); PyTorch's 1e-10 at the mean's
                # scale would be window x 1e-10 at the original's.
                "eps": 0.0,
            },
        )
    trainer = (StreamTrainer if options.stream else ElmoTrainer)(
        model=model,
        args=args,
        data_collator=DataCollatorForBiLMStreams() if options.stream else DataCollatorForBiLM(words=words),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        optimizer_cls_and_kwargs=optimizer,
        callbacks=[
            *([TimeLimitCallback(options.max_minutes)] if options.max_minutes else []),
            *([EpochTimeCallback(steps_per_epoch)] if steps_per_epoch else []),
        ],
        word_tokenizer=tokenizer,
    )
    if options.stream and resume_from is not None:
        trainer.load_carried_state(resume_from)
    result = trainer.train(resume_from_checkpoint=None if resume_from is None else str(resume_from))
    trainer.check_finite(weights=True)
    if options.stream:
        # Trained on carried states, the model starts best from a warm state, not from zeros.
        sentences = list(itertools.islice(iter_sentences(options.train_files, options.split, tokenizer), 2000))
        model.elmo.set_warm_state(estimate_warm_state(model.elmo, sentences, tokenizer))
        _log(f"Warm start state estimated from the first {len(sentences):,} training sentences.")
    # The final model, like each checkpoint, is written aside and moved into place when complete.
    staging = output_dir / STAGING_DIR
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save may have left
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(staging)
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        with deferred_signals():
            for path in staging.iterdir():
                os.replace(path, output_dir / path.name)
        staging.rmdir()
    metrics = {
        "train_loss": result.training_loss,
        "train_runtime": result.metrics["train_runtime"],
        "steps": result.global_step,
    }
    if eval_dataset is not None:
        last = trainer.state.log_history[-2] if len(trainer.state.log_history) > 1 else {}
        just_evaluated = "eval_perplexity" in last and last.get("step") == trainer.state.global_step
        metrics.update(last if just_evaluated else trainer.evaluate())
        _log(
            f"Held-out perplexity: forward {metrics['eval_forward_perplexity']:.2f}, backward "
            f"{metrics['eval_backward_perplexity']:.2f}, geometric mean {metrics['eval_perplexity']:.2f}."
        )
    _log(f"Saved the trained biLM to {output_dir}.")
    return metrics


COMMAND_OPTIONS = BiLMTrainingOptions
"""`hf-elmo train` takes the fields of this dataclass as its options (`cli` builds them with `HfArgumentParser`)."""


def run(args: argparse.Namespace) -> int:
    names = {f.name for f in dataclasses.fields(BiLMTrainingOptions)}
    given = getattr(args, "given", names)  # the options on the command line: with --resume the others are recorded
    train_bilm(**{k: v for k, v in vars(args).items() if k in names and k in given})
    return 0


__all__ = ["BiLMTrainingOptions", "ElmoTrainer", "load_config", "train_bilm"]
