"""`hf-elmo warm-state`: estimate a model's warm start state from text (`warm_state.estimate_warm_state`) and store it
in a copy of the model folder (`--output-dir`), or in the folder itself when asked (`--in-place`)."""

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..input_checks import device_option
from ..io.files import MODEL_FOLDER, ElmoInputError, check_output, write_output
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder
from ..tokenization_elmo import ElmoTokenizer
from ..training.corpus import MODEL_SPLIT_HELP, SPLITS, model_split
from ..training.warm_state import (
    DEFAULT_SENTENCES,
    check_single_weights_file,
    estimate_warm_state,
    read_sentences,
    store_warm_state,
)
from .command_line import ExclusiveOptions, option
from .launch import check_one_process
from .threads import HELP as THREADS_HELP
from .threads import use_threads

DESTINATION = ExclusiveOptions()


@dataclass(kw_only=True)
class WarmStateOptions:
    model: str = option(help="model folder (hf-elmo convert / train / save_pretrained)")
    files: list[str] = option(help="text files, one sentence per line (in-domain text is best)", positional=True)
    output_dir: str | None = option(
        None,
        help="new folder to write: the model folder's files with the warm start state (the model folder is left as "
        "it is)",
        exclusive=DESTINATION,
    )
    in_place: bool = option(
        False,
        help="rewrite the model folder's weights and config.json instead (each file replaced whole, by a rename)",
        flag=True,
        exclusive=DESTINATION,
    )
    force: bool = option(False, help="replace an earlier model folder at --output-dir", flag=True)
    sentences: int = option(DEFAULT_SENTENCES, help="use the first N sentences")
    split: str | None = option(None, help=MODEL_SPLIT_HELP, choices=SPLITS)
    device: str | None = option(None, help="torch device, e.g. cpu or cuda:0 (default: cuda if available)")
    threads: int | None = option(None, help=THREADS_HELP)


COMMAND_OPTIONS = WarmStateOptions


def _copy_with_warm_state(model_dir: Path, state, target: Path):
    """Writes into the empty folder `target` the files of `model_dir` with `state` stored in them."""
    # The folder's files only: subfolders (a training run's checkpoints, logs) are not the model.
    for entry in sorted(model_dir.iterdir()):
        if entry.is_file():
            shutil.copy2(entry, target / entry.name)
    store_warm_state(target, state)


def run(options) -> int:
    """`options`: the fields of `WarmStateOptions`, as parsed."""
    check_one_process("warm-state")
    use_threads(options.threads)
    device = device_option(options.device)
    split = model_split(options.model, options.split)
    if options.output_dir is None and not options.in_place:
        raise ElmoInputError(
            f"name --output-dir DIR for a new folder with the warm start state ({options.model} is left as it is), "
            f"or --in-place to rewrite {options.model}"
        )
    if options.output_dir is not None:
        check_output(options.output_dir, MODEL_FOLDER, [options.model, *options.files], options.force)
    elif options.force:
        raise ElmoInputError("--force goes with --output-dir (--in-place always rewrites the model folder)")
    model = load_model_folder(ElmoModel, options.model).to(device)
    check_single_weights_file(Path(options.model))
    tokenizer = ElmoTokenizer.from_pretrained(options.model)
    sentences = read_sentences(options.files, options.sentences, split, tokenizer)
    state = estimate_warm_state(model, sentences, tokenizer)
    if options.in_place:
        store_warm_state(options.model, state)
        written = options.model
    else:
        write = functools.partial(_copy_with_warm_state, Path(options.model), state)
        written = write_output(options.output_dir, write, MODEL_FOLDER, [options.model, *options.files], options.force)
    print(f"Warm start state from {len(sentences):,} sentences written to {written}")
    return 0
