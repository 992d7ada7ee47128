"""`hf-elmo embed`: the ELMo vectors of a text file, one sentence per line, written to an HDF5 file (`embed_elmo`,
whose docstring describes the file). Under `torchrun` each process embeds every other line into a part of its own,
and the first merges the parts."""

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..convert.original_format import load_original_elmo
from ..features.embed import (
    DTYPES,
    OUTPUT_DTYPES,
    Embedder,
    LayerSelector,
    embed_file,
    merge_parts,
    part_path,
)
from ..features.embed_proteins import DEFAULT_RESIDUE_BUDGET, OutOfMemoryFallback, check_partials, embed_fasta
from ..input_checks import device_option
from ..io.fasta import read_fasta
from ..io.files import HDF5_FILE, ElmoInputError, check_output
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder
from ..tokenization_elmo import ElmoTokenizer
from .command_line import ExclusiveOptions, option
from .launch import DEFAULT_RENDEZVOUS_TIMEOUT, RENDEZVOUS_HELP, Launch, Rendezvous, check_timeout, stop_reason
from .threads import HELP as THREADS_HELP
from .threads import use_threads

MODEL_SOURCE = ExclusiveOptions(required=True)
LAYERS = ExclusiveOptions(required=True)


@dataclass(kw_only=True)
class EmbedOptions:
    input: str = option(
        help="UTF-8 text, one sentence per line (whitespace-tokenised unless --raw), or with --fasta a FASTA file of "
        "protein sequences; - for stdin",
        positional=True,
    )
    output: str = option(help="HDF5 file to write", positional=True)
    model: str | None = option(
        None, help="folder written by hf-elmo convert or save_pretrained", exclusive=MODEL_SOURCE
    )
    options: str | None = option(
        None, help="original options.json (with --weights), instead of --model", exclusive=MODEL_SOURCE
    )
    weights: str | None = option(None, help="original weights.hdf5, with --options")
    all: bool = option(False, help="all layers: (L+1, n_words, 2P)", flag=True, exclusive=LAYERS)
    top: bool = option(False, help="top layer: (n_words, 2P)", flag=True, exclusive=LAYERS)
    average: bool = option(False, help="mean of all layers", flag=True, exclusive=LAYERS)
    sum: bool = option(False, help="sum of all layers (SeqVec's per-residue vectors)", flag=True, exclusive=LAYERS)
    scalar_mix_weights: list[float] | None = option(
        None,
        help="fixed mix sum_k softmax(W)_k layer_k: one unnormalised weight per layer, as AllenNLP's "
        "scalar_mix_parameters",
        metavar="W",
        exclusive=LAYERS,
    )
    batch_size: int = option(64, help="sentences per batch")
    device: str | None = option(None, help="torch device, e.g. cpu or cuda:0 (default: cuda if available)")
    dtype: str = option("float32", help="dtype the model runs in", choices=sorted(DTYPES))
    output_dtype: str | None = option(
        None,
        help="dtype of the stored vectors (default: float64 with --dtype float64, else float32)",
        choices=sorted(OUTPUT_DTYPES),
    )
    raw: bool = option(False, help="split raw text into words with the tokenizer", flag=True)
    carry_state: bool = option(
        False,
        help="the original stateful behaviour: each batch row continues the LSTM state of the same row of the "
        "previous batch",
        flag=True,
    )
    forget_sentences: bool = option(False, help="do not write the sentence_to_index map", flag=True)
    layout: str = option(
        "per-line",
        help="per-line: one dataset per line, as AllenNLP's; packed: all words in one dataset 'vectors' and each "
        "line's (start, count) in 'spans', for bulk embedding",
        choices=["per-line", "packed"],
    )
    fasta: bool = option(
        False,
        help="the input is a FASTA file of protein sequences, one residue per word: one dataset per record, named by "
        "its id, with its header as the attribute 'header'",
        flag=True,
    )
    per_protein: str | None = option(
        None, help="with --fasta: also write each protein's mean over its residues to this HDF5 file"
    )
    residue_budget: int | None = option(
        None,
        help=f"with --fasta: padded residues per batch, longest proteins first (default {DEFAULT_RESIDUE_BUDGET:,}); "
        "changes speed and memory, not the vectors",
    )
    cpu_fallback: bool = option(
        False,
        help="with --fasta on a GPU: embed a protein for which the GPU has too little memory on the CPU instead of "
        "stopping (each one is reported)",
        flag=True,
    )
    resume: bool = option(
        False,
        help="with --fasta: continue the run of the same command that was stopped, from the partial files it kept",
        flag=True,
    )
    force: bool = option(False, help="replace an existing output file", flag=True)
    quiet: bool = option(False, help="no progress bar", flag=True)
    threads: int | None = option(None, help=THREADS_HELP)
    rendezvous_timeout: float = option(DEFAULT_RENDEZVOUS_TIMEOUT, help=RENDEZVOUS_HELP)


COMMAND_OPTIONS = EmbedOptions


def check_split_between_processes(options, processes: int):
    """Refuses what the lines of a part, every `processes`-th line, cannot give."""
    if processes == 1:
        return
    for given, option_name in (
        (str(options.input) == "-", "standard input"),
        (options.carry_state, "--carry-state"),
        (options.layout == "packed", "--layout packed"),
    ):
        if given:
            raise ElmoInputError(
                f"{option_name} cannot be split between {processes} processes (each embeds one line in {processes}): "
                "embed with one process"
            )


def _load(options):
    if options.model is not None:
        if options.weights is not None:
            raise ElmoInputError("--weights goes with --options, not with --model")
        model = load_model_folder(ElmoModel, options.model)
        try:
            tokenizer = ElmoTokenizer.from_pretrained(options.model)
        except Exception as error:  # json, OSError, ValueError from the tokenizer files
            message = " ".join(str(error).split()) or type(error).__name__
            if message.startswith(f"{options.model}: "):  # the tokenizer's own checks name the folder already
                raise ElmoInputError(message) from None
            raise ElmoInputError(f"{options.model}: cannot load the tokenizer ({message})") from None
        return model, tokenizer
    if options.weights is None:
        raise ElmoInputError("--options needs --weights")
    model = load_original_elmo(options.options, options.weights)
    return model, ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token)


def _layers(options) -> str:
    if options.scalar_mix_weights is not None:
        return "mix"
    return next(name for name in ("all", "top", "average", "sum") if getattr(options, name))


def run(options) -> int:
    """`options`: the fields of `EmbedOptions`, as parsed."""
    launch = Launch.from_environment()  # before any work: a wrong variable is one line, not a lost run
    check_timeout(options.rendezvous_timeout)
    use_threads(options.threads)
    inputs = [options.input, options.model, options.options, options.weights]
    check_output(options.output, HDF5_FILE, inputs, options.force)  # before loading a large model
    check_protein_options(options, launch.world_size)
    if options.per_protein is not None:
        check_output(options.per_protein, HDF5_FILE, [*inputs, options.output], options.force)
    if str(options.input) != "-" and Path(options.input).is_dir():
        raise ElmoInputError(f"{options.input}: is a folder, expected the input text file")
    if str(options.input) != "-" and not Path(options.input).exists():
        raise ElmoInputError(f"{options.input}: no such input file")
    if options.fasta:
        return run_fasta(options, inputs)
    check_split_between_processes(options, launch.world_size)
    if launch.world_size == 1:
        count = _embed(options, options.output, inputs, (0, 1), options.device, options.force)
    else:
        count = _embed_part_and_merge(options, launch, inputs)
    if launch.rank == 0:
        print(f"{count} sentences embedded to {options.output}", file=sys.stderr)
    return 0


def _embed(options, output, inputs, part: tuple[int, int], device: str | None, force: bool) -> int:
    device = device_option(device)
    model, tokenizer = _load(options)
    # Frozen: inference only, and the CPU loop keeps frozen weights' packed panels between batches.
    model.to(device=device, dtype=DTYPES[options.dtype]).requires_grad_(False)
    embedder = Embedder(
        model,
        tokenizer,
        LayerSelector(_layers(options), model.config.num_layers, options.scalar_mix_weights),
        OUTPUT_DTYPES[options.output_dtype or ("float64" if options.dtype == "float64" else "float32")],
    )
    return embed_file(
        embedder,
        options.input,
        output,
        batch_size=options.batch_size,
        raw=options.raw,
        carry_state=options.carry_state,
        forget_sentences=options.forget_sentences,
        force=force,
        packed=options.layout == "packed",
        progress=not options.quiet,
        inputs=inputs[1:],
        part=part,
    )


def check_protein_options(options, processes: int):
    """Refuses the options that do not go with --fasta, and the protein options without it."""
    if not options.fasta:
        for given, name in (
            (options.per_protein is not None, "--per-protein"),
            (options.residue_budget is not None, "--residue-budget"),
            (options.cpu_fallback, "--cpu-fallback"),
            (options.resume, "--resume"),
        ):
            if given:
                raise ElmoInputError(f"{name} goes with --fasta (protein sequences)")
        return
    for given, name in (
        (options.raw, "--raw"),
        (options.carry_state, "--carry-state"),
        (options.layout != "per-line", "--layout packed"),
        (options.forget_sentences, "--forget-sentences"),
        (processes > 1, "a launch of several processes"),
    ):
        if given:
            raise ElmoInputError(
                f"{name} does not go with --fasta (one dataset per protein, each from the start state)"
            )
    if options.residue_budget is not None and options.residue_budget < 1:
        raise ElmoInputError(f"--residue-budget must be >= 1, got {options.residue_budget}")
    if options.per_protein is not None and Path(options.per_protein).resolve() == Path(options.output).resolve():
        raise ElmoInputError(f"{options.per_protein}: --per-protein must be another file than the output")


def run_fasta(options, inputs) -> int:
    """`hf-elmo embed --fasta` (`features.embed_proteins`)."""
    from tqdm.auto import tqdm

    records = read_fasta(options.input)
    check_partials([path for path in (options.output, options.per_protein) if path is not None], options.resume)
    device = device_option(options.device)
    model, tokenizer = _load(options)
    model.to(device=device, dtype=DTYPES[options.dtype]).requires_grad_(False)  # as in `_embed`
    select = LayerSelector(_layers(options), model.config.num_layers, options.scalar_mix_weights)
    output_dtype = OUTPUT_DTYPES[options.output_dtype or ("float64" if options.dtype == "float64" else "float32")]
    embedder = Embedder(model, tokenizer, select, output_dtype)
    with tqdm(total=sum(len(record.sequence) for record in records), unit=" residues", disable=options.quiet) as bar:
        count = embed_fasta(
            embedder,
            records,
            options.input,
            options.output,
            options.per_protein,
            residue_budget=options.residue_budget or DEFAULT_RESIDUE_BUDGET,
            force=options.force,
            resume=options.resume,
            run={
                "model": [
                    str(Path(path).resolve()) for path in (options.model, options.options, options.weights) if path
                ],
                "layers": _layers(options),
                "scalar_mix_weights": options.scalar_mix_weights,
                "dtype": options.dtype,
                "output_dtype": str(output_dtype),
            },
            inputs=inputs,
            on_batch=bar.update,
            embed_batch=OutOfMemoryFallback(embedder, options.cpu_fallback) if model.device.type == "cuda" else None,
        )
    print(f"{count} proteins embedded to {options.output}", file=sys.stderr)
    return 0


def _embed_part_and_merge(options, launch: Launch, inputs) -> int:
    """Each process embeds its part; once every part is written the first process merges them into the output, and
    each removes its own part. The processes join before the work, so that one missing is known at once."""
    rank, processes = launch.rank, launch.world_size
    rendezvous = Rendezvous(launch, options.rendezvous_timeout, "hf_elmo_embed")
    parts = [part_path(options.output, k, processes) for k in range(processes)]
    others = [k for k in range(processes) if k != rank]
    device = options.device
    if device is None and torch.cuda.is_available():
        device = f"cuda:{launch.local_rank}"  # each process of a launch on its own GPU
    count = 0
    try:
        # A part left by an interrupted run is replaced.
        _embed(options, parts[rank], inputs, (rank, processes), device, force=True)
        rendezvous.store.set(f"embedded/{rank}", "1")
        if rank == 0:
            rendezvous.wait_for("embedded", others, "its part of the lines is missing")
            count = merge_parts(parts, options.output, options.force, [options.input, *inputs[1:]])
            rendezvous.store.set("merged/0", "1")
            rendezvous.wait_for("finished", others, "it did not finish")  # its store serves them until then
        else:
            rendezvous.wait_for("merged", [0], "the parts were not merged")
            rendezvous.store.set(f"finished/{rank}", "1")
    except BaseException as error:
        rendezvous.stop(stop_reason(error))
        raise
    finally:
        parts[rank].unlink(missing_ok=True)
    return count
