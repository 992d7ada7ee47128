"""`hf-elmo convert`: an original options.json + weights.hdf5 (`convert_original_elmo`), a bilm-tf training
checkpoint (`convert_bilm_tf_checkpoint`) or an ELMoForManyLangs model (`convert_elmoformanylangs`) to a Hugging Face
model folder."""

from dataclasses import dataclass
from pathlib import Path

from ..convert.from_bilm_tf_checkpoint import convert_bilm_tf_checkpoint
from ..convert.from_elmoformanylangs import convert_elmoformanylangs
from ..convert.from_original import convert
from ..io.files import ElmoInputError
from ..training.warm_state import DEFAULT_SENTENCES
from .command_line import option
from .launch import check_one_process


@dataclass(kw_only=True)
class ConvertOptions:
    format: str = option(
        "original",
        help="original: bilm-tf / AllenNLP options.json + weights.hdf5; elmoformanylangs: a HIT-SCIR model folder",
        choices=("original", "elmoformanylangs"),
    )
    options: str | None = option(None, help="options.json of the original model")
    weights: str | None = option(None, help="weights.hdf5 of the original model")
    model_dir: str | None = option(None, help="ELMoForManyLangs model folder (char.dic, word.dic, *.pkl, config.json)")
    model_config: str | None = option(
        None, help="its model configuration, if the folder lacks the one config.json names"
    )
    tf_checkpoint: str | None = option(
        None,
        help="a bilm-tf training checkpoint (folder with the 'checkpoint' file, or prefix): converted with its word "
        "softmax to an ElmoForBiLM, read without TensorFlow; --options defaults to its options.json",
    )
    vocab: str | None = option(None, help="with --tf-checkpoint (required): the vocabulary file it was trained with")
    warm_state_text: list[str] | None = option(
        None, help="text files to estimate a warm start state from (see hf-elmo warm-state)"
    )
    warm_state_sentences: int = option(DEFAULT_SENTENCES, help="sentences of --warm-state-text used")
    output_dir: str = option(help="folder to write (must be empty or absent)")
    force: bool = option(False, help="replace an earlier converted model in that folder", flag=True)


COMMAND_OPTIONS = ConvertOptions


def _convert(options) -> Path:
    warm = {"warm_state_text": options.warm_state_text, "warm_state_sentences": options.warm_state_sentences}
    if options.tf_checkpoint is not None:
        if options.weights or options.model_dir or options.model_config or options.format != "original":
            raise ElmoInputError("--tf-checkpoint takes --vocab and --options (not --weights / --model-dir)")
        return convert_bilm_tf_checkpoint(
            options.tf_checkpoint, options.output_dir, options.vocab, options.options, force=options.force, **warm
        )
    if options.vocab:
        raise ElmoInputError("--vocab goes with --tf-checkpoint (weights.hdf5 holds no word softmax)")
    if options.format == "elmoformanylangs":
        if options.model_dir is None or options.options or options.weights:
            raise ElmoInputError("--format elmoformanylangs takes --model-dir (not --options / --weights)")
        if options.warm_state_text:
            raise ElmoInputError("--warm-state-text is not supported for --format elmoformanylangs")
        return convert_elmoformanylangs(
            options.model_dir, options.output_dir, options.model_config, force=options.force
        )
    if options.options is None or options.weights is None or options.model_dir or options.model_config:
        raise ElmoInputError("--format original takes --options and --weights (not --model-dir / --model-config)")
    return convert(options.options, options.weights, options.output_dir, force=options.force, **warm)


def run(options) -> int:
    """`options`: the fields of `ConvertOptions`, as parsed."""
    check_one_process("convert")
    print(f"Converted ELMo written to {_convert(options)}")
    return 0
