"""Per-residue protein embedding, SeqVec's way, against AllenNLP 0.9's `ElmoEmbedder` on the same weights: residues
per second of SeqVec's per-residue vectors (the 3 layers summed) for random proteins of 50 to 1,000 residues.

    python benchmarks/bench_protein.py --their-code ALLENNLP_V0_9_0_CHECKOUT --residues 3000 --rounds 3
    python benchmarks/bench_protein.py --their-code ALLENNLP_V0_9_0_CHECKOUT --device cuda --residues 100000

The model is SeqVec-shaped (SeqVec's `options.json`, random weights from `tests/seqvec_shaped.py`), or the real one
with `--options`/`--weights`. Each implementation runs in a process of its own (no shared thread pools), the two
alternating for `--rounds` rounds; a round embeds all proteins once after a warm-up batch, timed from the first
batch to the last vector summed (the model's loading excluded):

* AllenNLP: SeqVec's `get_embeddings` batching (proteins shortest first, a batch closed once it holds more than
  `--residue-budget` residues), `embed_batch([list(seq) ...])`, `.sum(axis=0)` per protein;
* hf-elmo: `hf-elmo embed --fasta --sum`'s computation (`features.embed_proteins.residue_batches`: longest first,
  padded residues within the budget; `Embedder` with the `sum` selector), without writing the file.

`--one-at-a-time`: each protein alone, as bio_embeddings' `SeqVecEmbedder.embed(sequence)` does,
`embed_sentence(list(seq))` of AllenNLP's `ElmoEmbedder` against the same call of `hf_elmo.compat.allennlp`'s
(both carrying the LSTM state from call to call).

Prints the machine, each round's residues per second of wall time and per second of the process's CPU time (on a
machine shared with other work, where wall time measures the others too), and the ratios of the medians.

`--long 5000 15000 35000` measures instead the memory of long proteins (docs/proteins.md's bound per residue): the
real command `hf-elmo embed FASTA residues.h5 --model DIR --fasta --sum --per-protein proteins.h5 --device cpu` on
one random protein of each length (the 20 standard residues and 1% X, seeded), each in a child process, and on a
protein of `BASELINE_RESIDUES` (the model and the code); prints each run's peak resident memory, wall and CPU time,
and the peak's growth per residue from the baseline (beside the documented bound) and from the next shorter protein:

    python benchmarks/bench_protein.py --long 5000 15000 35000 --threads 1
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDARD_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
BASELINE_RESIDUES = 10


def proteins(count_residues: int, seed: int) -> list[str]:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from seqvec_shaped import random_protein

    generator = np.random.default_rng(seed)
    sequences, total = [], 0
    while total < count_residues:
        sequences.append(random_protein(int(generator.integers(50, 1001)), generator))
        total += len(sequences[-1])
    return sequences


def seqvec_batches(sequences: list[str], budget: int) -> list[list[str]]:
    """SeqVec's `get_embeddings` grouping: shortest first; a batch ends once it holds more than `budget` residues, at
    a protein longer than half the budget, or at the end."""
    batches, batch, residues = [], [], 0
    ordered = sorted(sequences, key=len)
    for index, sequence in enumerate(ordered):
        batch.append(sequence)
        residues += len(sequence)
        if residues > budget or len(sequence) > budget / 2 or index == len(ordered) - 1:
            batches.append(batch)
            batch, residues = [], 0
    return batches


def child(args) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    sequences = proteins(args.residues, args.seed)
    if args.one_at_a_time:
        cuda_device = 0 if args.device == "cuda" else -1
        if args.impl == "allennlp":
            sys.path.insert(0, str(ROOT / "conversion"))
            from seqvec_reference_outputs import load_their_embedder

            embedder = load_their_embedder(Path(args.their_code).resolve())(args.options, args.weights, cuda_device)
        else:
            from hf_elmo.compat.allennlp import ElmoEmbedder

            embedder = ElmoEmbedder(args.options, args.weights, cuda_device)
        batches = [[sequence] for sequence in sequences]

        def embed(batch):
            with torch.no_grad():
                return [embedder.embed_sentence(list(batch[0])).sum(axis=0)]

    elif args.impl == "allennlp":
        sys.path.insert(0, str(ROOT / "conversion"))
        from seqvec_reference_outputs import load_their_embedder

        cuda_device = 0 if args.device == "cuda" else -1
        embedder = load_their_embedder(Path(args.their_code).resolve())(args.options, args.weights, cuda_device)
        batches = seqvec_batches(sequences, args.residue_budget)

        def embed(batch):
            with torch.no_grad():
                return [e.sum(axis=0) for e in embedder.embed_batch([list(s) for s in batch])]

    else:
        from hf_elmo import ElmoTokenizer
        from hf_elmo.convert.original_format import load_original_elmo
        from hf_elmo.features.embed import Embedder, LayerSelector
        from hf_elmo.features.embed_proteins import residue_batches
        from hf_elmo.io.fasta import FastaRecord

        model = load_original_elmo(args.options, args.weights).to(args.device).requires_grad_(False)  # as the command
        embedder = Embedder(model, ElmoTokenizer(), LayerSelector("sum", model.config.num_layers))
        records = [FastaRecord(str(i), str(i), s, i) for i, s in enumerate(sequences)]
        batches = [[r.sequence for r in batch] for batch in residue_batches(records, args.residue_budget)]

        def embed(batch):
            vectors = embedder([list(s) for s in batch])
            return np.split(vectors, np.cumsum([len(s) for s in batch])[:-1], axis=0)

    embed([sequences[0][:50]])  # warm-up: compiled loops, allocator
    start, cpu_start = time.perf_counter(), time.process_time()
    count = 0
    for batch in batches:
        count += sum(len(vectors) for vectors in embed(batch))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {"residues": count, "seconds": seconds, "cpu_seconds": cpu_seconds, "proteins": len(sequences)}


def long_protein(length: int, seed: int) -> str:
    """`length` residues drawn uniformly from the 20 standard ones, 1% of them then replaced by X."""
    import numpy as np

    generator = np.random.default_rng(seed)
    residues = generator.choice(list(STANDARD_RESIDUES), size=length)
    residues[generator.choice(length, size=length // 100, replace=False)] = "X"
    return "".join(residues)


def run_embed(command: list[str], environment: dict) -> dict:
    """Runs `command` to its end; its peak resident memory, wall and CPU seconds (its own `wait4` record)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit status {process.returncode}")
    return {"peak": usage.ru_maxrss * 1024, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime}


def long_proteins(args):
    """`--long`: the module docstring's last paragraph."""
    sys.path.insert(0, str(ROOT / "tests"))
    from seqvec_shaped import memory_bound_per_residue, write_seqvec_shaped

    folder = Path(args.model_dir)
    model = folder / "hf"
    if args.options is None:
        args.options, args.weights = map(str, write_seqvec_shaped(folder / "original"))
    options = json.loads(Path(args.options).read_text())
    hf_elmo = [sys.executable, "-m", "hf_elmo.commands.cli"]
    convert = ["convert", "--options", args.options, "--weights", args.weights, "--output-dir", str(model)]
    subprocess.run([*hf_elmo, *convert, "--force"], check=True, capture_output=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from bench_inference import machine_description

    torch.set_num_threads(args.threads)
    print(machine_description("cpu"), flush=True)
    bound = memory_bound_per_residue(options)
    shape = f"{options['lstm']['dim']} cells, projections of {options['lstm']['projection_dim']}"
    print(f"model: {args.options} ({shape}); documented bound {bound:,} bytes per residue", flush=True)
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    peaks = {}
    for length in [BASELINE_RESIDUES, *sorted(args.long)]:
        fasta = folder / f"protein_{length}.fasta"
        sequence = long_protein(length, args.seed + length)
        fasta.write_text(f">long_{length} random protein of {length} residues\n{sequence}\n")
        embed = ["embed", str(fasta), str(folder / "residues.h5"), "--model", str(model), "--fasta", "--sum"]
        embed += ["--per-protein", str(folder / "proteins.h5"), "--device", "cpu", "--threads", str(args.threads)]
        result = run_embed([*hf_elmo, *embed, "--quiet", "--force"], environment)
        line = (
            f"{length:>7,} residues: peak RSS {result['peak'] / 2**20:,.0f} MiB, {result['seconds']:,.1f} s wall, "
            f"{result['cpu_seconds']:,.1f} s CPU"
        )
        if length != BASELINE_RESIDUES:
            per_residue = (result["peak"] - peaks[BASELINE_RESIDUES]) / (length - BASELINE_RESIDUES)
            line += f"; beyond the baseline {per_residue:,.0f} bytes per residue (bound {bound:,})"
            shorter = max(peaks)
            # The baseline's peak is the model's loading, which a protein's first MiB fit under.
            if shorter != BASELINE_RESIDUES:
                per_residue = (result["peak"] - peaks[shorter]) / (length - shorter)
                line += f", beyond {shorter:,} residues' {per_residue:,.0f}"
        print(line, flush=True)
        peaks[length] = result["peak"]
    (folder / "residues.h5").unlink()
    (folder / "proteins.h5").unlink()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--their-code", help="checkout of allenai/allennlp at v0.9.0 (required without --long)")
    parser.add_argument("--options", help="options.json (default: a SeqVec-shaped model written to --model-dir)")
    parser.add_argument("--weights", help="weights.hdf5, with --options")
    parser.add_argument("--model-dir", default="/tmp/bench-protein-model")
    parser.add_argument("--residues", type=int, default=3000, help="residues embedded per round (about)")
    parser.add_argument("--residue-budget", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one-at-a-time", action="store_true", help="each protein alone: embed_sentence(list(seq))")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both embed (float32)")
    parser.add_argument(
        "--long", type=int, nargs="+", metavar="RESIDUES", help="peak memory of one protein of each length instead"
    )
    parser.add_argument("--impl", choices=["allennlp", "hf-elmo"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.long:
        long_proteins(args)
        return
    if args.their_code is None:
        parser.error("--their-code is required (or --long)")
    if args.impl:
        print(json.dumps(child(args)))
        return
    if args.options is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from seqvec_shaped import write_seqvec_shaped

        args.options, args.weights = map(str, write_seqvec_shaped(args.model_dir))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from bench_inference import machine_description

    torch.set_num_threads(args.threads)
    print(machine_description(args.device))
    rates = {"allennlp": [], "hf-elmo": []}
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for round_number in range(args.rounds):
        for impl in ("allennlp", "hf-elmo") if round_number % 2 == 0 else ("hf-elmo", "allennlp"):
            command = [sys.executable, __file__, *sys.argv[1:], "--impl", impl, "--options", args.options]
            command += ["--weights", args.weights]
            run = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
            result = json.loads(run.stdout.strip().splitlines()[-1])
            rate, cpu_rate = (result["residues"] / result[key] for key in ("seconds", "cpu_seconds"))
            rates[impl].append((rate, cpu_rate))
            print(
                f"round {round_number} {impl:8s}: {result['proteins']} proteins, {result['residues']} residues in "
                f"{result['seconds']:.1f} s ({result['cpu_seconds']:.1f} s of CPU) = {rate:.1f} residues/s "
                f"({cpu_rate:.1f} per CPU second)",
                flush=True,
            )
    for index, what in enumerate(("residues/s", "residues per CPU second")):
        medians = {impl: statistics.median(values[index] for values in rates[impl]) for impl in rates}
        print(
            f"median {what}: AllenNLP {medians['allennlp']:.1f}, hf-elmo {medians['hf-elmo']:.1f}; hf-elmo / "
            f"AllenNLP = {medians['hf-elmo'] / medians['allennlp']:.2f}x"
        )


if __name__ == "__main__":
    main()
