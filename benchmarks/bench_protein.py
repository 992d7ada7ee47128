"""Per-residue protein embedding, SeqVec's way, against AllenNLP 0.9's `ElmoEmbedder` on the same weights: residues
per second of SeqVec's per-residue vectors (the 3 layers summed) for random proteins of 50 to 1,000 residues.

    python benchmarks/bench_protein.py --their-code ALLENNLP_V0_9_0_CHECKOUT --residues 3000 --rounds 3

The model is SeqVec-shaped (SeqVec's `options.json`, random weights from `tests/seqvec_shaped.py`), or the real one
with `--options`/`--weights`. Each implementation runs in a process of its own (no shared thread pools), the two
alternating for `--rounds` rounds; a round embeds all proteins once after a warm-up batch, timed from the first
batch to the last vector summed (the model's loading excluded):

* AllenNLP: SeqVec's `get_embeddings` batching (proteins shortest first, a batch closed once it holds more than
  `--residue-budget` residues), `embed_batch([list(seq) ...])`, `.sum(axis=0)` per protein;
* hf-elmo: `hf-elmo embed --fasta --sum`'s computation (`features.embed_proteins.residue_batches`: longest first,
  padded residues within the budget; `Embedder` with the `sum` selector), without writing the file.

Prints the machine, each round's residues per second of wall time and per second of the process's CPU time (on a
machine shared with other work, where wall time measures the others too), and the ratios of the medians.
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
    if args.impl == "allennlp":
        sys.path.insert(0, str(ROOT / "conversion"))
        from seqvec_reference_outputs import load_their_embedder

        embedder = load_their_embedder(Path(args.their_code).resolve())(args.options, args.weights, cuda_device=-1)
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

        model = load_original_elmo(args.options, args.weights)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--their-code", required=True, help="checkout of allenai/allennlp at v0.9.0")
    parser.add_argument("--options", help="options.json (default: a SeqVec-shaped model written to --model-dir)")
    parser.add_argument("--weights", help="weights.hdf5, with --options")
    parser.add_argument("--model-dir", default="/tmp/bench-protein-model")
    parser.add_argument("--residues", type=int, default=3000, help="residues embedded per round (about)")
    parser.add_argument("--residue-budget", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--impl", choices=["allennlp", "hf-elmo"], help=argparse.SUPPRESS)
    args = parser.parse_args()
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
    print(machine_description("cpu"))
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
