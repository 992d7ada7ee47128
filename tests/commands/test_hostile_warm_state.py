"""`hf-elmo warm-state` given careless or hostile input: refused with one line, nothing changed."""

import pytest
from hostile import Case, check_refused, write

CASES = {
    # --- embedding, perplexity, export and warm-state commands: output dtypes, devices, the model's text split ---
    "warm-state --device bogus": Case(
        "warm-state --model M corpus.txt --device bogus",
        r"^error: --device: unknown device 'bogus'",
        untouched=("M/model.safetensors", "M/config.json"),
    ),
    "warm-state: a training options file that is not JSON": Case(
        "warm-state --model M corpus.txt",
        r"^error: M/bilm_training_options\.json: not valid JSON \(line 1, column 1",
        [write("M/bilm_training_options.json", "split: pretokenizer")],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)
