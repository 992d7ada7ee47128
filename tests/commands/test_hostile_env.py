"""`hf-elmo env` given careless or hostile input: refused with one line, nothing changed."""

import pytest
from hostile import Case, check_refused, write

CASES = {
    # --- the command line: hf-elmo env ---
    "env --model of a folder without config.json": Case(
        "env --model d",
        r"^error: d: no config\.json \(expected a folder written by hf-elmo convert or save_pretrained\)$",
    ),
    "env --model with a damaged config.json": Case(
        "env --model X",
        r"^error: X: cannot read the configuration \(X/config\.json: not valid JSON \(line 1, column 2: ",
        [write("X/config.json", "{")],
    ),
    "env --device of an unknown device": Case(
        "env --device tpu9", r"^error: --device: unknown device 'tpu9' \(e\.g\. cpu, cuda, cuda:1\)$"
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)
