"""`--threads` on every command that computes, and the default thread count: the cores this process may use less
those other processes keep busy, at least one, `OMP_NUM_THREADS` kept."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_elmo.commands import threads as thread_choice
from hf_elmo.commands.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = ROOT / "data/tinyshakespeare/input.txt"


@pytest.fixture(autouse=True)
def _threads_kept():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("threads") / "text.txt"
    path.write_text("\n".join(SHAKESPEARE.read_text(encoding="utf-8").splitlines()[:120]) + "\n", encoding="utf-8")
    return path


def command_line(command, folder: Path, text: Path, converted_dirs, checkpoint_dir) -> list[str]:
    if command == "embed":
        return ["embed", str(text), str(folder / "out.hdf5"), "--model", str(converted_dirs["allennlp"]), "--top"]
    if command == "perplexity":
        return ["perplexity", "--model", str(checkpoint_dir), str(text)]
    if command == "warm-state":
        model = shutil.copytree(converted_dirs["allennlp"], folder / "model")
        return ["warm-state", "--model", str(model), str(text), "--sentences", "20", "--in-place"]
    return [
        "train",
        "--config",
        "tiny",
        "--train-files",
        str(text),
        "--max-steps",
        "1",
        "--per-device-train-batch-size",
        "4",
        "--num-softmax-samples",
        "0",
        "--disable-tqdm",
        "--output-dir",
        str(folder / "run"),
    ]


COMMANDS = ["embed", "perplexity", "warm-state", "train"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_computing_command_runs_with_the_threads_it_is_given(
    command, text, converted_dirs, checkpoint_dir, tmp_path
):
    for threads in (2, 1):
        folder = tmp_path / str(threads)
        folder.mkdir()
        torch.set_num_threads(3)
        assert (
            cli_main([*command_line(command, folder, text, converted_dirs, checkpoint_dir), "--threads", str(threads)])
            == 0
        )
        assert torch.get_num_threads() == threads


@pytest.mark.parametrize("threads", ["0", "-2"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_thread_count_below_one_is_one_line(command, threads, text, converted_dirs, checkpoint_dir, tmp_path, capsys):
    assert cli_main([*command_line(command, tmp_path, text, converted_dirs, checkpoint_dir), "--threads", threads]) == 2
    error = capsys.readouterr().err
    assert f"threads must be a whole number >= 1, got {threads}" in error and error.count("\n") == 1, error
    assert not (tmp_path / "out.hdf5").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "usable, busy, omp, expected",
    [(2, 0, None, 2), (2, 1, None, 1), (2, 2, None, 1), (2, 14, None, 1), (8, 3, None, 5), (2, 2, "2", 2)],
)
def test_the_default_is_the_cores_left_free_at_least_one(usable, busy, omp, expected, monkeypatch):
    monkeypatch.setattr(thread_choice, "usable_cores", lambda: usable)
    monkeypatch.setattr(thread_choice, "busy_cores", lambda: busy)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert thread_choice.default_threads() == expected


def test_busy_cores_counts_other_processes_running_now():
    """Two processes that never sleep are counted at once, before the load average has seen them."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert all(burner.poll() is None for burner in burners)
        assert any(thread_choice.busy_cores() >= 2 for _ in range(50))  # a sample may catch one descheduled
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def test_usable_cores_follow_the_affinity(monkeypatch):
    monkeypatch.setattr(thread_choice.os, "sched_getaffinity", lambda pid: {0})
    assert thread_choice.usable_cores() == 1
