"""onnxruntime against the PyTorch CPU path, with random weights: words per second (boundaries not counted).

    python benchmarks/bench_onnx.py --sizes small original --batch-sizes 1 32 --words 20 --threads 2
    python benchmarks/bench_onnx.py --threads 1 --clock cpu   # a busy machine: each process's processor time
    python benchmarks/bench_onnx.py --sizes tiny --batch-sizes 2 --words 3 --repeats 1 --warmup 0   # a quick check

Each size is saved with random weights, exported by `hf-elmo export --format onnx` (`convert.to_onnx.export_onnx`) in
float32 and with `--quantize int8`. Each path runs in a process of its own, so that no path's thread pool (idle
threads spinning) slows another: the processes take turns, one timed call each, with a pause between turns so that
the last one's threads have gone to sleep, and load changes hit all of them alike. onnxruntime runs with its
default session options (intra-op threads spinning while a call waits for work) and, in another process, with
spinning off (`session.intra_op.allow_spinning=0`). Prints the machine, words/s and seconds per batch (median of
`--repeats`), then per layer the cosine of each onnxruntime path's vectors to PyTorch's over the real positions
(mean and minimum) and their largest absolute difference.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_inference import CLOCKS, machine_description, median, random_model, random_sentences

PATHS = {  # name: (graph folder, allow_spinning) or None for PyTorch
    "pytorch": None,
    "onnxruntime": ("onnx", "1"),
    "onnxruntime, no spinning": ("onnx", "0"),
    "onnxruntime int8": ("int8", "0"),
}
# Seconds between turns: the threads of the process that just ran stop spinning and sleep.
PAUSE = 0.3


def worker(args):
    """One path in its own process: reads `run B` (prints the seconds of one call on batch size B) or `save B FILE`
    (writes the layers of batch size B) from stdin, one command a line."""
    import torch

    from hf_elmo import ElmoModel, ElmoTokenizer

    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    batches = {}
    for size in args.batch_sizes:
        encoded = ElmoTokenizer()(
            random_sentences(size, args.words), is_split_into_words=True, padding=True, return_tensors="np"
        )
        batches[size] = {name: encoded[name] for name in ("input_ids", "attention_mask")}
    if PATHS[args.worker] is None:
        model = ElmoModel.from_pretrained(folder / "model").eval()

        def layers(feed):
            with torch.inference_mode():
                inputs = {name: torch.from_numpy(value) for name, value in feed.items()}
                return torch.stack(model(**inputs, output_hidden_states=True).hidden_states).numpy()

    else:
        import onnxruntime as ort

        graph, spinning = PATHS[args.worker]
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        session = ort.InferenceSession(str(folder / graph / "model.onnx"), options, providers=["CPUExecutionProvider"])

        def layers(feed):
            return session.run(["hidden_states"], feed)[0]

    now = CLOCKS[args.clock]
    print("ready", flush=True)
    for line in sys.stdin:
        command, size, *rest = line.split()
        if command == "run":
            start = now()
            layers(batches[int(size)])
            print(now() - start, flush=True)
        else:
            np.save(rest[0], layers(batches[int(size)]))
            print("saved", flush=True)


def layer_agreement(reference: np.ndarray, other: np.ndarray, real: np.ndarray) -> list[tuple[float, float, float]]:
    """Per layer of `(L + 1, B, T, 2P)` outputs: mean and minimum cosine over the real positions, max abs diff."""
    result = []
    for want, got in zip(reference, other):
        want, got = want[real].astype(np.float64), got[real].astype(np.float64)
        cosine = (want * got).sum(-1) / (np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1))
        result.append((float(cosine.mean()), float(cosine.min()), float(np.abs(want - got).max())))
    return result


def ask(process, line: str) -> str:
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = ["tiny", "small", "medium", "original"]
    parser.add_argument("--sizes", nargs="+", default=["small", "original"], choices=sizes)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--words", type=int, default=20, help="words per sentence")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's and onnxruntime's intra-op threads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="cpu: each worker's processor time, with --threads 1 a stable estimate on a busy machine",
    )
    parser.add_argument("--worker", choices=list(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    import onnxruntime as ort
    import torch

    from hf_elmo import ElmoConfig, ElmoTokenizer
    from hf_elmo.convert.to_onnx import export_onnx

    torch.set_num_threads(args.threads)
    print(f"machine: {machine_description('cpu')}, onnxruntime {ort.__version__}", flush=True)
    print(
        f"{args.words} words per sentence, {args.threads} threads, each path in its own process, {args.clock} clock, "
        f"median of {args.repeats} after {args.warmup} warm-up"
    )
    print(f"{'size':<10}{'batch':>6}  {'path':<26}{'words/s':>10}{'s/batch':>10}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            random_model(ElmoConfig.from_preset(size), "cpu", torch.float32).save_pretrained(folder / "model")
            export_onnx(folder / "model", folder / "onnx")
            if "onnxruntime int8" in args.paths:
                export_onnx(folder / "model", folder / "int8", quantize="int8")
            command = [sys.executable, __file__, "--folder", str(folder), "--threads", str(args.threads)]
            command += ["--clock", args.clock]
            command += ["--words", str(args.words), "--batch-sizes", *map(str, args.batch_sizes)]
            workers = {
                name: subprocess.Popen(
                    [*command, "--worker", name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                for name in args.paths
            }
            for process in workers.values():
                assert process.stdout.readline().strip() == "ready"
            for batch_size in args.batch_sizes:
                times = {name: [] for name in workers}
                for i in range(args.warmup + args.repeats):
                    for name, process in workers.items():
                        time.sleep(PAUSE)
                        seconds = float(ask(process, f"run {batch_size}"))
                        if i >= args.warmup:
                            times[name].append(seconds)
                for name, seconds in times.items():
                    words_per_second = batch_size * args.words / median(seconds)
                    print(
                        f"{size:<10}{batch_size:>6}  {name:<26}{words_per_second:>10,.0f}{median(seconds):>10.3f}",
                        flush=True,
                    )
                layers = {}
                for name, process in workers.items():
                    assert ask(process, f"save {batch_size} {folder / 'layers.npy'}") == "saved"
                    layers[name] = np.load(folder / "layers.npy")
                real = ElmoTokenizer()(
                    random_sentences(batch_size, args.words), is_split_into_words=True, padding=True
                )["attention_mask"]
                real = np.asarray(real, dtype=bool)
                for name in workers:
                    if name == "pytorch" or "pytorch" not in layers:
                        continue
                    for layer, (mean, low, diff) in enumerate(layer_agreement(layers["pytorch"], layers[name], real)):
                        print(
                            f"{'':<18}{name}, layer {layer}: cosine to PyTorch mean {mean:.5f}, min {low:.5f}, "
                            f"max abs diff {diff:.3g}"
                        )
            for process in workers.values():
                process.stdin.close()
                process.wait()


if __name__ == "__main__":
    main()
