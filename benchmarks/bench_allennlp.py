"""Inference throughput of AllenNLP's ELMo beside `ElmoModel` on the same weights, on the CPU: words per second of
the biLM's layers for a batch of sentences (boundaries not counted), the tokenization excluded on both sides.

    python benchmarks/bench_allennlp.py --their-code ALLENNLP_V0_9_0_CHECKOUT --sizes small original \\
        --batch-size 32 --words 20 --threads 2 --rounds 3 --repeats 3

Per size, an original-format `options.json` + `weights.hdf5` pair with random weights (`bench_inference.random_model`
written by the functions `hf-elmo export` uses) is what both sides load. AllenNLP's files are imported from a
checkout of its v0.9.0 tag (`conversion/seqvec_reference_outputs.py` says which, and which of what they import are
stand-ins) and run unmodified: `_ElmoBiLm` (character ids from its own `ELMoCharacterMapper`), the module that
`Elmo` and `ElmoEmbedder` call, carrying its state from call to call as they do. hf-elmo: `ElmoModel` loaded from
the same pair (`load_original_elmo`) with its default paths, all layers (`output_hidden_states=True`).

Each side runs in a process of its own (no shared thread pools) with the same `--threads` (`torch.set_num_threads`
and `OMP_NUM_THREADS`), the two alternating for `--rounds` rounds; a process loads the model, makes one call (the
warm-up, whose layers round 0 keeps for the check), then times `--repeats` calls under `torch.inference_mode()`.
Before any rate is printed, the two sides' layers from that first call must agree within 1e-5 of each layer's
largest value (float32 rounding over a few hundred products per value, docs/testing.md); a larger difference stops
the run. Prints the machine, each process's median words/s of wall time and of its own CPU time, and per size the
medians over all calls and their ratio.
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
SIDES = ("allennlp", "hf-elmo")


def write_original_pair(size: str, folder: Path) -> tuple[Path, Path]:
    """A `size` preset with random weights as `options.json` + `weights.hdf5` in `folder`."""
    import h5py
    import torch

    from hf_elmo import ElmoConfig
    from hf_elmo.convert.original_format import hdf5_datasets_from_state_dict, options_from_config

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_inference import random_model

    model = random_model(ElmoConfig.from_preset(size), "cpu", torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    options, weights = folder / "options.json", folder / "weights.hdf5"
    options.write_text(json.dumps(options_from_config(model.config), indent=2) + "\n", encoding="utf-8")
    with h5py.File(weights, "w") as output:
        for name, array in hdf5_datasets_from_state_dict(model.state_dict(), model.config).items():
            output.create_dataset(name, data=array)
    return options, weights


def child(args) -> dict:
    """Loads one side, keeps its first call's layers in `args.layers_file` (if given), times `args.repeats` calls."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_inference import random_sentences

    sentences = random_sentences(args.batch_size, args.words)
    if args.side == "allennlp":
        sys.path.insert(0, str(ROOT / "conversion"))
        from seqvec_reference_outputs import load_their_embedder

        load_their_embedder(Path(args.their_code).resolve())  # imports their modules, batch_to_ids among them
        their_elmo = sys.modules["allennlp.modules.elmo"]
        bilm = their_elmo._ElmoBiLm(args.options, args.weights)
        character_ids = their_elmo.batch_to_ids(sentences)

        def call():
            return bilm(character_ids)["activations"]

    else:
        from hf_elmo import ElmoTokenizer
        from hf_elmo.convert.original_format import load_original_elmo

        model = load_original_elmo(args.options, args.weights)
        batch = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")

        def call():
            return model(**batch, output_hidden_states=True).hidden_states

    with torch.inference_mode():
        layers = call()
        if args.layers_file:
            np.savez(args.layers_file, *(layer.float().numpy() for layer in layers))
        seconds, cpu_seconds = [], []
        for _ in range(args.repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            call()
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds}


def check_same_layers(files: dict[str, Path], size: str):
    """Stops the run unless both sides' layers agree within 1e-5 of each layer's largest value."""
    import numpy as np

    theirs, ours = (np.load(files[side]) for side in SIDES)
    if len(theirs.files) != len(ours.files):
        sys.exit(f"{size}: AllenNLP gives {len(theirs.files)} layers, hf-elmo {len(ours.files)}")
    for index, name in enumerate(theirs.files):
        their_layer, our_layer = theirs[name], ours[name]
        if their_layer.shape != our_layer.shape:
            sys.exit(f"{size}, layer {index}: AllenNLP's shape {their_layer.shape}, hf-elmo's {our_layer.shape}")
        difference = float(np.abs(their_layer - our_layer).max())
        bound = 1e-5 * float(np.abs(their_layer).max())
        print(f"{size}, layer {index}: largest difference {difference:.2e} (bound {bound:.2e})")
        if not difference <= bound:
            sys.exit(f"{size}, layer {index}: the two sides differ by {difference:.3g}, more than {bound:.3g}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--their-code", required=True, help="checkout of allenai/allennlp at v0.9.0")
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], choices=["small", "medium", "original"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--words", type=int, default=20, help="words per sentence")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per process, after one warm-up call")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/bench-allennlp-models"))
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--layers-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(child(args)))
        return
    if not (Path(args.their_code) / "allennlp" / "modules" / "elmo.py").is_file():
        sys.exit(f"{args.their_code}: not a checkout of allenai/allennlp (no allennlp/modules/elmo.py)")
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_inference import machine_description

    torch.set_num_threads(args.threads)
    print(machine_description("cpu"))
    print(f"batch {args.batch_size} x {args.words} words, float32, {args.threads} threads a process")
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    words = args.batch_size * args.words
    for size in args.sizes:
        options, weights = write_original_pair(size, args.model_dir / size)
        layers_files = {side: args.model_dir / size / f"layers-{side}.npz" for side in SIDES}
        rates = {side: {"wall": [], "cpu": []} for side in SIDES}
        for round_number in range(args.rounds):
            lines = []
            for side in SIDES if round_number % 2 == 0 else SIDES[::-1]:
                command = [sys.executable, __file__, *sys.argv[1:], "--side", side]
                command += ["--options", str(options), "--weights", str(weights)]
                if round_number == 0:
                    command += ["--layers-file", str(layers_files[side])]
                run = subprocess.run(command, capture_output=True, text=True, env=environment)
                if run.returncode != 0:
                    sys.exit(f"{size}, {side}: the timing process failed:\n{run.stderr.strip()}")
                result = json.loads(run.stdout.strip().splitlines()[-1])
                wall = [words / seconds for seconds in result["seconds"]]
                cpu = [words / seconds for seconds in result["cpu_seconds"]]
                rates[side]["wall"] += wall
                rates[side]["cpu"] += cpu
                lines.append(
                    f"{size} round {round_number} {side:8s}: {statistics.median(wall):,.0f} words/s "
                    f"({statistics.median(cpu):,.0f} per CPU second), load average {os.getloadavg()[0]:.1f}"
                )
            if round_number == 0:
                check_same_layers(layers_files, size)
            print("\n".join(lines), flush=True)
        for clock, what in (("wall", "words/s"), ("cpu", "words per CPU second")):
            medians = {side: statistics.median(rates[side][clock]) for side in SIDES}
            ranges = {side: f"{min(rates[side][clock]):,.0f}-{max(rates[side][clock]):,.0f}" for side in SIDES}
            print(
                f"{size} median {what}: AllenNLP {medians['allennlp']:,.0f} ({ranges['allennlp']}), hf-elmo "
                f"{medians['hf-elmo']:,.0f} ({ranges['hf-elmo']}); hf-elmo / AllenNLP = "
                f"{medians['hf-elmo'] / medians['allennlp']:.2f}x"
            )


if __name__ == "__main__":
    main()
