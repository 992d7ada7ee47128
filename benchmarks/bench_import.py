"""Start-up time: `import hf_elmo` beside `from transformers import AutoModel`, and the `hf-elmo` command's help.

    python benchmarks/bench_import.py --runs 7
    python benchmarks/bench_import.py --runs 3 --with-train-help   # adds `hf-elmo train --help` (imports Trainer)

Each case is a fresh interpreter timed from here (wall clock, start to exit), the cases taking turns run after run so
that a change of load hits all of them alike. Prints the machine, then per case the median and range of its runs,
and the median of `import hf_elmo` over that of `from transformers import AutoModel`.
"""

import argparse
import datetime
import importlib.metadata
import os
import shutil
import statistics
import subprocess
import sys
import time

VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def command_cases(with_train_help: bool) -> dict[str, list[str]]:
    python = [sys.executable, "-c"]
    hf_elmo = shutil.which("hf-elmo") or os.path.join(os.path.dirname(sys.executable), "hf-elmo")
    cases = {
        "python -c pass": [*python, "pass"],
        "from transformers import AutoModel": [*python, "from transformers import AutoModel"],
        "import hf_elmo": [*python, "import hf_elmo"],
        "import hf_elmo; from transformers import AutoModel": [
            *python,
            "import hf_elmo; from transformers import AutoModel",
        ],
        "hf-elmo --help": [hf_elmo, "--help"],
    }
    if with_train_help:
        cases["hf-elmo train --help"] = [hf_elmo, "train", "--help"]
    return cases


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        flags = set(next(line for line in info if line.startswith(("flags", "Features"))).split())
        cpu += f" ({' '.join(flag for flag in VECTOR_FLAGS if flag in flags) or 'no AVX2'})"
    except (OSError, StopIteration):
        pass
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("torch", "transformers"))
    load = f", load average {os.getloadavg()[0]:.1f} at start" if hasattr(os, "getloadavg") else ""
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{cpu}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, {versions}{load}; {now:%Y-%m-%d %H:%M} UTC"


def seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each case (alternating)")
    parser.add_argument("--with-train-help", action="store_true", help="also time `hf-elmo train --help`")
    args = parser.parse_args()
    cases = command_cases(args.with_train_help)
    print(machine())
    for command in cases.values():  # once each first: the files are in the page cache for every timed run
        seconds(command)
    times = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, command in cases.items():
            times[name].append(seconds(command))
    for name, runs in times.items():
        print(f"{name:55s} median {statistics.median(runs):6.2f} s  ({min(runs):.2f}-{max(runs):.2f} s)")
    ratio = statistics.median(times["import hf_elmo"]) / statistics.median(times["from transformers import AutoModel"])
    print(f"import hf_elmo / from transformers import AutoModel: {ratio:.2f}")


if __name__ == "__main__":
    main()
