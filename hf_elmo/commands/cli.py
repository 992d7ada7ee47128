"""The `hf-elmo` command: `hf-elmo COMMAND --help` for each command.

Each command is a module of `hf_elmo.commands` with `HELP` (one line), `COMMAND_OPTIONS` (a dataclass whose fields
are its options, read by `HfArgumentParser`) and `run(options) -> int` (the exit status), given the parsed options
and `options.given`, the names of those on the command line. Every command reports a problem with what it was given
as one line, `error: ...`, and exits with status 2: the commands raise `ValueError` (`file_io.ElmoInputError` for
files and fields) or `OSError` for it, caught here. SIGTERM and SIGHUP stop a command as Ctrl-C does (exit status
130), after it removed what it was writing (`file_io`).
"""

import argparse
import sys

from . import convert, embed, env, export, fasta_text, perplexity, train, vocab, warm_state
from .command_line import CommandParser, DefaultsHelpFormatter, signals_as_interrupts

COMMANDS = {
    "convert": convert,
    "embed": embed,
    "export": export,
    "vocab": vocab,
    "fasta-text": fasta_text,
    "train": train,
    "perplexity": perplexity,
    "warm-state": warm_state,
    "env": env,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of `hf-elmo`: one sub-parser per command."""
    parser = argparse.ArgumentParser(prog="hf-elmo", description="ELMo for Hugging Face transformers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CommandParser)
    for name, module in COMMANDS.items():
        help_text = module.HELP
        command = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            dataclass_types=module.COMMAND_OPTIONS,
            formatter_class=DefaultsHelpFormatter,
        )
        command.set_defaults(run=module.run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
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
