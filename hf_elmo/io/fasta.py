"""Protein sequences in FASTA files, read as SeqVec reads them.

A record is a header line `>ID DESCRIPTION` and the sequence lines after it, up to the next header. The id is the
header's first word (up to the first whitespace); the whole header, without `>`, is kept. The sequence is its lines
joined with all whitespace removed and upper-cased (SeqVec's `read_fasta` does both); every letter is a residue,
the ambiguous and rare ones (X, U, O, B, Z) included: SeqVec passes them to its model as they are, as characters of
their own. A `*` ending the sequence is the stop codon of a translated gene and is dropped.

Refused, in one line naming the file and the record: text before the first header (not a FASTA file), a header
without an id, an id given twice, a record without residues, and anything in a sequence that is not a letter (a
gap `-`, a digit, a `*` before the end). An id holding `/` is refused as well: it names the record's HDF5 dataset,
where `/` separates groups.
"""

from dataclasses import dataclass

from .files import ElmoInputError, read_lines


@dataclass(frozen=True)
class FastaRecord:
    id: str
    header: str
    """The header line without `>`."""
    sequence: str
    line: int
    """The header's line number (from 1)."""


def read_fasta(path) -> list[FastaRecord]:
    """The records of the FASTA file `path` (`-`: standard input), in file order."""
    records: list[FastaRecord] = []
    first_line: dict[str, int] = {}
    header: tuple[str, str, int] | None = None
    pieces: list[str] = []

    def close_record():
        record_id, text, line = header
        sequence = "".join(pieces)
        if sequence.endswith("*"):
            sequence = sequence[:-1]
        if not sequence:
            raise ElmoInputError(f"{path}: record {record_id!r} (line {line}) has no residues")
        if not sequence.isascii() or not sequence.isalpha():
            bad = next(c for c in sequence if not (c.isascii() and c.isalpha()))
            where = "before the end of the sequence (a stop codon ends it)" if bad == "*" else "in its sequence"
            raise ElmoInputError(
                f"{path}: record {record_id!r} (line {line}) has {bad!r} {where}; a protein sequence holds only "
                "letters, one per residue"
            )
        records.append(FastaRecord(record_id, text, sequence, line))

    for number, text in enumerate(read_lines(path), start=1):
        if text.startswith(">"):
            if header is not None:
                close_record()
            described = text[1:].strip()
            record_id = described.split(maxsplit=1)[0] if described else ""
            if not record_id:
                raise ElmoInputError(f"{path}: line {number}: a header without an id ('>' then the id)")
            if "/" in record_id:
                raise ElmoInputError(
                    f"{path}: record {record_id!r} (line {number}): an id cannot hold '/' (it names an HDF5 dataset)"
                )
            if record_id in first_line:
                raise ElmoInputError(
                    f"{path}: record {record_id!r} (line {number}) repeats the id of line {first_line[record_id]}"
                )
            first_line[record_id] = number
            header, pieces = (record_id, described, number), []
        elif header is None:
            if text.strip():
                raise ElmoInputError(
                    f"{path}: line {number}: not a FASTA file (expected a header line starting with '>', got "
                    f"{text[:40]!r})"
                )
        else:
            pieces.append("".join(text.split()).upper())
    if header is None:
        raise ElmoInputError(f"{path}: no FASTA record (no header line starting with '>')")
    close_record()
    return records
