"""`hf-elmo embed --fasta`: per-residue vectors of the protein sequences of a FASTA file (one residue per word, as
SeqVec reads them; `io.fasta`), written to an HDF5 file, and optionally each protein's mean vector to a second one.

    hf-elmo embed sequences.fasta residues.h5 --model DIR --fasta --sum --per-protein proteins.h5

* `residues.h5`: one float32 dataset per record, named by its id: `(L, 2P)` with `--sum` (SeqVec's per-residue
  vectors, the layers summed; `(L, 1024)` for SeqVec), `--top`, `--average` or `--scalar-mix-weights`,
  `(num_layers + 1, L, 2P)` with `--all`; its attribute `header` is the record's whole header line (without `>`).
* `proteins.h5` (`--per-protein`): the same names and attributes, each dataset the mean over residues of the one
  above, `(2P,)` or `(num_layers + 1, 2P)` (SeqVec's per-protein vector with `--sum`).

Every protein starts from the model's start state (zeros, or its warm start state), so its vectors depend on its
sequence alone. Proteins are embedded longest first in batches of at most `--residue-budget` padded residues
(batch size times its longest protein; a longer protein goes alone): the budget changes the speed and the memory,
not the vectors (up to float rounding).

Both files are written beside their places under hidden names (`.NAME.partial`) and renamed when complete, so they
appear complete or not at all; an existing file is replaced only with `--force` (`io.files`' rule). A run stopped
before the end (Ctrl-C, SIGTERM, an error naming a protein) keeps its partial files, and the same command with
`--resume` embeds only the proteins they lack; a partial file of another input, model, layer selection or dtype is
refused, and one damaged by a failed write (a full disk) is removed.
"""

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from ..io.fasta import FastaRecord
from ..io.files import HDF5_FILE, ElmoInputError, HDF5Output, check_output, deferred_signals
from .embed import Embedder, NonFiniteVectors

DEFAULT_RESIDUE_BUDGET = 15_000  # SeqVec's and bio_embeddings' default


def residue_batches(records: list[FastaRecord], budget: int) -> list[list[FastaRecord]]:
    """The records longest first (ties in file order), cut into batches whose size times their longest sequence is
    at most `budget`; a longer sequence forms a batch of its own."""
    batches: list[list[FastaRecord]] = []
    for record in sorted(records, key=lambda r: len(r.sequence), reverse=True):
        if batches and (len(batches[-1]) + 1) * len(batches[-1][0].sequence) <= budget:
            batches[-1].append(record)
        else:
            batches.append([record])
    return batches


def partial_path(path) -> Path:
    """Where the vectors of a run are written until it completes (and kept when it is interrupted): a hidden file
    beside `path`."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial")


def check_partials(outputs, resume: bool):
    """Refuses `--resume` without the partial files of the `outputs`, and a new run where partial files are left."""
    for partial in map(partial_path, outputs):
        if resume and not partial.is_file():
            raise ElmoInputError(f"{partial}: not found, no interrupted run to resume (run without --resume)")
        if not resume and partial.exists():
            raise ElmoInputError(
                f"{partial}: an interrupted run's vectors; pass --resume to continue that run, or remove the file"
            )


def embed_fasta(
    embedder: Embedder,
    records: list[FastaRecord],
    source,
    output_path,
    per_protein_path=None,
    *,
    residue_budget: int = DEFAULT_RESIDUE_BUDGET,
    force: bool = False,
    resume: bool = False,
    run: dict | None = None,
    inputs: Iterable = (),
    on_batch: Callable[[int], None] = lambda residues: None,
    embed_batch: Callable | None = None,
    report: Callable[[str], None] | None = None,
) -> int:
    """Writes the files described in the module docstring; returns the number of proteins. `source`: the FASTA
    file the records were read from. `resume`: continue the run whose partial files (`partial_path`) an interruption
    left, which must have been made by the same `run` (what decides the vectors: model, layers, dtypes) on the same
    `source`. `inputs`: the files the run reads, which no output may be. `on_batch(residues)` is called after each
    batch is written (and once for the proteins a resumed run finds done). `embed_batch`: what turns a batch's
    residue lists into their vectors (default `embedder`). `report`: where the note of an interruption goes."""
    inputs = list(inputs)
    embed_batch = embedder if embed_batch is None else embed_batch
    report = report or (lambda message: print(message, file=sys.stderr))
    outputs = [Path(output_path), *([Path(per_protein_path)] if per_protein_path is not None else [])]
    for output in outputs:
        check_output(output, HDF5_FILE, [*inputs, *(other for other in outputs if other != output)], force)
    partials = [partial_path(output) for output in outputs]
    identity = json.dumps(
        {"input": "-" if str(source) == "-" else str(Path(source).resolve()), **(run or {})}, sort_keys=True
    )
    check_partials(outputs, resume)
    with contextlib.ExitStack() as stack:
        files = []
        for partial in partials:
            try:
                files.append(stack.enter_context(HDF5Output(partial, append=resume)))
            except OSError as error:
                raise ElmoInputError(f"{partial}: cannot resume from it ({error}); remove it to start again") from None
            if resume and files[-1].file.attrs.get("hf_elmo_run") != identity:
                raise ElmoInputError(
                    f"{partial}: written by another run (another input, model, layer selection or dtype); run that "
                    "command with --resume, or remove the file to start again"
                )
            files[-1].file.attrs["hf_elmo_run"] = identity
        done = set(files[0].file).intersection(*(set(f.file) for f in files[1:]))
        for f in files:  # a protein written to one file only, when the run stopped: written again
            for name in set(f.file) - done:
                del f.file[name]
        todo = [record for record in records if record.id not in done]
        on_batch(sum(len(record.sequence) for record in records if record.id in done))
        try:
            _fill(files, todo, source, residue_budget, embed_batch, on_batch)
        except BaseException:
            if any(f.error is not None for f in files):  # a failed write leaves HDF5 files that cannot be resumed
                stack.close()
                for partial in partials:
                    partial.unlink(missing_ok=True)
            else:
                report(
                    f"stopped: the proteins embedded so far are kept in {', '.join(map(str, partials))}; the same "
                    "command with --resume continues"
                )
            raise
    with deferred_signals():
        for partial, output in zip(partials, outputs):
            try:
                if force:
                    os.replace(partial, output)
                else:  # a link, unlike a rename, fails if another process created the file meanwhile
                    os.link(partial, output)
                    partial.unlink()
            except FileExistsError:
                raise ElmoInputError(f"{output}: file exists (use --force to replace it)") from None
            except OSError as error:
                raise ElmoInputError(f"{output}: not written ({error.strerror or error})") from None
    return len(records)


def _fill(files: list[HDF5Output], records, source, residue_budget, embed_batch, on_batch):
    """Embeds `records` into `files` (per-residue, then per-protein if there are two), batch by batch."""
    residues, proteins = files[0], files[1] if len(files) > 1 else None
    for batch in residue_batches(records, residue_budget):
        try:
            vectors = embed_batch([list(record.sequence) for record in batch])
        except (NonFiniteVectors, ProteinOutOfMemory) as error:
            record = batch[error.row]
            raise ElmoInputError(f"{source}: record {record.id!r} (line {record.line}): {error}") from None
        lengths = [len(record.sequence) for record in batch]
        for record, words in zip(batch, np.split(vectors, np.cumsum(lengths)[:-1], axis=-2)):
            residues.file.create_dataset(record.id, data=np.ascontiguousarray(words)).attrs["header"] = record.header
            if proteins is not None:
                mean = words.mean(axis=-2, dtype=np.float64).astype(words.dtype)
                proteins.file.create_dataset(record.id, data=mean).attrs["header"] = record.header
        for f in files:
            f.file.flush()
            f.check()
        on_batch(sum(lengths))


class ProteinOutOfMemory(RuntimeError):
    """The GPU has too little memory for one protein alone; `row` is its row in the batch."""

    def __init__(self, row: int, residues: int, device: torch.device):
        self.row = row
        super().__init__(
            f"{device} ran out of memory for this protein of {residues:,} residues alone; pass --cpu-fallback to "
            "embed such proteins on the CPU, or --device cpu"
        )


class OutOfMemoryFallback:
    """`embedder` on a GPU, and what to do when the GPU runs out of memory: the batch's proteins are embedded one at
    a time; one that does not fit alone is an error (`ProteinOutOfMemory`), or with `cpu_fallback` is embedded by a
    float32 copy of the model on the CPU (made at the first such protein), each reported by `report`."""

    def __init__(self, embedder: Embedder, cpu_fallback: bool, report: Callable[[str], None] | None = None):
        self.embedder = embedder
        self.cpu_fallback = cpu_fallback
        self.report = report or (lambda message: print(message, file=sys.stderr))
        self.cpu_embedder: Embedder | None = None

    def __call__(self, batch: list[list[str]]) -> np.ndarray:
        try:
            return self.embedder(batch)
        except torch.OutOfMemoryError:
            pass
        torch.cuda.empty_cache()
        if len(batch) > 1:
            self.report(f"the GPU ran out of memory for a batch of {len(batch)} proteins: embedding them one at a time")
            return np.concatenate([self._alone(row, words) for row, words in enumerate(batch)], axis=-2)
        return self._alone(0, batch[0])

    def _alone(self, row: int, words: list[str]) -> np.ndarray:
        """One protein, `row` of its batch (the row its errors name)."""
        try:
            return self.embedder([words])
        except torch.OutOfMemoryError:
            pass
        except NonFiniteVectors as error:
            error.row = row
            raise
        torch.cuda.empty_cache()
        if not self.cpu_fallback:
            raise ProteinOutOfMemory(row, len(words), self.embedder.device)
        self.report(f"the GPU ran out of memory for a protein of {len(words):,} residues: embedding it on the CPU")
        if self.cpu_embedder is None:
            self.cpu_embedder = self._on_cpu()
        try:
            return self.cpu_embedder([words])
        except NonFiniteVectors as error:
            error.row = row
            raise

    def _on_cpu(self) -> Embedder:
        model = self.embedder.model
        with torch.device("meta"):
            cpu_model = type(model)(model.config)
        state = {name: tensor.to("cpu", torch.float32) for name, tensor in model.state_dict().items()}
        cpu_model.load_state_dict(state, assign=True)
        return Embedder(cpu_model.eval(), self.embedder.tokenizer, self.embedder.select, self.embedder.output_dtype)
