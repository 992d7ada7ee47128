"""`hf-elmo train`: pre-train the biLM on a corpus, or adapt released weights to a domain, with `Trainer`.

As transformers' `run_mlm.py`: ELMo's own options (`ElmoModelArguments`, `ElmoDataArguments`) are parsed with
`HfArgumentParser` next to `TrainingArguments`, so every `Trainer` option works (`--gradient_checkpointing`,
`--report_to`, `--lr_scheduler_type`, ...). `ElmoTrainingArguments` gives them the original recipe's defaults
(bilm-tf `bin/train_elmo.py`): Adagrad with learning rate 0.2 and initial accumulator 1.0, gradients clipped to a
global norm of 10, dropout 0.1, windows of 20 positions, batches of 128 windows per device, sampled softmax with 8192
negatives, 10 epochs, constant learning rate.

bilm-tf differentiates `window x loss` (its loss is a mean over the window's tokens, its gradient is taken of the loss
times `unroll_steps`). Here the loss stays the mean (what is logged and compared); the factor is folded into the
optimizer instead, which gives the same updates: with gradient `g = c * g'`, Adagrad's `lr * g / sqrt(a0 + sum g^2)`
equals `lr * g' / sqrt(a0 / c^2 + sum g'^2)`, and clipping `g` to norm `n` is clipping `g'` to `n / c`. So
`--all_clip_norm_val` (bilm-tf's name) and `--adagrad_initial_accumulator` are given on the original scale and divided
by `window` and `window ** 2` in the optimizer, which also does the clipping (`clip_in_optimizer`); `Trainer`'s own
`--max_grad_norm` (off by default) would clip the mean loss's gradient before it.

Runs unchanged under `torchrun` and `accelerate launch --multi_gpu` (DDP): the batch size is per process, and the
loss is normalised by the targets of all processes, so N processes with batch b train like one with batch N * b
(with windows; with `--stream` each process reads its own part of the corpus).

The examples are windows of whole sentences, each from the start state (`training.windows`); `--stream` trains the way
bilm-tf did instead, every batch row reading one continuous stream with its LSTM state carried from batch to batch
(`StreamTrainer`, `streams_bilm`; docs/training.md).
"""

import argparse
import dataclasses
import itertools
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SchedulerType
from transformers.training_args import OptimizerNames

from ..configuration_elmo import ELMO_PRESETS
from ..io.files import write_atomically
from ..tokenization_elmo import ElmoTokenizer
from ..training.adagrad import Adagrad
from ..training.collator import DataCollatorForBiLM
from ..training.corpus import SPLIT_HELP, SPLITS, check_text_files, iter_sentences, residue_text_files
from ..training.freed_memory import keep_freed_memory
from ..training.run_setup import build_bilm, tokenizer_and_config
from ..training.streams import DataCollatorForBiLMStreams, StreamWindowDataset
from ..training.trainer import (
    LOAD_ERRORS,
    STAGING_DIR,
    CheckpointStaging,
    ElmoTrainer,
    StepTimeCallback,
    StreamTrainer,
    TimeLimitCallback,
    check_loss_options,
    check_training_memory,
    last_complete_checkpoint,
    log_once,
    one_line_load_errors,
    optimizer_steps_per_epoch,
    steps_trained,
)
from ..training.warm_state import estimate_warm_state
from ..training.windows import load_bilm_dataset
from ..training.word_table import WordTable, load_compact_bilm_dataset, window_positions
from .command_line import option
from .launch import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    RENDEZVOUS_HELP,
    Launch,
    Rendezvous,
    check_timeout,
    init_process_group,
    lost_process_error,
    stop_reason,
)
from .run_folder import OPTIONS_FILE, prepare_output_dir, remove_run_leftovers, resumed_options
from .threads import HELP as THREADS_HELP
from .threads import use_threads


def _check_finite(options):
    for field_ in dataclasses.fields(options):
        value = getattr(options, field_.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{field_.name} must be a finite number, got {value}.")


@dataclass
class ElmoModelArguments:
    """The biLM to train: its configuration, the weights it starts from, and what only training uses."""

    config: str | None = option(
        None,
        help=f"{'|'.join(ELMO_PRESETS)}|PATH (config.json, model folder or bilm-tf options.json); default: the "
        "--init_from model's, else small",
    )
    init_from: str | None = option(
        None, help="folder of an ElmoModel (e.g. converted released weights) or ElmoForBiLM to continue from"
    )
    dropout: float = option(0.1)
    num_softmax_samples: int = option(8192, help="negatives of the sampled softmax; 0: full softmax")

    def __post_init__(self):
        _check_finite(self)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}.")
        if self.num_softmax_samples < 0:
            raise ValueError(f"num_softmax_samples must be >= 0, got {self.num_softmax_samples}.")


@dataclass
class ElmoDataArguments:
    """The corpus, its vocabulary, and how it is cut into examples."""

    train_files: list[str] = option(
        [],
        help="text files, one sentence per line, or folders of them, or patterns such as 'shards/*.txt' (needed, "
        "except with --resume: then the run's own by default)",
    )
    eval_files: list[str] = option([], help="held-out text files (or folders, or patterns) for periodic perplexity")
    vocab: str | None = option(
        None,
        help="vocabulary file (one word per line, <S>, </S>, <UNK> first); default: the --init_from model's, else "
        "built from the training files with --min_count and --max_vocab_size",
    )
    min_count: int = option(1, help="when building the vocabulary: keep words seen at least this often")
    max_vocab_size: int | None = option(None, help="when building the vocabulary: at most this many entries")
    split: str = option("pretokenizer", help=SPLIT_HELP, choices=SPLITS)
    fasta: bool = option(
        False,
        help="the training and held-out files are FASTA: each protein a sentence, each residue a word, read as SeqVec "
        "reads them (a residue text made once under --data_cache_dir; --split is whitespace)",
    )
    window: int = option(20, help="positions per example, <S> and </S> included; with --stream, positions per piece")
    stream: bool = option(
        False,
        help="train the way the original did: every batch row reads one continuous stream of sentences in pieces of "
        "--window positions, its LSTM state carried from batch to batch (the saved model gets a warm start state "
        "estimated from the training text); default: windows of whole sentences, each from the start state",
    )
    streaming: bool = option(False, help="read the windows lazily (needs --max_steps); --stream always reads lazily")
    data_cache_dir: str | None = option(
        None, help="where the datasets library keeps the packed windows (default: its cache, HF_DATASETS_CACHE)"
    )

    def __post_init__(self):
        self.train_files = [os.fspath(f) for f in _as_list(self.train_files)]
        self.eval_files = [os.fspath(f) for f in _as_list(self.eval_files)]
        if not self.train_files:
            raise ValueError("train_files (--train_files) must name at least one text file, got none.")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}.")
        if self.fasta:
            self.split = "whitespace"  # the residue text's words
        if self.stream and self.streaming:
            raise ValueError(
                "--streaming reads windows lazily; --stream reads its shards lazily anyway: give one of the two."
            )
        if self.min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {self.min_count}.")
        if self.window < 3:
            raise ValueError(f"window must be >= 3 positions (<S>, one word, </S>), got {self.window}.")


def _as_list(files) -> list:
    return [files] if isinstance(files, (str, os.PathLike)) else files


@dataclass
class ElmoTrainingArguments(TrainingArguments):
    """`TrainingArguments` with the original recipe's defaults (see the module docstring), and the options of ELMo's
    training that `Trainer` has not."""

    per_device_train_batch_size: int = option(128, help="windows per process and step")
    per_device_eval_batch_size: int = option(128, help="windows per process in evaluation")
    learning_rate: float = option(0.2)
    optim: OptimizerNames | str = option(
        "adagrad", help="adagrad: bilm-tf's (hf_elmo.training.adagrad, no epsilon); else any of Trainer's optimizers"
    )
    lr_scheduler_type: SchedulerType | str = option("constant", help="a transformers scheduler name")
    num_train_epochs: float = option(10.0)
    max_grad_norm: float = option(0.0, help="Trainer's clip of the mean loss's gradient; see --all_clip_norm_val")
    logging_steps: float = option(100)
    eval_strategy: IntervalStrategy | str = option("steps", help="every --eval_steps when there are --eval_files")
    eval_steps: float = option(1250)
    save_steps: float = option(1250)
    save_total_limit: int | None = option(2)
    report_to: None | str | list[str] = option("none", help="none, tensorboard, wandb, ...")
    disable_tqdm: bool = option(False, help="no progress bars")
    logging_nan_inf_filter: bool = option(False, help="a non-finite loss stops training at its step anyway")
    dataloader_num_workers: int | None = option(
        None,
        help="data loader processes; default: 2 when training on a GPU (batches are read and checked while the GPU "
        "computes), 0 on the CPU (whose cores do the training)",
    )
    # Batches go to the GPU from pinned memory without waiting, and no per-step check of the loss makes the host wait
    # for the GPU (a non-finite loss is noted on the device and stops training when it is read: `check_finite`).
    dataloader_pin_memory: bool | None = option(None, help="default: when training on a GPU")
    ddp_find_unused_parameters: bool | None = option(False)
    remove_unused_columns: bool = option(False)
    # `TrainingArguments` declares it `str | bool`, which its parser reads as a bool only.
    include_num_input_tokens_seen: str = option(
        "no",
        choices=["no", "non_padding", "all"],
        help="count the positions trained on (num_input_tokens_seen): non_padding, the windows' positions; all, "
        "Trainer's count of input_ids, each position's character slots, padding included",
    )
    label_names: list[str] | None = option(["labels"])
    # ELMo's own
    resume: bool = option(
        False,
        help="continue from the last checkpoint in --output_dir, with the options recorded there; options given again "
        "must agree with them, except where they may change (where things go, how often they are reported, how long "
        "to go on)",
    )
    all_clip_norm_val: float = option(
        10.0, help="bilm-tf's clip: the global norm of the gradient of window x loss, clipped in the optimizer; 0: none"
    )
    adagrad_initial_accumulator: float = option(1.0, help="bilm-tf's, at the scale of window x loss")
    max_minutes: float | None = option(None, help="stop (and save) after this many minutes of training")
    rendezvous_timeout: float = option(DEFAULT_RENDEZVOUS_TIMEOUT, help=RENDEZVOUS_HELP)
    threads: int | None = option(None, help=THREADS_HELP)
    keep_freed_memory: bool = option(
        True,
        help="keep the memory each step frees in the process for the next step (glibc: training.freed_memory): "
        "faster CPU training, the process holding its busiest step's memory between steps",
    )

    def __post_init__(self):
        if self.output_dir is None:
            raise ValueError("output_dir (--output_dir) is needed: the folder of the run.")
        self.output_dir = os.fspath(self.output_dir)
        if self.resume_from_checkpoint is not None:
            raise ValueError("--resume_from_checkpoint: give --resume, which continues from the run's last checkpoint.")
        _check_finite(self)
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}.")
        if self.all_clip_norm_val < 0:
            raise ValueError(f"all_clip_norm_val must be >= 0, got {self.all_clip_norm_val}.")
        check_loss_options(self)
        if self.adagrad_initial_accumulator <= 0:  # as TensorFlow's Adagrad: the step divides by its square root
            raise ValueError(f"adagrad_initial_accumulator must be > 0, got {self.adagrad_initial_accumulator}.")
        if self.max_steps == 0:  # Trainer would take 0 as a number of steps, and train one
            raise ValueError(
                "max_steps must be > 0 (the steps to train) or -1 (the default: num_train_epochs decides), got 0."
            )
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ValueError(
                f"num_train_epochs must be > 0 (or max_steps given), got {self.num_train_epochs}: nothing would be "
                "trained."
            )
        check_timeout(self.rendezvous_timeout)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {self.threads}.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}.")
        if self.dataloader_num_workers is not None and self.dataloader_num_workers < 0:
            raise ValueError(f"dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}.")
        on_gpu = torch.cuda.is_available()
        # On a GPU a step of the original size at batch 128 is short enough that reading and checking its batch in the
        # main process, in series with the rest of the step's host work, would leave the GPU waiting.
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = 2 if on_gpu else 0
        if self.dataloader_pin_memory is None:
            self.dataloader_pin_memory = on_gpu
        if self.accelerator_config is None:
            self.accelerator_config = {"non_blocking": on_gpu}
        self.use_cpu = self.use_cpu or not on_gpu
        super().__post_init__()


COMMAND_OPTIONS = (ElmoModelArguments, ElmoDataArguments, ElmoTrainingArguments)
"""`hf-elmo train` takes the fields of these dataclasses as its options (`cli` builds them with `HfArgumentParser`)."""
OWN_TRAINING_FIELDS = {f.name for f in dataclasses.fields(ElmoTrainingArguments)} - {
    f.name for f in dataclasses.fields(TrainingArguments)
}


def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for options in COMMAND_OPTIONS for f in dataclasses.fields(options) if f.init}


def parse_options(options: dict) -> tuple[ElmoModelArguments, ElmoDataArguments, ElmoTrainingArguments]:
    """The three dataclasses of `hf-elmo train` from their fields as one dictionary."""
    unknown = set(options) - set(_fields())
    if unknown:
        raise TypeError(f"Unknown training options: {', '.join(sorted(unknown))}.")
    names = [{f.name for f in dataclasses.fields(kind) if f.init} for kind in COMMAND_OPTIONS]
    model, data, training = (
        kind(**{k: v for k, v in options.items() if k in n}) for kind, n in zip(COMMAND_OPTIONS, names)
    )
    if data.streaming and training.max_steps <= 0:
        raise ValueError("Streaming data has no known length: give max_steps (--max_steps) as well.")
    return model, data, training


def _join(launch: Launch, options: dict) -> Rendezvous | None:
    """The processes of a launch joined before `TrainingArguments` sets them up (accelerate then takes the process
    group as it is): the joining bounded by `--rendezvous_timeout` and stopped by a signal, the collectives by
    `--ddp_timeout`. Returns the `Rendezvous` of the launch; None for one process."""
    if launch.world_size == 1:
        return None
    fields = _fields()
    timeouts = [options.get(name, fields[name].default) for name in ("rendezvous_timeout", "ddp_timeout")]
    for name, seconds in zip(("rendezvous_timeout", "ddp_timeout"), timeouts):
        check_timeout(seconds, name)
    on_gpu = torch.cuda.is_available() and not options.get("use_cpu")
    backend = options.get("ddp_backend") or ("nccl" if on_gpu else "gloo")
    return init_process_group(launch, backend, *timeouts)


def _eval_windows(data: ElmoDataArguments, tokenizer: ElmoTokenizer, words: WordTable | None):
    """The evaluation windows: compact with the training's word table `words`, else as `load_bilm_dataset` makes
    them."""
    if not data.eval_files:
        return None
    if words is None:
        return load_bilm_dataset(
            data.eval_files, tokenizer, data.window, data.split, False, data.data_cache_dir, "evaluation"
        )
    return load_compact_bilm_dataset(
        data.eval_files, words, tokenizer, data.window, data.split, data.data_cache_dir, "evaluation"
    )


def train_bilm(**options) -> dict:
    """Train an `ElmoForBiLM` and save it (safetensors, tokenizer with its vocabulary, remote code) to `output_dir`.

    Takes the fields of `ElmoModelArguments`, `ElmoDataArguments` and `ElmoTrainingArguments` as keyword arguments;
    with `resume=True` the ones left out are those recorded in `output_dir`. All inputs are checked before training
    starts. Training stops with a `ValueError` at the first step whose loss is not finite, and before saving weights
    that are not (the checkpoints before are kept). Returns the final metrics: `train_loss`, `train_runtime`
    (seconds), `steps` and, with evaluation files, `eval_forward_perplexity`, `eval_backward_perplexity`,
    `eval_perplexity` (their geometric mean).
    """
    launch = Launch.from_environment()  # before any work: a wrong variable is one line, not a lost run
    if options.get("resume"):
        options = resumed_options(options, _fields())
    rendezvous = _join(launch, options)
    try:
        return _check_and_train(options, rendezvous)
    except BaseException as error:
        if rendezvous is not None:
            rendezvous.stop(stop_reason(error))  # the others stop with one line naming this process, not later
        raise


def _check_and_train(options: dict, rendezvous: Rendezvous | None) -> dict:
    model_args, data, args = parse_options(options)
    use_threads(args.threads)  # after TrainingArguments, whose setup under a launcher sets a count of its own
    if args.keep_freed_memory:
        keep_freed_memory()
    output_dir = prepare_output_dir(model_args, data, args)
    created = not output_dir.exists()
    recorded_files = {"train_files": data.train_files, "eval_files": data.eval_files}
    if data.fasta:
        import datasets

        cache_dir = data.data_cache_dir or datasets.config.HF_DATASETS_CACHE
        data.train_files = residue_text_files(data.train_files, cache_dir)
        data.eval_files = residue_text_files(data.eval_files, cache_dir)
    check_text_files(data.train_files, "training")
    if data.eval_files:
        check_text_files(data.eval_files, "evaluation")
    tokenizer, config = tokenizer_and_config(model_args, data)
    check_training_memory(args, config)
    resume_from = last_complete_checkpoint(output_dir, args.world_size, data.stream) if args.resume else None
    if resume_from is not None and args.max_steps > 0:
        done = steps_trained(resume_from)
        if args.max_steps <= done:
            raise ValueError(
                f"--max-steps {args.max_steps}: the run in {output_dir} has trained {done} steps already (its "
                f"{resume_from.name}); give more steps to go on."
            )
    # What --resume fills in and checks: a resumed run must be the same run.
    record = {**dataclasses.asdict(model_args), **dataclasses.asdict(data), **recorded_files}
    record.update({k: v for k, v in options.items() if k not in record})
    record.update({k: getattr(args, k) for k in OWN_TRAINING_FIELDS})
    try:
        return _train(model_args, data, args, output_dir, tokenizer, config, resume_from, record, rendezvous)
    except BaseException:
        if args.process_index == 0:
            shutil.rmtree(output_dir / STAGING_DIR, ignore_errors=True)
            if not args.resume:
                remove_run_leftovers(output_dir, created)
        raise


def _train(model_args, data, args, output_dir, tokenizer, config, resume_from, record, rendezvous) -> dict:
    model = build_bilm(model_args, config, args.seed)  # before the data: --init-from problems are found first
    words = None
    preparing = "preparing the training data"
    if rendezvous is None:  # one process, or a process group set up by the caller
        first = args.main_process_first(desc=preparing)
    else:  # the others wait in polls that a signal stops
        first = rendezvous.machine_first("prepared", preparing)
    with first:
        if data.stream:
            train_dataset = StreamWindowDataset(
                data.train_files,
                tokenizer,
                rows=args.per_device_train_batch_size,
                window=data.window,
                seed=args.seed,
                split=data.split,
                epochs=args.num_train_epochs,
                steps=args.max_steps * args.gradient_accumulation_steps if args.max_steps > 0 else None,
                rank=args.process_index,
                processes=args.world_size,
            )
            eval_dataset = _eval_windows(data, tokenizer, None)
            # Streams are one pass holding every epoch, read in order.
            args.num_train_epochs, args.train_sampling_strategy = 1, "sequential"
        elif data.streaming:
            train_dataset = load_bilm_dataset(
                data.train_files, tokenizer, data.window, data.split, True, data.data_cache_dir, "training"
            ).shuffle(seed=args.seed, buffer_size=10_000)
            eval_dataset = _eval_windows(data, tokenizer, None)
        else:
            # One table for both: the collator makes the training and the evaluation batches.
            words = WordTable.of_files([*data.train_files, *data.eval_files], tokenizer, data.split)
            train_dataset = load_compact_bilm_dataset(
                data.train_files, words, tokenizer, data.window, data.split, data.data_cache_dir, "training"
            )
            eval_dataset = _eval_windows(data, tokenizer, words)
    if eval_dataset is None:
        args.eval_strategy = IntervalStrategy.NO

    if args.process_index == 0 and not args.resume:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(output_dir / OPTIONS_FILE, json.dumps(record, indent=2, default=os.fspath) + "\n")
    softmax = "full softmax"
    if model.uses_sampled_softmax():
        softmax = f"sampled softmax ({config.num_softmax_samples} negatives)"
    batch = args.per_device_train_batch_size
    layout = f"windows of {data.window} positions, batch {batch} per process"
    steps_per_epoch = None
    if data.stream:
        if train_dataset.steps_per_epoch:  # the dataset's steps are batches, Trainer's take an accumulation of them
            steps_per_epoch = -(-train_dataset.steps_per_epoch // args.gradient_accumulation_steps)  # as Trainer
        per_epoch = f", {steps_per_epoch:,} steps per epoch" if steps_per_epoch else ""
        layout = f"{batch} continuous streams per process in pieces of {data.window} positions{per_epoch}"
    processes = f"{args.world_size} process" + ("es" if args.world_size > 1 else "")
    log_once(
        f"ElmoForBiLM: {sum(p.numel() for p in model.parameters()):,} parameters, {softmax} in training; {layout}; "
        f"{processes} training."
    )
    if words is not None:
        steps_per_epoch = optimizer_steps_per_epoch(len(train_dataset), args)
        log_once(
            f"Training data: {len(train_dataset):,} windows, {window_positions(train_dataset):,} positions, "
            f"{steps_per_epoch:,} steps per epoch."
        )

    optimizer = None
    if args.optim == OptimizerNames.ADAGRAD:
        # bilm-tf's Adagrad adds no epsilon (its accumulator starts above 0); PyTorch's 1e-10 at the mean's scale
        # would be window x 1e-10 at the original's.
        accumulator = args.adagrad_initial_accumulator / data.window**2
        optimizer = (Adagrad, {"lr": args.learning_rate, "initial_accumulator_value": accumulator, "eps": 0.0})
    trainer = (StreamTrainer if data.stream else ElmoTrainer)(
        model=model,
        args=args,
        data_collator=DataCollatorForBiLMStreams(positions=True) if data.stream else DataCollatorForBiLM(words=words),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        optimizer_cls_and_kwargs=optimizer,
        callbacks=[
            *([TimeLimitCallback(args.max_minutes)] if args.max_minutes else []),
            StepTimeCallback(steps_per_epoch),
        ],
        word_tokenizer=tokenizer,
        clip_norm=args.all_clip_norm_val / data.window,
    )
    staging = CheckpointStaging(trainer, resume_from)
    trainer.add_callback(staging)  # after the callbacks that decide to save
    if data.stream and resume_from is not None:
        trainer.load_carried_state(resume_from)
    try:
        result = trainer.train(resume_from_checkpoint=None if resume_from is None else str(resume_from))
    except LOAD_ERRORS + (ValueError,) as error:
        if resume_from is None or trainer.started:
            raise
        what = "random state" if staging.loaded else "model weights, optimizer or scheduler state"
        with one_line_load_errors(resume_from, what, LOAD_ERRORS if staging.loaded else LOAD_ERRORS + (ValueError,)):
            raise error
    trainer.check_finite(weights=True)
    if data.stream:
        # Trained on carried states, the model starts best from a warm state, not from zeros.
        sentences = list(itertools.islice(iter_sentences(data.train_files, data.split, tokenizer), 2000))
        model.elmo.set_warm_state(estimate_warm_state(model.elmo, sentences, tokenizer))
        log_once(f"Warm start state estimated from the first {len(sentences):,} training sentences.")
    metrics = {"train_loss": result.training_loss, "train_runtime": result.metrics["train_runtime"]}
    metrics["steps"] = result.global_step
    if eval_dataset is not None:
        last = trainer.state.log_history[-2] if len(trainer.state.log_history) > 1 else {}
        just_evaluated = "eval_perplexity" in last and last.get("step") == trainer.state.global_step
        metrics.update(last if just_evaluated else trainer.evaluate())
        held_out = (
            f"forward {metrics['eval_forward_perplexity']:.2f}, backward {metrics['eval_backward_perplexity']:.2f}, "
            f"geometric mean {metrics['eval_perplexity']:.2f}"
        )
        log_once(f"Held-out perplexity: {held_out}.")
        files = ", ".join(f"`{Path(file).name}`" for file in data.eval_files)
        # The model card tells it (`hub_elmo`).
        model.config.elmo_evaluation = [
            f"Held-out perplexity of the biLM at the end of its `hf-elmo train` run (step {result.global_step:,}, "
            f"{files} in windows of {data.window} positions): {held_out}."
        ]
    trainer.save_final_model()
    log_once(f"Saved the trained biLM to {output_dir}.")
    return metrics


def run(args: argparse.Namespace) -> int:
    names = set(_fields())
    given = getattr(args, "given", names)  # the options on the command line: with --resume the others are recorded
    try:
        train_bilm(**{k: v for k, v in vars(args).items() if k in names and k in given})
    except RuntimeError as error:
        raise lost_process_error(error) or error from None
    return 0


__all__ = [
    "ElmoDataArguments",
    "ElmoModelArguments",
    "ElmoTrainer",
    "ElmoTrainingArguments",
    "train_bilm",
]
