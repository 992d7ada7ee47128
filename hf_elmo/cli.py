"""The `hf-elmo` command: `hf-elmo COMMAND --help` for each command."""

import argparse
import sys

from . import convert_original_elmo, data_bilm, embed_elmo, export_original_elmo, perplexity_bilm, train_bilm
from .safe_output import signals_as_interrupts

# name -> (module with add_arguments(parser) and run(args) -> exit code, one-line help)
COMMANDS = {
    "convert": (
        convert_original_elmo,
        "convert an original options.json + weights.hdf5 (or an ELMoForManyLangs model) to a Hugging Face folder",
    ),
    "embed": (embed_elmo, "write the ELMo vectors of a text file, one sentence per line, to an HDF5 file"),
    "export": (export_original_elmo, "write a model folder back as an original options.json + weights.hdf5"),
    "vocab": (data_bilm, "count a corpus and write a word vocabulary in the original format"),
    "train": (train_bilm, "pre-train a biLM, or adapt one to a domain, with the transformers Trainer"),
    "perplexity": (perplexity_bilm, "forward, backward and mean perplexity of a trained biLM on text files"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf-elmo", description="ELMo for Hugging Face transformers.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    with signals_as_interrupts():
        try:
            return args.run(args)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM / SIGHUP: what was being written is removed
            print(f"interrupted by {interrupt.args[0] if interrupt.args else 'SIGINT'}: the output in progress was "
                  "not written", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
