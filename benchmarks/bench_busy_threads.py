"""The commands' thread counts on an idle and on a busy machine: `hf-elmo train` (tiny preset) and `hf-elmo embed`
with `--threads 1`, `--threads 2` and the default, each run in a process of its own, with 0 and then `--burners`
other CPU-bound processes running; the settings alternate within each round.

    python benchmarks/bench_busy_threads.py [--rounds 3] [--steps 30] [--lines 2000] [--burners 2]

Prints each run's seconds (the command only, not Python's start and imports) and the thread count it ran with, then
per workload and load the median of each setting and the default's time over the best setting's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data/tinyshakespeare/input.txt"
SETTINGS = ("1", "2", "default")


def command(workload: str, folder: Path, steps: int) -> list[str]:
    if workload == "train":
        return [
            "train",
            "--config",
            "tiny",
            "--train-files",
            str(folder / "train.txt"),
            "--per-device-train-batch-size",
            "8",
            "--max-steps",
            str(steps),
            "--save-steps",
            str(10 * steps),
            "--data-cache-dir",
            str(folder / "cache"),
            "--disable-tqdm",
            "--output-dir",
            str(folder / f"run-{time.monotonic_ns()}"),
        ]
    return ["embed", str(folder / "embed.txt"), str(folder / "out.hdf5"), "--model", str(folder / "model"), "--top"]


def child(arguments: list[str], threads: str):
    """Runs one command in this process and prints its seconds and thread count as JSON."""
    import torch

    from hf_elmo.commands.cli import main

    if threads != "default":
        arguments = [*arguments, "--threads", threads]
    start = time.perf_counter()
    code = main(arguments)
    seconds = time.perf_counter() - start
    print(json.dumps({"code": code, "seconds": seconds, "threads": torch.get_num_threads()}))


def run_child(workload: str, folder: Path, steps: int, threads: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    arguments = command(workload, folder, steps)
    if workload == "embed":
        arguments = [*arguments, "--force", "--quiet"]
    result = subprocess.run(
        [sys.executable, __file__, "--child", threads, "--", *arguments],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def prepare(folder: Path, lines: int):
    text = CORPUS.read_text(encoding="utf-8").splitlines()
    (folder / "train.txt").write_text("\n".join(text[:4000]) + "\n", encoding="utf-8")
    (folder / "embed.txt").write_text("\n".join(text[4000 : 4000 + lines]) + "\n", encoding="utf-8")
    # One training step gives the model embed uses, and fills the windows cache the timed runs read.
    arguments = [*command("train", folder, 1)]
    arguments[arguments.index("--output-dir") + 1] = str(folder / "model")
    subprocess.run([sys.executable, "-m", "hf_elmo.commands", *arguments], check=True, capture_output=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--workloads", nargs="+", default=["train", "embed"], choices=["train", "embed"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.arguments, args.child)
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        prepare(folder, args.lines)
        times = {}
        for burners in (0, args.burners):
            processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
            try:
                time.sleep(2 if burners else 0)
                for round_ in range(args.rounds):
                    order = SETTINGS[round_ % 3 :] + SETTINGS[: round_ % 3]
                    for workload in args.workloads:
                        for setting in order:
                            result = run_child(workload, folder, args.steps, setting)
                            times.setdefault((workload, burners, setting), []).append(result["seconds"])
                            print(
                                f"{workload} burners={burners} threads={setting} ran with {result['threads']}: "
                                f"{result['seconds']:.2f} s  (load {os.getloadavg()[0]:.1f})",
                                flush=True,
                            )
            finally:
                for process in processes:
                    process.kill()
                    process.wait()
        print("\n| workload | other CPU-bound processes | threads 1 | threads 2 | default | default / best |")
        print("| --- | --- | --- | --- | --- | --- |")
        for workload in args.workloads:
            for burners in (0, args.burners):
                medians = {s: statistics.median(times[(workload, burners, s)]) for s in SETTINGS}
                best = min(medians["1"], medians["2"])
                cells = " | ".join(f"{medians[s]:.2f} s" for s in SETTINGS)
                print(f"| {workload} | {burners} | {cells} | {medians['default'] / best:.2f} |")


if __name__ == "__main__":
    main()
