"""Several processes (torchrun, accelerate launch, or the variables set by hand): the launcher's variables checked
before any work, the joining bounded by `--rendezvous-timeout`, SIGINT and SIGTERM stopping a process that waits for
the others, a process whose peer stops leaving nothing behind, and the commands of one process refusing a launch of
several."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as distributed
from conftest import FIXTURES

from hf_elmo import ElmoForBiLM
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.training.trainer import last_complete_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = ROOT / "data/tinyshakespeare/input.txt"
HANG = 300  # seconds only a hang reaches: every wait below ends at an event


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launch-corpus")
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()[:200]
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "in.txt").write_text("The cat sat .\nA dog\n\nThe cat sat .\n", encoding="utf-8")
    (folder / "in.fasta").write_text(">P1\nMKVL\n>P2\nGAT\n", encoding="utf-8")
    return folder


def embed_arguments(corpus, model_dir, output):
    return ["embed", str(corpus / "in.txt"), str(output), "--model", str(model_dir), "--top", "--quiet"]


def train_arguments(corpus, output):
    return [
        "train",
        "--config",
        "tiny",
        "--train-files",
        str(corpus / "train.txt"),
        "--max-steps",
        "2",
        "--per-device-train-batch-size",
        "4",
        "--num-softmax-samples",
        "0",
        "--disable-tqdm",
        "--output-dir",
        str(output),
    ]


def command_arguments(command, corpus, converted_dirs, tmp_path):
    if command == "embed":
        return embed_arguments(corpus, converted_dirs["allennlp"], tmp_path / "out.hdf5")
    return train_arguments(corpus, tmp_path / "run")


WRONG_VARIABLES = [
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0': expected a whole number >= 1"),
    ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1': expected a whole number >= 1"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': expected a whole number >= 1"),
    ({"WORLD_SIZE": "1", "RANK": "1"}, "RANK=1: expected 0 to WORLD_SIZE - 1 = 0"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2: expected 0 to WORLD_SIZE - 1 = 1"),
    ({"RANK": "-1"}, "RANK='-1': expected a whole number >= 0"),
    ({"WORLD_SIZE": "2"}, "RANK is not set: WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "29500"}, "MASTER_ADDR=None: expected the host"),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
    (
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
        "MASTER_PORT=70000: expected a port",
    ),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "x"}, "MASTER_PORT='x': expected a whole"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1': expected a whole number >= 0"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "1"}, "LOCAL_RANK=1: expected 0 to 0 (RANK=0)"),
    ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2: expected 0 to 1"),
]
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("command", ["embed", "train"])
@pytest.mark.parametrize("variables, message", WRONG_VARIABLES, ids=[str(v) for v, _ in WRONG_VARIABLES])
def test_wrong_launch_variables_are_one_line_before_any_work(
    command, variables, message, corpus, converted_dirs, tmp_path, monkeypatch, capsys
):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert cli_main(command_arguments(command, corpus, converted_dirs, tmp_path)) == 2
    error = capsys.readouterr().err
    assert f"error: {message}" in error and error.count("\n") == 1, error
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def one_process_arguments(command, corpus, converted_dirs, checkpoint_dir, output):
    """A complete command line of a command that computes in one process, writing (if it writes) to `output`."""
    model, text, original = str(converted_dirs["allennlp"]), str(corpus / "in.txt"), FIXTURES / "allennlp"
    weights = ["--options", str(original / "options.json"), "--weights", str(original / "lm_weights.hdf5")]
    return {
        "convert": ["convert", *weights, "--output-dir", str(output)],
        "export": ["export", "--model", model, "--output-dir", str(output)],
        "perplexity": ["perplexity", "--model", str(checkpoint_dir), text, "--device", "cpu"],
        "vocab": ["vocab", text, "--output", str(output)],
        "warm-state": ["warm-state", "--model", model, text, "--output-dir", str(output), "--device", "cpu"],
        "fasta-text": ["fasta-text", str(corpus / "in.fasta"), "--output", str(output)],
    }[command]


ONE_PROCESS_LAUNCHES = [
    ({"WORLD_SIZE": "2", "RANK": "1"}, "hf-elmo {} runs in one process; WORLD_SIZE=2 says this is one of 2"),
    ({"WORLD_SIZE": "3"}, "hf-elmo {} runs in one process; WORLD_SIZE=3 says this is one of 3"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': expected a whole number >= 1"),
]


@pytest.mark.parametrize("command", ["convert", "export", "perplexity", "vocab", "warm-state", "fasta-text"])
@pytest.mark.parametrize("variables, message", ONE_PROCESS_LAUNCHES, ids=[str(v) for v, _ in ONE_PROCESS_LAUNCHES])
def test_a_command_of_one_process_refuses_a_launch_of_several_before_any_work(
    command, variables, message, corpus, converted_dirs, checkpoint_dir, tmp_path, monkeypatch, capsys
):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    output = tmp_path / "out"
    assert cli_main(one_process_arguments(command, corpus, converted_dirs, checkpoint_dir, output)) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {message.format(command)}") and captured.err.count("\n") == 1, captured
    assert captured.out == "" and not output.exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether a socket of this machine listens on `port` (Linux's socket tables: no connection is made)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                return True
    return False


def wait_until(condition, process):
    """Waits for `condition()` while `process` runs (a limit only a hang reaches)."""
    deadline = time.monotonic() + HANG
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.1)


def start_rank_0(arguments, port, tmp_path, *options):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    command = [sys.executable, "-m", "hf_elmo.commands", *arguments, *options]
    return subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)


def finish(process) -> tuple[int, str]:
    _, error = process.communicate(timeout=HANG)
    return process.returncode, error


@pytest.mark.parametrize("command", ["embed", "train"])
def test_a_process_whose_peers_never_join_stops_after_the_rendezvous_timeout(command, corpus, converted_dirs, tmp_path):
    arguments = command_arguments(command, corpus, converted_dirs, tmp_path)
    process = start_rank_0(arguments, free_port(), tmp_path, "--rendezvous-timeout", "2")
    code, error = finish(process)
    assert code == 2, error[-3000:]
    assert error.count("\n") == 1 and "error: process 0 of 2: the others did not join at 127.0.0.1:" in error, error
    assert "within 2 s (--rendezvous-timeout" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("command", ["embed", "train"])
def test_a_signal_stops_a_process_waiting_for_its_peers_to_join(command, stop, corpus, converted_dirs, tmp_path):
    port = free_port()
    arguments = command_arguments(command, corpus, converted_dirs, tmp_path)
    process = start_rank_0(arguments, port, tmp_path, "--rendezvous-timeout", "3600")
    wait_until(lambda: listening(port), process)  # process 0 serves the store: it waits for process 1
    process.send_signal(stop)
    code, error = finish(process)
    assert code == 130, error[-3000:]
    assert error == f"interrupted by {stop.name}: the output in progress was not written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def join_as_process_1(port):
    """The test as the second process of an embed launch: joined, then doing nothing."""
    store = distributed.TCPStore("127.0.0.1", port, 2, is_master=False)
    embed_store = distributed.PrefixStore("hf_elmo_embed", store)
    embed_store.set("joined/1", "1")
    return embed_store


@pytest.mark.parametrize("peer", ["SIGTERM to process 0", "process 1 stops", "process 1 silent"])
def test_a_process_waiting_for_a_part_stops_on_a_signal_or_its_peer_and_removes_its_own(
    peer, corpus, converted_dirs, tmp_path
):
    port = free_port()
    arguments = embed_arguments(corpus, converted_dirs["allennlp"], tmp_path / "out.hdf5")
    timeout = "3" if peer == "process 1 silent" else "3600"
    process = start_rank_0(arguments, port, tmp_path, "--rendezvous-timeout", timeout)
    wait_until(lambda: listening(port), process)
    store = join_as_process_1(port)
    part = tmp_path / ".out.hdf5.part-0-of-2"
    wait_until(part.exists, process)  # process 0 wrote its part and waits for process 1's
    if peer == "SIGTERM to process 0":
        process.send_signal(signal.SIGTERM)
        expected = (130, "interrupted by SIGTERM: the output in progress was not written\n")
    elif peer == "process 1 stops":
        store.set("stopped/1", "interrupted by SIGINT")
        expected = (2, "error: process 1 of 2 stopped (interrupted by SIGINT): its part of the lines is missing\n")
    else:
        expected = (2, "error: process 1 of 2 gave no sign of life for 3 s (--rendezvous-timeout): its part of the ")
    code, error = finish(process)
    assert (code, error[: len(expected[1])]) == expected, error[-3000:]
    assert error.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_training_stops_in_one_line_when_a_peer_is_lost_and_its_checkpoints_stay(corpus, tmp_path):
    """Two processes started by hand; once a checkpoint is in place process 1 is killed (its machine gone): process 0
    stops at its next step with one line, and the last checkpoint is complete for `--resume` on two processes
    (benchmarks/two_machines.py resumes one on two torchrun agents)."""
    port = free_port()
    arguments = [*train_arguments(corpus, tmp_path / "run"), "--max-steps", "100000", "--save-steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "hf_elmo.commands", *arguments],
            env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        wait_until(lambda: any((tmp_path / "run").glob("checkpoint-*/trainer_state.json")), processes[0])
        processes[1].kill()
        processes[1].communicate()
        code, error = finish(processes[0])
    finally:
        for process in processes:
            process.kill()
    errors = [line for line in error.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in error, error[-3000:]
    assert len(errors) == 1 and "error: process 0 of 2: another process of the launch stopped or cannot be" in errors[0]
    last = max((tmp_path / "run").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert last_complete_checkpoint(tmp_path / "run", 2, False) == last  # what --resume on two processes takes
    assert ElmoForBiLM.from_pretrained(last).num_parameters() > 0


# A training process whose data preparation (the windows' cache) marks where it is, and, on the first process of the
# machine, waits for the test to release it.
HELD_IN_PREPARATION = """
import os, sys, time
from pathlib import Path

import hf_elmo.commands.train as train
from hf_elmo.commands.cli import main

marks, rank = Path(os.environ["TEST_MARKS"]), os.environ["RANK"]
build_bilm, prepare = train.build_bilm, train.load_compact_bilm_dataset


def build_and_mark(*args, **kwargs):
    model = build_bilm(*args, **kwargs)
    (marks / f"built-{rank}").touch()  # next: the data preparation, or the wait for it
    return model


def prepare_when_released(*args, **kwargs):
    (marks / f"preparing-{rank}").touch()
    while not (marks / "release").exists():
        time.sleep(0.05)
    return prepare(*args, **kwargs)


train.build_bilm, train.load_compact_bilm_dataset = build_and_mark, prepare_when_released
sys.exit(main(sys.argv[1:]))
"""


def start_on_one_machine(arguments, port, marks, tmp_path, script=None):
    """Processes 0 and 1 of a launch on one machine (LOCAL_RANK 0 and 1), each running `script` (default
    `HELD_IN_PREPARATION`) with `arguments`: process 0 prepares the data, 1 waits."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TEST_MARKS": str(marks)}
    env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return [
        subprocess.Popen(
            [sys.executable, "-c", script or HELD_IN_PREPARATION, *arguments],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]


def last_line(error: str) -> str:
    return error.splitlines()[-1] if error else ""


@pytest.mark.parametrize("stopped", ["SIGTERM to process 1 waiting", "SIGINT to process 0 preparing"])
def test_a_signal_while_the_data_is_prepared_stops_every_process_in_one_line(stopped, corpus, tmp_path):
    port, marks = free_port(), tmp_path / "marks"
    marks.mkdir()
    arguments = [*train_arguments(corpus, tmp_path / "run"), "--rendezvous-timeout", "3600"]
    processes = start_on_one_machine(arguments, port, marks, tmp_path)
    try:
        for process, mark in zip(processes, ("preparing-0", "built-1")):
            wait_until((marks / mark).exists, process)
        signalled = 1 if stopped.startswith("SIGTERM") else 0
        stop = signal.SIGTERM if signalled else signal.SIGINT
        processes[signalled].send_signal(stop)
        code, error = finish(processes[signalled])
        assert code == 130, error[-3000:]
        assert last_line(error) == f"interrupted by {stop.name}: the output in progress was not written", error
        (marks / "release").touch()  # process 0 goes on to what follows the preparation
        code, error = finish(processes[1 - signalled])
    finally:
        for process in processes:
            process.kill()
    expected = f"error: process {signalled} of 2 stopped (interrupted by {stop.name}): preparing the training data"
    assert (code, last_line(error)) == (2, expected), error[-3000:]
    assert "Traceback" not in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks"]


def test_the_others_wait_for_a_preparation_longer_than_the_rendezvous_timeout(corpus, tmp_path):
    """Process 0 gives signs of life while it prepares the data: process 1 waits past --rendezvous-timeout, then
    both train."""
    port, marks, timeout = free_port(), tmp_path / "marks", 12  # seconds no busy machine goes without a beat
    marks.mkdir()
    arguments = [*train_arguments(corpus, tmp_path / "run"), "--rendezvous-timeout", str(timeout)]
    processes = start_on_one_machine(arguments, port, marks, tmp_path)
    try:
        for process, mark in zip(processes, ("preparing-0", "built-1")):
            wait_until((marks / mark).exists, process)
        beats = distributed.PrefixStore("hf_elmo_join", distributed.TCPStore("127.0.0.1", port, is_master=False))
        # Beats come every timeout / 4 seconds: past 4 of them process 1 has waited longer than the timeout.
        wait_until(lambda: beats.add("beat/0", 0) > 4, processes[1])
        assert processes[1].poll() is None
        (marks / "release").touch()
        results = [finish(process) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert ElmoForBiLM.from_pretrained(tmp_path / "run").num_parameters() > 0


# A training process whose windows' writer (in the preparation's worker processes, or in the process itself with one
# core) writes its part into the cache folder, marks it with its process id, and then waits for what the test does.
KILLED_IN_PREPARATION = """
import os, sys, time
from pathlib import Path

import hf_elmo.training.word_table as word_table
from hf_elmo.commands.cli import main

marks, write_blocks = Path(os.environ["TEST_MARKS"]), word_table._write_blocks


def write_and_hold(*args, **kwargs):
    write_blocks(*args, **kwargs)
    (marks / f"written-{os.getpid()}").touch()
    while True:
        time.sleep(0.05)


if os.environ["RANK"] == "0":
    word_table._write_blocks = write_and_hold
sys.exit(main(sys.argv[1:]))
"""


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie of this test's own children counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_process_0_killed_while_it_prepares_the_data_stops_the_others_and_leaves_no_partial_cache(corpus, tmp_path):
    """SIGKILL to process 0 (a machine lost) while its preparation writes the windows' cache: process 1 stops in one
    line within the rendezvous timeout, the preparation's worker processes end with it, and the next run removes
    what the killed writers left, prepares the cache again and trains."""
    port, marks, cache = free_port(), tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    arguments = [*train_arguments(corpus, tmp_path / "run"), "--data-cache-dir", str(cache)]
    arguments += ["--rendezvous-timeout", "3600"]
    processes = start_on_one_machine(arguments, port, marks, tmp_path, KILLED_IN_PREPARATION)
    writers = []
    try:
        wait_until(lambda: any(marks.iterdir()), processes[0])
        writers = [int(mark.name.split("-")[1]) for mark in marks.iterdir()]
        assert any((cache / "hf_elmo_windows").glob(".*partial*"))  # a part written, the cache not complete
        processes[0].kill()
        processes[0].wait(timeout=HANG)
        code, error = finish(processes[1])
        deadline = time.monotonic() + HANG
        while any(alive(pid) for pid in writers):  # the writers end with process 0
            assert time.monotonic() < deadline, "the preparation's workers outlived the process that started them"
            time.sleep(0.1)
    finally:
        for process in processes:
            process.kill()
        for pid in writers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert code == 2 and "Traceback" not in error, error[-3000:]
    assert last_line(error).startswith("error: lost the launch's store at 127.0.0.1: "), error[-3000:]
    assert [line.startswith("error:") for line in error.splitlines()].count(True) == 1, error[-3000:]
    assert not (tmp_path / "run").exists()
    assert not [path.name for path in (cache / "hf_elmo_windows").iterdir() if not path.name.startswith(".")]

    env = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "hf_elmo.commands", *arguments]
    again = subprocess.run(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True, timeout=HANG)
    assert again.returncode == 0, again.stderr[-3000:]
    (key,) = [path.name for path in (cache / "hf_elmo_windows").glob("*.arrow")]
    assert sorted(path.name for path in (cache / "hf_elmo_windows").iterdir()) == sorted([key, f"{key}.record.json"])
    assert ElmoForBiLM.from_pretrained(tmp_path / "run").num_parameters() > 0
