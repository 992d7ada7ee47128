"""`ElmoTrainer` and `StreamTrainer`: the transformers `Trainer` for an `ElmoForBiLM`, with what `hf-elmo train` adds to
it as public overrides and callbacks (no private `Trainer` method is overridden): bilm-tf's clipping in the optimizer
(`clip_in_optimizer`), a stop at the first non-finite loss, exact forward, backward and mean perplexity in evaluation,
checkpoints written aside and moved into place when complete (`CheckpointStaging`), carried LSTM states for `--stream`
runs, and the checks a run makes before it starts (`last_complete_checkpoint`, `check_training_memory`).
"""

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
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import DistributedType
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.training_args import OptimizerNames

from ..configuration_elmo import ElmoConfig
from ..input_checks import check_bilm_batch
from ..io.files import ElmoInputError, deferred_signals, write_atomically
from ..pretrained_elmo import check_finite_weights, safetensors_shapes
from ..tokenization_elmo import ElmoTokenizer
from ..word_vocabulary import WORD_VOCABULARY_FILE, WORD_VOCABULARY_SPECIALS
from .adagrad import Adagrad
from .collator import DataCollatorForBiLM
from .corpus import TRAINING_OPTIONS_FILE, iter_sentences
from .streams import STREAM_CORPUS_FILE, STREAM_POSITION
from .word_table import STORED_WINDOWS, WordTable

STAGING_DIR = ".staging"
"""Folder in the output folder where a checkpoint or the final model is written, then moved into place."""
STREAM_STATE_FILE = "stream_state-{rank}.safetensors"
"""The carried LSTM state of process `rank`'s rows, in every checkpoint of a `--stream` run."""
# Files every checkpoint holds (besides the random state of each process), all read by --resume.
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    TRAINER_STATE_NAME,
    WORD_VOCABULARY_FILE,
)


def log_once(message: str):
    """Prints `message` on the first process only: one line per run, not per process."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, flush=True)


def _checkpoint_problems(checkpoint: Path, world_size: int, stream: bool = False) -> list[str]:
    """What a resume from `checkpoint` would lack: missing files, or a trainer state that cannot be read."""
    rng_files = [f"rng_state_{rank}.pth" for rank in range(world_size)] if world_size > 1 else ["rng_state.pth"]
    rng_files += [STREAM_STATE_FILE.format(rank=rank) for rank in range(world_size)] if stream else []
    problems = [f"no {name}" for name in (*CHECKPOINT_FILES, *rng_files) if not (checkpoint / name).is_file()]
    if not problems:
        try:
            steps_trained(checkpoint)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
            problems.append(f"unreadable {TRAINER_STATE_NAME} ({error})")
    return problems


def steps_trained(checkpoint: Path) -> int:
    """The optimizer steps the run had taken when it wrote `checkpoint`."""
    return int(json.loads((checkpoint / TRAINER_STATE_NAME).read_text(encoding="utf-8"))["global_step"])


def checkpoints(output_dir: Path) -> list[Path]:
    """The `checkpoint-N` folders of a run, by step."""
    found = [p for p in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def last_complete_checkpoint(output_dir: Path, world_size: int, stream: bool = False) -> Path:
    """The checkpoint --resume continues from, named in the log: the last one holding everything a resume reads; later
    incomplete ones (written by an older version, or files removed since) are named there too and left alone. A
    damaged one (a safetensors file that cannot be read, e.g. truncated) is an error naming the file and the intact
    one before it: whether to go back to that is the user's choice."""
    skipped, damaged = [], None
    for checkpoint in reversed(checkpoints(output_dir)):
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
        log_once(
            f"--resume: continuing from {checkpoint.name}"
            + ("; skipped incomplete " + "; ".join(skipped) if skipped else "")
            + "."
        )
        return checkpoint
    if damaged:
        raise ValueError(f"--resume: {damaged[1]}; no earlier checkpoint is intact.")
    raise ValueError(
        f"--resume: {output_dir} holds no complete checkpoint of an earlier run to continue from"
        + (f" (incomplete: {'; '.join(skipped)})" if skipped else "")
        + "."
    )


ORDER_SAMPLE_LINES = 100_000


def check_frequency_order(words: list[str], train_files: list[str], split: str, source: str):
    """The sampled softmax draws word ids log-uniformly, i.e. as if id order were frequency order: a vocabulary in
    another order (alphabetical, shuffled) trains with badly wrong negatives. Refused when the ids and the word counts
    of the first lines of the training files are not clearly anti-correlated (a sorted vocabulary gives about -1, also
    one sorted on another corpus of the language; alphabetical or shuffled ones about 0)."""
    index = {word: i for i, word in enumerate(words)}
    counts = np.zeros(len(words))
    lines = itertools.islice(iter_sentences(train_files, split, ElmoTokenizer()), ORDER_SAMPLE_LINES)
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


def check_training_memory(training: TrainingArguments, config: ElmoConfig):
    """Logs the memory of the weights, their gradients and the optimizer's state, computed from the configuration and
    the vocabulary before anything is allocated, and refuses a run that cannot hold them."""
    counts = config.parameter_counts()
    optimizer = OptimizerNames(training.optim).value
    # float32 weights and gradients, and the optimizer's state: Adagrad keeps an accumulator, Adam-like ones two moments
    copies = 2 + (1 if optimizer == OptimizerNames.ADAGRAD else 2)
    needed = sum(counts.values()) * 4 * copies
    softmax = counts["vocab_size x projection_dim"] * 4 * copies
    available, holder = _memory_available(training.device)
    what = (
        f"the weights, their gradients and the {optimizer} state need {needed / 2**30:.3g} GiB before "
        f"activations ({softmax / 2**30:.3g} GiB of it for the softmax of {config.vocab_size:,} words x "
        f"{config.projection_dim + 1})"
    )
    if needed > available:
        raise ValueError(
            f"{what}, more than the {available / 2**30:.3g} GiB of {holder}: use a smaller vocabulary "
            "(--max_vocab_size, --min_count) or model (--config)"
        )
    log_once(f"Memory: {what}; {holder}: {available / 2**30:.3g} GiB.")


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
            log_once(f"Time limit of {self.seconds / 60:g} minutes reached at step {state.global_step}.")
            control.should_training_stop = True
            control.should_save = True


def optimizer_steps_per_epoch(windows: int, args: TrainingArguments) -> int:
    """Optimizer steps in one pass over `windows`, as `Trainer` takes them: each process reads its share (padded to
    equal shares), in batches, `gradient_accumulation_steps` batches a step."""
    per_process = -(-windows // args.world_size)  # rounded up, in integers
    batches = -(-per_process // args.per_device_train_batch_size)
    return max(batches // args.gradient_accumulation_steps, 1)


class StepTimeCallback(TrainerCallback):
    """Logs, once `logging_steps` steps have run after the first (which also warms up), the time a step takes and how
    long the rest of the run and, where its size is known (`steps_per_epoch`), an epoch take at that rate."""

    def __init__(self, steps_per_epoch: int | None):
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
        epoch = ""
        if self.steps_per_epoch:
            epoch = (
                f" an epoch of {self.steps_per_epoch:,} steps takes about {_duration(per_step * self.steps_per_epoch)},"
            )
        log_once(
            f"Steps {first + 1}-{state.global_step}: {per_step:.3g} s a step;{epoch} the remaining {remaining:,} steps "
            f"of the run about {_duration(per_step * remaining)}."
        )


def _duration(seconds: float) -> str:
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min" if minutes else f"{seconds:.0f} s"


def _on_accelerator(args: TrainingArguments) -> bool:
    return args.device.type != "cpu"


class HostCheckedCollator:
    """`collate`, then the model's checks of the batch on the host (in the data loader's processes), with the model's
    input `values_checked_on_host=True`, which skips them on the device: there each is a wait for the GPU at every
    step, which then idles until the host has issued the next step."""

    MARK = "values_checked_on_host"

    def __init__(self, collate, config: ElmoConfig):
        self.collate, self.config = collate, config

    def __call__(self, examples) -> dict:
        batch = self.collate(examples)
        check_bilm_batch(self.config, batch["input_ids"], batch.get("attention_mask"), batch["labels"])
        return {**batch, self.MARK: True}


def check_word_table(config: ElmoConfig, table: WordTable, words_at_once: int = 65_536):
    """The model's checks of a batch (`check_bilm_batch`) on every word of `table`, as positions of batches that
    `WordTable.expand` makes: its character rows and its targets in both directions."""
    top = int(table.targets.max())
    if top >= config.vocab_size:
        raise ValueError(
            f"The word table's targets are word ids up to {top:,}, the model's softmax has {config.vocab_size:,} "
            "(vocab_size): make the table with the model's tokenizer, or the model with "
            "vocab_size=len(tokenizer.word_vocabulary)."
        )
    rows, targets = table.tensors()
    for start in range(0, len(rows), words_at_once):
        ids, labels = rows[start : start + words_at_once].long(), targets[start : start + words_at_once]
        check_bilm_batch(config, ids[None], None, torch.stack([labels, labels], -1)[None])


def check_loss_options(args: TrainingArguments, compute_loss_func=None):
    """`ElmoForBiLM` computes its loss from the labels itself, one per direction (its softmax sampled while training),
    and returns no `logits`: Trainer's label smoothing and `compute_loss_func` take the labels away from it and look
    for those."""
    if args.label_smoothing_factor:
        raise ValueError(
            f"label_smoothing_factor must be 0 for ElmoForBiLM, got {args.label_smoothing_factor}: the model computes "
            "its loss itself, Trainer's label smoothing would read logits it does not return."
        )
    if compute_loss_func is not None:
        raise ValueError(
            "compute_loss_func: ElmoTrainer takes none, ElmoForBiLM computes its loss itself from the labels and "
            "returns no logits; override compute_loss in a subclass instead."
        )


def clip_in_optimizer(optimizer: torch.optim.Optimizer, max_norm: float):
    """bilm-tf's clipping, TensorFlow's `clip_by_global_norm` (every gradient times `max_norm / max(norm, max_norm)`),
    as part of each step of `optimizer`: inside the fused pass of `hf_elmo.training.adagrad.Adagrad`
    (`clip_grad_norm_`), else before the step."""

    def clip(optimizer, args, kwargs):
        if isinstance(optimizer, Adagrad):
            if not optimizer.clip_pending:  # else `ElmoTrainer.gradient_norm` took this clip with the norm
                optimizer.clip_grad_norm_(max_norm, eps=0.0)
            return
        gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        factor = torch.clamp(max_norm / torch.nn.utils.get_total_norm(gradients), max=1.0)
        for gradient in gradients:
            gradient.mul_(factor)

    optimizer.register_step_pre_hook(clip)


class ElmoTrainer(Trainer):
    """`Trainer` that clips as bilm-tf in the optimizer, stops at the first non-finite loss, and also reports exact
    (token-weighted) forward, backward and mean perplexity when evaluating; `CheckpointStaging` writes its checkpoints.
    Given `DataCollatorForBiLM(words=table)`, its loader sends the stored windows only and the batches are made on the
    training device (`expand_stored_windows`); other collators' batches are checked on the host on a GPU
    (`HostCheckedCollator`).

    The tokenizer is not `Trainer(processing_class=...)`: that copies its character-level special ids into the config,
    where they would be read as word ids.
    """

    _direction_sums: torch.Tensor | None = None
    _split_directions = False  # as the model is called in training (`StreamTrainer`: True)
    # The first step whose training loss was not finite (0: none so far) and that loss, on the loss's device.
    _non_finite_step: torch.Tensor | None = None
    _non_finite_loss: torch.Tensor | None = None
    started = False  # whether a training step ran (errors before it are a resumed checkpoint's)

    def __init__(self, *args, word_tokenizer: ElmoTokenizer, clip_norm: float, **kwargs):
        super().__init__(*args, **kwargs)
        check_loss_options(self.args, self.compute_loss_func)
        self.word_tokenizer, self.clip_norm, self.run_dir = word_tokenizer, clip_norm, Path(self.args.output_dir)
        config = self.accelerator.unwrap_model(self.model).config
        collator = self.data_collator
        self.word_table = collator.words if isinstance(collator, DataCollatorForBiLM) else None
        if self.word_table is not None:
            # The loader sends the stored windows, a hundredth of the batch, which `expand_stored_windows` makes into
            # the batch on the device; the table's values checked once stand for the checks of every batch.
            check_word_table(config, self.word_table)
            self.data_collator = dataclasses.replace(collator, stored_only=True)
            # The rows' `positions` are the collator's input, not the model's: Trainer's default would drop them.
            self.args.remove_unused_columns = False
        elif _on_accelerator(self.args):
            self.data_collator = HostCheckedCollator(self.data_collator, config)
        # Trainer asks its accelerator for the gradient norm every step (to log it; `max_norm` inf where it does not
        # clip), a pass over every gradient of its own: `gradient_norm` makes it the one ELMo's Adagrad takes anyway.
        self.accelerator_gradient_norm = self.accelerator.clip_grad_norm_
        self.accelerator.clip_grad_norm_ = self.gradient_norm

    def gradient_norm(self, parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """The total gradient norm for `Trainer`'s log: with `hf_elmo.training.adagrad.Adagrad` in plain or DDP training
        without a loss scaler, taken by the optimizer's clip (`--all_clip_norm_val`, or none), whose factor its
        fused step applies; else the accelerator's `clip_grad_norm_`."""
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps it
        plain = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
        if (
            isinstance(optimizer, Adagrad)
            and math.isinf(max_norm)
            and norm_type == 2.0
            and self.accelerator.distributed_type in plain
            and getattr(self.accelerator, "scaler", None) is None
        ):
            return optimizer.clip_grad_norm_(self.clip_norm or math.inf, eps=0.0)
        return self.accelerator_gradient_norm(parameters, max_norm, norm_type)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.clip_norm:
            plain = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
            if self.accelerator.distributed_type not in plain:
                raise ValueError(
                    f"--all_clip_norm_val clips whole gradients, which {self.accelerator.distributed_type} shards: "
                    "give --all_clip_norm_val 0 (and --max_grad_norm for Trainer's clip)."
                )
            clip_in_optimizer(optimizer, self.clip_norm)
        return optimizer

    def expand_stored_windows(self, batch: dict) -> dict:
        """`batch`, a batch of stored windows (`DataCollatorForBiLM(stored_only=True)`), made into the model's inputs
        on the training device, in place (`Trainer` reads the batch again after the step: its FLOPs, its tokens);
        other batches as they are."""
        if STORED_WINDOWS in batch:
            batch.update(self.word_table.expand(batch.pop(STORED_WINDOWS).to(self.args.device)))
            batch[HostCheckedCollator.MARK] = True  # values of the checked table
        return batch

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device):
        # Made into model inputs before Trainer counts the targets of the batches it accumulates.
        return super().get_batch_samples(map(self.expand_stored_windows, epoch_iterator), num_batches, device)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self.expand_stored_windows(inputs)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.started = True
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
        saved = checkpoints(self.run_dir)
        kept = f"the last checkpoint is {saved[-1].name}" if saved else "no checkpoint was written before"
        return f"nothing from that step on was saved ({kept})"

    def log(self, logs: dict, start_time=None):
        if "loss" in logs:  # the training loss, which Trainer has just waited for
            self.check_finite()
        super().log(logs, start_time)

    def save_final_model(self):
        """Saves the model and the tokenizer into the output folder as each checkpoint: written aside, then moved into
        place when complete."""
        staging = self.run_dir / STAGING_DIR
        if self.is_world_process_zero():
            shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save may have left
        self.accelerator.wait_for_everyone()
        self.save_model(str(staging))
        if self.is_world_process_zero():
            self.word_tokenizer.save_pretrained(staging)
        self.accelerator.wait_for_everyone()
        if self.is_world_process_zero():
            with deferred_signals():
                for path in staging.iterdir():
                    os.replace(path, self.run_dir / path.name)
            staging.rmdir()

    def complete_checkpoint(self, folder: Path):
        """Adds what `Trainer` does not write to the checkpoint in `folder`: the tokenizer, so that every checkpoint
        is a complete model folder, and the run's options (how it splits text: `corpus.model_split`)."""
        if self.args.should_save:
            self.word_tokenizer.save_pretrained(folder)
            options = self.run_dir / TRAINING_OPTIONS_FILE
            if options.is_file():
                shutil.copyfile(options, folder / TRAINING_OPTIONS_FILE)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
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


class StreamTrainer(ElmoTrainer):
    """`ElmoTrainer` for `StreamWindowDataset` batches: each process carries its rows' LSTM state from batch to batch
    (detached, as bilm-tf feeds it), and saves it with every checkpoint, with the record of the shards the streams read
    (`STREAM_CORPUS_FILE`) and the streams' position after the step (with `DataCollatorForBiLMStreams(positions=True)`),
    so that `--resume` continues the streams: the dataset lays them out from that position (else from the start) and
    `Trainer` skips the steps already trained."""

    carried: tuple[torch.Tensor, torch.Tensor] | None = None
    position: torch.Tensor | None = None  # the streams' position after the last step trained (`STREAM_POSITION`)
    _split_directions = True  # each direction's LSTMs run on its own half of the rows

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:  # evaluation runs windows from the model's start state
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {**inputs, "state": self.carried, "use_cache": True, "split_directions": True}
        self.position = inputs.pop(STREAM_POSITION, None)
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        self.carried = tuple(t.detach() for t in outputs.state)
        return (loss, outputs) if return_outputs else loss

    def complete_checkpoint(self, folder: Path):
        super().complete_checkpoint(folder)
        if self.args.should_save:
            record = json.dumps(self.train_dataset.corpus_record(), indent=1) + "\n"
            write_atomically(folder / STREAM_CORPUS_FILE, record)
        if self.carried is not None:
            hidden, memory = (t.contiguous().cpu() for t in self.carried)
            path = folder / STREAM_STATE_FILE.format(rank=self.args.process_index)
            position = {} if self.position is None else {"position": self.position.cpu()}
            save_file({"hidden": hidden, "memory": memory, **position}, path)

    def load_carried_state(self, checkpoint: str | os.PathLike):
        """Restores this process's carried state from `checkpoint` (a folder `complete_checkpoint` wrote into), after
        checking that the corpus is the one the streams read."""
        self.train_dataset.check_same_corpus(checkpoint)
        files = sorted(Path(checkpoint).glob(STREAM_STATE_FILE.format(rank="*")))
        path = Path(checkpoint) / STREAM_STATE_FILE.format(rank=self.args.process_index)
        if len(files) != self.args.world_size or not path.is_file():
            raise ValueError(
                f"--resume: {checkpoint} holds the stream states of {len(files)} processes, this run has "
                f"{self.args.world_size}; resume --stream runs with the same number of processes."
            )
        with one_line_load_errors(checkpoint, "stream state"):
            state = load_file(path)
        if not all(torch.isfinite(tensor).all() for tensor in state.values()):
            raise ValueError(f"--resume: {path}: the stream state holds NaN or infinite values")
        self.carried = (state["hidden"].to(self.args.device), state["memory"].to(self.args.device))
        if "position" in state:  # else (an earlier checkpoint) the streams are laid out again from the start
            self.train_dataset.resume_at(state["position"].numpy(), f"--resume: {path}: position")


LOAD_ERRORS = (pickle.UnpicklingError, EOFError, RuntimeError, OSError, KeyError, SafetensorError)


@contextlib.contextmanager
def one_line_load_errors(checkpoint, what: str, errors=(*LOAD_ERRORS, ValueError)):
    """A checkpoint file that cannot be read (damaged, tampered with: torch refuses unsafe pickles) as one line."""
    try:
        yield
    except ElmoInputError:
        raise
    except errors as error:
        message = " ".join(str(error).split())[:300] or type(error).__name__
        raise ValueError(f"--resume: {checkpoint}: cannot read the {what} ({message}).") from None


class CheckpointStaging(TrainerCallback):
    """Writes each checkpoint of `trainer` into `STAGING_DIR` of the output folder, completes it there (tokenizer,
    carried stream states) and moves it into place, so that an interrupted save leaves the earlier checkpoints as they
    were; checks the loss and the weights before, so that nothing non-finite is saved; checks a resumed checkpoint's
    weights and optimizer state once they are loaded."""

    def __init__(self, trainer: ElmoTrainer, resume_from: Path | None):
        self.trainer, self.resume_from = trainer, resume_from
        self.loaded = False  # whether the resumed weights, optimizer and scheduler are loaded

    def on_train_begin(self, args, state, control, **kwargs):
        self.loaded = True
        if self.resume_from is not None:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            try:
                check_finite_weights(model, f"--resume: {self.resume_from / 'model.safetensors'}")
            except ValueError as error:
                raise ElmoInputError(str(error)) from None
            self._check_optimizer_state(model)

    def _check_optimizer_state(self, model):
        """The optimizer state just loaded must be finite and have taken as many steps as the checkpoint's trainer
        state says (not, say, an optimizer.pt copied from an earlier checkpoint)."""
        optimizer = getattr(self.trainer.optimizer, "optimizer", self.trainer.optimizer)  # accelerate wraps it
        names = {param: name for name, param in model.named_parameters()}
        where = self.resume_from / "optimizer.pt"
        taken = 0
        for param, values in optimizer.state.items():
            for key, value in values.items():
                if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                    raise ElmoInputError(
                        f"--resume: {where}: the optimizer state holds NaN or infinite values ('{key}' of "
                        f"'{names.get(param, 'a parameter')}')"
                    )
            if "step" in values:  # each parameter's count of the steps that updated it
                taken = max(taken, int(values["step"]))
        if taken != self.trainer.state.global_step:
            raise ElmoInputError(
                f"--resume: {where}: the optimizer state is at step {taken}, but {TRAINER_STATE_NAME} there is at "
                f"step {self.trainer.state.global_step}: the file belongs to another checkpoint"
            )

    def on_step_end(self, args, state, control, **kwargs):
        if not control.should_save:
            return
        self.trainer.check_finite(weights=True)
        staging = self.trainer.run_dir / STAGING_DIR
        if args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
        self.trainer.accelerator.wait_for_everyone()
        args.output_dir = str(staging)  # where `Trainer` writes the checkpoint; back when it is saved

    on_epoch_end = on_step_end

    def on_save(self, args, state, control, **kwargs):
        run_dir = self.trainer.run_dir
        args.output_dir = str(run_dir)
        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        staging = run_dir / STAGING_DIR
        self.trainer.complete_checkpoint(staging / name)
        self.trainer.accelerator.wait_for_everyone()
        if args.should_save:
            with deferred_signals():
                if (run_dir / name).exists():  # an incomplete one, from before a resume that skipped it
                    shutil.rmtree(run_dir / name)
                (staging / name).rename(run_dir / name)
            limit = args.save_total_limit
            for old in checkpoints(run_dir)[: -limit if limit and limit > 0 else 0]:
                shutil.rmtree(old)
            shutil.rmtree(staging, ignore_errors=True)


__all__ = ["CheckpointStaging", "ElmoTrainer", "StreamTrainer", "clip_in_optimizer"]
