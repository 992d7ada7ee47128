"""`hf-elmo fasta-text`: the protein sequences of FASTA files (`io.fasta`, read as SeqVec reads them) as a training
corpus: one protein per line, its residues as words separated by spaces, in file order. `hf-elmo train --split
whitespace` and `hf-elmo vocab --split whitespace` read it with one residue per word."""

from dataclasses import dataclass

from ..io.fasta import read_fasta
from ..io.files import RESIDUE_TEXT_FILE, check_output, write_output
from .command_line import option
from .launch import check_one_process


@dataclass(kw_only=True)
class FastaTextOptions:
    files: list[str] = option(help="FASTA files", positional=True)
    output: str = option(help="text file to write")
    force: bool = option(False, help="replace an earlier file written by this command", flag=True)


COMMAND_OPTIONS = FastaTextOptions


def run(options) -> int:
    """`options`: the fields of `FastaTextOptions`, as parsed."""
    check_one_process("fasta-text")
    check_output(options.output, RESIDUE_TEXT_FILE, options.files, options.force)
    records = [record for path in options.files for record in read_fasta(path)]

    def write(path):
        with open(path, "w", encoding="utf-8") as text:
            for record in records:
                text.write(" ".join(record.sequence) + "\n")

    write_output(options.output, write, RESIDUE_TEXT_FILE, options.files, options.force)
    print(f"{len(records):,} proteins, {sum(len(r.sequence) for r in records):,} residues written to {options.output}")
    return 0
