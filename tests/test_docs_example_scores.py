"""The example scores docs/tasks.md gives come out again: each row of its table of example runs marked as checked by
this test is run as written (in a folder holding the converted AllenNLP test biLM, `elmo-allennlp`), and the score
the script prints is the one the table gives. Training rounds as the processor does (vector width, BLAS kernels of
its vendor), and a few epochs amplify the last bit as a change of seed would: the score is the documented one on the
kind of machine the table states (its processor family and CPU flags), where the test runs; elsewhere it is
skipped, naming both kinds."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "docs" / "tasks.md"
CHECKED = "checked by tests/test_docs_example_scores.py"


def stated_machine() -> tuple[str, set[str]]:
    """The processor family and CPU flags of the paragraph above the table: "... on a shared 2-core AMD EPYC (avx2 fma
    avx512f avx512_bf16; ..."."""
    family, flags = re.search(r"2-core ([A-Za-z ]+?) \(([a-z0-9_ ]+);", TASKS.read_text(encoding="utf-8")).groups()
    return family, set(flags.split())


def this_machine() -> tuple[str, set[str]]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", info, flags=re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, flags=re.MULTILINE)
    return (model.group(1) if model else ""), set(flags.group(1).split() if flags else ())


def checked_rows() -> list[tuple[str, str]]:
    """`(command, score)` of each row of the table that names this test: the score as the script prints it."""
    rows = []
    for line in TASKS.read_text(encoding="utf-8").splitlines():
        if CHECKED in line:
            command, result = re.match(r"\| `([^`]+)` \| (.*) \|$", line).groups()
            rows.append((command, re.search(r"\d+\.\d\d%", result).group(0)))
    return rows


def test_the_table_has_checked_rows():
    assert len(checked_rows()) == 2


@pytest.mark.parametrize("command, score", checked_rows(), ids=lambda value: value.split()[1] if " " in value else "")
def test_a_documented_example_score_comes_out_again(command, score, converted_dirs, tmp_path):
    (family, flags), (model, ours) = stated_machine(), this_machine()
    if family not in model or not flags <= ours:
        pytest.skip(f"the score is stated for {family} with {sorted(flags)}; this is {model or 'unknown'}")
    (tmp_path / "elmo-allennlp").symlink_to(converted_dirs["allennlp"], target_is_directory=True)
    arguments = shlex.split(command)
    assert arguments[0] == "python" and arguments[1].startswith("examples/")
    arguments += ["--output-dir", str(tmp_path / "outputs")]
    done = subprocess.run(
        [sys.executable, str(ROOT / arguments[1]), *arguments[2:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.strip().splitlines()[-1]
    assert re.search(rf"(accuracy|exact match) {re.escape(score)} on", printed), printed
