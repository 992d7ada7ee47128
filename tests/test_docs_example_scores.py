"""The example scores docs/tasks.md gives come out again: each row of its table of example runs marked as checked by
this test is run as written (in a folder holding the converted AllenNLP test biLM, `elmo-allennlp`), and the score
the script prints is the one the table gives."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "docs" / "tasks.md"
CHECKED = "checked by tests/test_docs_example_scores.py"


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
