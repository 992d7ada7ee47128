"""The folder of a training run: what `hf-elmo train` writes there before its first checkpoint, the options it records
(`OPTIONS_FILE`) and how `--resume` reads them back, and the clean-up after a run that stopped before its first
checkpoint (the checkpoints themselves: `hf_elmo.training.trainer`)."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

from ..configuration_elmo import ELMO_PRESETS
from ..io.files import ElmoInputError, check_not_an_input, read_json_object
from ..training.corpus import TRAINING_OPTIONS_FILE
from ..training.trainer import STAGING_DIR, checkpoints

OPTIONS_FILE = TRAINING_OPTIONS_FILE
# What a run writes before its first checkpoint: a new run may start in a folder holding only these.
LEFT_BEFORE_FIRST_CHECKPOINT = (OPTIONS_FILE, STAGING_DIR)
# The options a resumed run may give other values: where things go, how often they are reported, how long to go on.
RESUMABLE_CHANGES = {
    "output_dir",
    "resume",
    "data_cache_dir",
    "disable_tqdm",
    "report_to",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "dataloader_num_workers",
    "keep_freed_memory",
    "rendezvous_timeout",
    "threads",
    "max_minutes",
    "max_steps",
    "num_train_epochs",
}


def prepare_output_dir(model, data, training) -> Path:
    """The run's output folder, checked: not a link, not one of its inputs, empty unless resuming."""
    config_file = model.config if model.config not in ELMO_PRESETS else None
    inputs = [*data.train_files, *data.eval_files, data.vocab, config_file, model.init_from]
    if Path(training.output_dir).is_symlink():  # as every command's output (file_io.check_output)
        raise ElmoInputError(f"{training.output_dir}: is a symbolic link; give the folder itself or a new name")
    output_dir = check_not_an_input(training.output_dir, inputs)
    if (
        not training.resume
        and output_dir.exists()
        and {p.name for p in output_dir.iterdir()} - set(LEFT_BEFORE_FIRST_CHECKPOINT)
    ):
        raise ValueError(
            f"Output folder {output_dir} is not empty: pass --resume to continue the run in it, or choose another "
            "folder."
        )
    return output_dir


def as_recorded(value):
    return json.loads(json.dumps(value, default=os.fspath))


def resumed_options(given: dict, fields: dict[str, dataclasses.Field]) -> dict:
    """The options of a resumed run: those recorded in its folder (`OPTIONS_FILE`), with the ones `given` again, which
    must agree with the record except those a resumed run may change (`RESUMABLE_CHANGES`)."""
    if given.get("output_dir") is None:
        raise ValueError("--resume needs the folder of the run to continue (--output_dir).")
    output_dir = Path(given["output_dir"])
    saved = output_dir / OPTIONS_FILE
    if not saved.is_file() or not checkpoints(output_dir):
        raise ValueError(f"--resume: {output_dir} holds no checkpoint of an earlier run to continue from.")
    recorded = read_json_object(saved, "options file of the earlier run")
    if set(given) - set(fields):
        raise TypeError(f"Unknown training options: {', '.join(sorted(set(given) - set(fields)))}.")

    def earlier(name):  # an option the record lacks had its default
        if name in recorded:
            return recorded[name]
        field_ = fields[name]
        return field_.default_factory() if field_.default is dataclasses.MISSING else field_.default

    different = [
        f"--{name.replace('_', '-')} {earlier(name)!r} there, {as_recorded(value)!r} given"
        for name, value in given.items()
        if name not in RESUMABLE_CHANGES and as_recorded(value) != earlier(name)
    ]
    if different:
        raise ValueError(
            f"--resume: the run in {output_dir} has other options ({OPTIONS_FILE}): "
            + "; ".join(different)
            + "; leave them out to continue with the recorded ones."
        )
    return {**{k: v for k, v in recorded.items() if k in fields}, **given}


def remove_run_leftovers(output_dir: Path, created: bool):
    """After a run failed or was stopped before its first checkpoint: remove what it wrote, so that the same command
    can simply be run again."""
    if checkpoints(output_dir):
        return
    for name in LEFT_BEFORE_FIRST_CHECKPOINT:
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file():
            path.unlink()
    if created and output_dir.is_dir() and not any(output_dir.iterdir()):
        output_dir.rmdir()
