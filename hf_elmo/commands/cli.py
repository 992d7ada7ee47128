"""The `hf-elmo` command: `hf-elmo COMMAND --help` for each command.

Each command is a module of `hf_elmo.commands` (named in `COMMAND_ENTRIES` with its one-line help, imported when the
command runs) with `COMMAND_OPTIONS` (a dataclass whose fields are its options, read by `HfArgumentParser`) and
`run(options) -> int` (the exit status), given the parsed options and `options.given`, the names of those on the
command line. Every command reports a problem with what it was given
as one line, `error: ...`, and exits with status 2: the commands raise `ValueError` (`file_io.ElmoInputError` for
files and fields) or `OSError` for it, caught here. SIGTERM and SIGHUP stop a command as Ctrl-C does (exit status
130), after it removed what it was writing (`file_io`).
"""

import argparse
import importlib
import sys
from collections.abc import MutableMapping
from typing import NamedTuple


class CommandEntry(NamedTuple):
    module: str  # in hf_elmo.commands
    help: str  # one line


# The commands and their one-line help: `hf-elmo --help` imports none of their modules (nor torch, nor transformers).
COMMAND_ENTRIES = {
    "convert": CommandEntry(
        "convert",
        "convert an original options.json + weights.hdf5, a bilm-tf training checkpoint or an ELMoForManyLangs model "
        "to a Hugging Face folder",
    ),
    "embed": CommandEntry(
        "embed",
        "write the ELMo vectors of a text file, one sentence per line, or of the protein sequences of a FASTA file "
        "(--fasta), to an HDF5 file",
    ),
    "export": CommandEntry(
        "export",
        "write a model folder back as an original options.json + weights.hdf5, or as an ONNX graph (--format onnx)",
    ),
    "vocab": CommandEntry("vocab", "count a corpus and write a word vocabulary in the original format"),
    "fasta-text": CommandEntry(
        "fasta_text",
        "write the protein sequences of FASTA files as text for hf-elmo train: one protein per line, residues as words",
    ),
    "train": CommandEntry("train", "pre-train a biLM, or adapt one to a domain, with the transformers Trainer"),
    "perplexity": CommandEntry("perplexity", "forward, backward and mean perplexity of a trained biLM on text files"),
    "warm-state": CommandEntry(
        "warm_state",
        "estimate a warm start state from text and store it in a copy of a model folder (or the folder itself)",
    ),
    "env": CommandEntry(
        "env", "print the versions, CPU features, compiled loops, CUDA device and model paths of this installation"
    ),
}


class _CommandModules(MutableMapping):
    """Each command's module, imported when it is asked for."""

    def __init__(self):
        self._modules = {}

    def __getitem__(self, name):
        if name not in self._modules:
            self._modules[name] = importlib.import_module(f".{COMMAND_ENTRIES[name].module}", __package__)
        return self._modules[name]

    def __setitem__(self, name, module):
        self._modules[name] = module

    def __delitem__(self, name):
        del self._modules[name]

    def __iter__(self):
        return iter(COMMAND_ENTRIES)

    def __len__(self):
        return len(COMMAND_ENTRIES)


COMMANDS = _CommandModules()


def _subparser(**options):
    """The parser of a command: `CommandParser` (which imports transformers) for one whose options it reads, plain
    argparse for one named in the list only."""
    if "dataclass_types" not in options:
        return argparse.ArgumentParser(**options)
    from .command_line import CommandParser

    return CommandParser(**options)


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The parser of `hf-elmo`: one sub-parser per command, with the options of those in `commands` (default: all)."""
    parser = argparse.ArgumentParser(prog="hf-elmo", description="ELMo for Hugging Face transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_subparser)
    for name, entry in COMMAND_ENTRIES.items():
        if commands is not None and name not in commands:
            subparsers.add_parser(name, help=entry.help, description=entry.help, add_help=False)
            continue
        from .command_line import DefaultsHelpFormatter

        module = COMMANDS[name]
        command = subparsers.add_parser(
            name,
            help=entry.help,
            description=entry.help,
            dataclass_types=module.COMMAND_OPTIONS,
            formatter_class=DefaultsHelpFormatter,
        )
        command.set_defaults(run=module.run)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser([name for name in argv if name in COMMAND_ENTRIES][:1]).parse_args(argv)
    from .command_line import CommandParser, signals_as_interrupts

    options = COMMANDS[args.command].COMMAND_OPTIONS
    args.given = _given_options(CommandParser(options), argv[argv.index(args.command) + 1 :])
    with signals_as_interrupts():
        try:
            return args.run(args)
        except (ValueError, OSError) as error:
            print(f"error: {_own_message(error)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM / SIGHUP: what was being written is removed
            name = interrupt.args[0] if interrupt.args else "SIGINT"
            print(f"interrupted by {name}: the output in progress was not written", file=sys.stderr)
            return 130


def _own_message(error: Exception) -> str:
    """The error's message; for one raised where a data-loader worker collated a batch, the worker's own message:
    `DataLoader` raises it again in the main process with the worker's whole traceback as its message."""
    message = str(error)
    if message.startswith(f"Caught {type(error).__name__} in DataLoader worker process"):
        return message.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1]  # the traceback's last line: "Type: message"
    return message


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
