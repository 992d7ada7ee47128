"""Two machines simulated on one: two `torchrun --nnodes 2` agents meeting through the c10d rendezvous on
127.0.0.1, two processes each (gloo, CPU), running `hf-elmo train` and `hf-elmo embed`; then one agent killed with
its processes in the middle of a run, as a machine that goes down.

    python benchmarks/two_machines.py [--workdir DIR]

1. windows: 4 processes with batch 2 against one process with batch 8 (tiny preset, full softmax, no dropout, 4
   steps): the largest difference of the logged losses and of the final weights.
2. --stream: 4 processes, 4 steps: each reads its own shards; the run ends with its checkpoint.
3. embed: 4 processes against one, every line's vectors: the largest difference over the largest value.
4. a machine lost: a windows run saving every 5 steps; once its first checkpoint is in place the second agent and
   its processes get SIGKILL. The first agent's processes stop with one line each; the seconds they took, the last
   checkpoint loaded, and `--resume` on both agents continuing to step 10.

Prints each result; exits with status 1 if one is not as expected. Run by hand (minutes on two busy cores): it is
too slow for the test suite.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data/tinyshakespeare/input.txt"
MODEL = ROOT / "tests/fixtures/allennlp"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
HANG = 900
failures = []


def check(what: str, ok: bool, detail: str):
    print(f"{'ok ' if ok else 'BAD'} {what}: {detail}", flush=True)
    if not ok:
        failures.append(what)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_agents(arguments: list[str], logs: Path, name: str) -> list[subprocess.Popen]:
    """Two torchrun agents of one job, each in a session of its own (a machine: killed together)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        name,
        "--max-restarts",
        "0",
        "-m",
        "hf_elmo.commands",
        *arguments,
    ]
    agents = []
    for machine in range(2):
        log = open(logs / f"{name}-machine{machine}.log", "w")
        agents.append(subprocess.Popen(command, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(1)  # the first one hosts the rendezvous
    return agents


def run_agents(arguments, logs, name) -> list[int]:
    agents = start_agents(arguments, logs, name)
    return [agent.wait(timeout=HANG) for agent in agents]


def hf_elmo(arguments: list[str]):
    subprocess.run([sys.executable, "-m", "hf_elmo.commands", *arguments], env=ENV, check=True, capture_output=True)


def losses(run: Path, step: int) -> list[float]:
    state = json.loads((run / f"checkpoint-{step}/trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def train_arguments(work: Path, output: str, batch: int, *more: str) -> list[str]:
    return [
        "train",
        "--config",
        "tiny",
        "--train-files",
        str(work / "train.txt"),
        "--split",
        "pretokenizer",
        "--window",
        "22",
        "--min-count",
        "2",
        "--dropout",
        "0",
        "--num-softmax-samples",
        "0",
        "--logging-steps",
        "1",
        "--disable-tqdm",
        "--per-device-train-batch-size",
        str(batch),
        "--data-cache-dir",
        str(work / f"cache-{output}"),
        "--output-dir",
        str(work / output),
        *more,
    ]


def windows(work: Path, logs: Path):
    codes = run_agents(train_arguments(work, "windows-4", 2, "--max-steps", "4", "--save-steps", "4"), logs, "windows")
    check("windows: both agents", codes == [0, 0], f"exit statuses {codes}")
    hf_elmo(train_arguments(work, "windows-1", 8, "--max-steps", "4", "--save-steps", "4"))
    loss_gap = np.abs(np.array(losses(work / "windows-4", 4)) - np.array(losses(work / "windows-1", 4))).max()
    one, four = load_file(work / "windows-1/model.safetensors"), load_file(work / "windows-4/model.safetensors")
    weight_gap = max((one[k] - four[k]).abs().max().item() for k in one)
    check(
        "windows: 4 processes x batch 2 = 1 x batch 8",
        loss_gap <= 1e-5 and weight_gap <= 1e-5,
        f"losses within {loss_gap:.1e}, weights within {weight_gap:.1e}",
    )


def stream(work: Path, logs: Path):
    arguments = train_arguments(
        work,
        "stream-4",
        2,
        "--stream",
        "--window",
        "10",
        "--max-steps",
        "4",
        "--save-steps",
        "4",
        "--train-files",
        str(work / "shards"),
    )
    codes = run_agents(arguments, logs, "stream")
    saved = sorted(p.name for p in (work / "stream-4/checkpoint-4").glob("stream_state-*.safetensors"))
    check("--stream: 4 processes", codes == [0, 0] and len(saved) == 4, f"exit statuses {codes}, states {saved}")


def embed(work: Path, logs: Path):
    model = work / "model"
    hf_elmo(
        [
            "convert",
            "--options",
            str(MODEL / "options.json"),
            "--weights",
            str(MODEL / "lm_weights.hdf5"),
            "--output-dir",
            str(model),
        ]
    )
    common = ["embed", str(work / "embed.txt"), "--model", str(model), "--all", "--quiet", "--batch-size", "16"]
    codes = run_agents([*common[:2], str(work / "embed-4.hdf5"), *common[2:]], logs, "embed")
    hf_elmo([*common[:2], str(work / "embed-1.hdf5"), *common[2:]])
    lines = len((work / "embed.txt").read_text(encoding="utf-8").splitlines())
    with h5py.File(work / "embed-1.hdf5") as one, h5py.File(work / "embed-4.hdf5") as four:
        same_keys = sorted(one) == sorted(four)
        gap = max(np.abs(one[str(i)][...] - four[str(i)][...]).max(initial=0) for i in range(lines))
        scale = max(np.abs(one[str(i)][...]).max(initial=0) for i in range(lines))
    left = sorted(p.name for p in work.glob(".embed-4*"))
    check(
        "embed: 4 processes = 1",
        codes == [0, 0] and same_keys and gap <= 1e-5 * scale and not left,
        f"exit statuses {codes}, {lines} lines, largest difference {gap:.1e} of values up to {scale:.1f}, "
        f"parts left {left}",
    )


def descendants(pid: int) -> list[int]:
    """The processes started by `pid`, and by them, ..."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, pending = [], [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found.extend(below)
        pending.extend(below)
    return found


def machine_lost(work: Path, logs: Path):
    arguments = train_arguments(work, "lost", 2, "--max-steps", "100000", "--save-steps", "5")
    agents = start_agents(arguments, logs, "lost")
    deadline = time.monotonic() + HANG
    while not list((work / "lost").glob("checkpoint-*/trainer_state.json")):
        assert time.monotonic() < deadline and agents[0].poll() is None, "no checkpoint came"
        time.sleep(0.2)
    # torchrun starts its processes in sessions of their own: the machine's agent and its processes all go at once.
    for pid in [agents[1].pid, *descendants(agents[1].pid)]:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code = agents[0].wait(timeout=HANG)
    seconds = time.monotonic() - killed
    agents[1].wait()
    log = (logs / "lost-machine0.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    check(
        "a machine lost: the other stops",
        code != 0 and len(errors) == 2,
        f"agent exit status {code} after {seconds:.1f} s; its processes said {errors}",
    )
    checkpoints = sorted((p for p in (work / "lost").glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))
    last = checkpoints[-1]
    step = json.loads((last / "trainer_state.json").read_text())["global_step"]
    weights = load_file(last / "model.safetensors")
    check(
        "a machine lost: the last checkpoint intact",
        step == int(last.name.split("-")[1]) and len(weights) > 0,
        f"{last.name}: step {step}, {len(weights)} tensors",
    )
    resume = train_arguments(work, "lost", 2, "--resume", "--max-steps", str(step + 5))
    codes = run_agents(resume, logs, "resumed")
    done = json.loads((work / f"lost/checkpoint-{step + 5}/trainer_state.json").read_text())["global_step"]
    check(
        "a machine lost: --resume continues",
        codes == [0, 0] and done == step + 5,
        f"exit statuses {codes}, trained to step {done}",
    )


STEPS = {"windows": windows, "stream": stream, "embed": embed, "machine-lost": machine_lost}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", help="keep the runs and logs here (default: a temporary folder)")
    parser.add_argument("--only", nargs="+", choices=list(STEPS), default=list(STEPS), help="run only these")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.workdir or scratch)
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        text = CORPUS.read_text(encoding="utf-8").splitlines()
        (work / "train.txt").write_text("\n".join(text[:400]) + "\n", encoding="utf-8")
        (work / "embed.txt").write_text("\n".join(text[400:520]) + "\n", encoding="utf-8")
        (work / "shards").mkdir(exist_ok=True)
        for shard in range(4):
            part = text[600 + 100 * shard : 700 + 100 * shard]
            (work / "shards" / f"{shard}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
        for name in args.only:
            started = time.monotonic()
            STEPS[name](work, logs)
            print(f"    ({time.monotonic() - started:.0f} s; logs in {logs})", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
