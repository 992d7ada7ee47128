"""The `hf-elmo` command: `hf-elmo COMMAND --help` for each command.

Every command reports a problem with what it was given as one line, `error: ...`, and exits with status 2: the
commands raise `ValueError` (`file_io.ElmoInputError` for files and fields) or `OSError` for it, caught here. SIGTERM
and SIGHUP stop a command as Ctrl-C does (exit status 130), after it removed what it was writing (`file_io`).
"""

import argparse
import sys

from transformers import HfArgumentParser

from . import (
    convert_original_elmo,
    data_bilm,
    embed_elmo,
    export_original_elmo,
    perplexity_bilm,
    warm_state,
)
from .commands import train as train_bilm
from .file_io import signals_as_interrupts

# name -> (module with run(args) -> exit code and either add_arguments(parser) or COMMAND_OPTIONS, a dataclass whose
# fields are the options, one-line help)
COMMANDS = {
    "convert": (
        convert_original_elmo,
        "convert an original options.json + weights.hdf5, a bilm-tf training checkpoint or an ELMoForManyLangs model "
        "to a Hugging Face folder",
    ),
    "embed": (embed_elmo, "write the ELMo vectors of a text file, one sentence per line, to an HDF5 file"),
    "export": (
        export_original_elmo,
        "write a model folder back as an original options.json + weights.hdf5, or as an ONNX graph (--format onnx)",
    ),
    "vocab": (data_bilm, "count a corpus and write a word vocabulary in the original format"),
    "train": (train_bilm, "pre-train a biLM, or adapt one to a domain, with the transformers Trainer"),
    "perplexity": (perplexity_bilm, "forward, backward and mean perplexity of a trained biLM on text files"),
    "warm-state": (warm_state, "estimate a warm start state from text and store it in a model folder"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf-elmo", description="ELMo for Hugging Face transformers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HfArgumentParser)
    for name, (module, help_text) in COMMANDS.items():
        options = getattr(module, "COMMAND_OPTIONS", None)
        formatter = argparse.ArgumentDefaultsHelpFormatter if options else argparse.HelpFormatter
        command = commands.add_parser(
            name, help=help_text, description=help_text, dataclass_types=options, formatter_class=formatter
        )
        if options is None:
            module.add_arguments(command)
        command.set_defaults(run=module.run)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.given = _given_options(commands.choices[args.command], argv[argv.index(args.command) + 1 :])
    with signals_as_interrupts():
        try:
            return args.run(args)
        except (ValueError, OSError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM / SIGHUP: what was being written is removed
            name = interrupt.args[0] if interrupt.args else "SIGINT"
            print(f"interrupted by {name}: the output in progress was not written", file=sys.stderr)
            return 130


class _HoldsEveryOption(argparse.Namespace):
    """A namespace that seems to hold every option already, so that argparse fills in no defaults."""

    def __getattr__(self, name):
        if name.startswith("_"):  # argparse's own bookkeeping
            raise AttributeError(name)
        return None


def _given_options(command: argparse.ArgumentParser, arguments: list[str]) -> set[str]:
    """The names of the options that `arguments` give to `command`, whatever their values (an option given with its
    default value is given): what a resumed run must not change, and the others it may take from its record."""
    return set(vars(command.parse_known_args(arguments, namespace=_HoldsEveryOption())[0]))


if __name__ == "__main__":
    sys.exit(main())
