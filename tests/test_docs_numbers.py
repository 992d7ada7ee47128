"""The numbers the docs give that a quick command makes come out again: each is read from the page's text and the
command beside it is rerun. Counts and what is computed from counts in float64 (the demo's vocabulary, held-out words
and unigram perplexities) are exact on every machine; perplexities of the biLM bilm-tf trained sum 6,008 float32
predictions, so a rerun may differ from the printed value by half its last digit plus float32 rounding (1e-5
relative) on another processor. The list of the docs' numbers and how each is checked is in docs/testing.md."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import CHECKPOINT
from seqvec_shaped import memory_bound_per_residue

from hf_elmo import ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.training.corpus import build_word_vocabulary, iter_sentences
from hf_elmo.training.perplexity import unigram_perplexity

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
WARM_STATE = (ROOT / "docs" / "warm-state.md").read_text(encoding="utf-8")
GUARANTEES = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
TASKS = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
HELDOUT = CHECKPOINT / "heldout.txt"


def table_row_text(page: str, first_cell: str) -> str:
    """The one table row whose first cell starts with `first_cell`."""
    rows = [line for line in page.splitlines() if line.startswith(f"| {first_cell}")]
    assert len(rows) == 1, f"{len(rows)} rows start with {first_cell!r}"
    return rows[0]


def table_row(page: str, first_cell: str) -> list[str]:
    """The cells after the first of the one table row whose first cell starts with `first_cell`."""
    return [cell.strip().strip("*") for cell in table_row_text(page, first_cell).strip("|").split("|")[1:]]


def printed(out: str) -> dict[str, str]:
    found = dict(re.findall(r"^(forward|backward|geometric mean)(?: perplexity)?\s+([\d.]+)$", out, re.M))
    return {"combined": found["geometric mean"], "forward": found["forward"], "backward": found["backward"]}


def assert_as_documented(out: str, row: list[str]):
    for (name, value), documented in zip(printed(out).items(), row[:3], strict=True):
        assert float(value) == pytest.approx(float(documented), abs=5e-4 + 1e-5 * float(documented)), (name, value)


# The rows of docs/warm-state.md's table of the held-out lines, each with the options of `hf-elmo perplexity`.
PERPLEXITY_ROWS = {
    "`--stream --batch-size 1`": ["--stream", "--batch-size", "1"],
    "`--stream --batch-size 16`": ["--stream", "--batch-size", "16"],
    "`--start zero`": ["--start", "zero", "--batch-size", "50"],
}


@pytest.mark.parametrize("first_cell", PERPLEXITY_ROWS)
def test_held_out_perplexities_of_the_bilm_tf_checkpoint(first_cell, checkpoint_dir, capsys):
    row = table_row(WARM_STATE, first_cell)
    assert cli_main(["perplexity", "--model", str(checkpoint_dir), str(HELDOUT), *PERPLEXITY_ROWS[first_cell]]) == 0
    out = capsys.readouterr().out
    # The batch of 16 drops the last batch it cannot fill: its row gives its own count.
    predictions = re.search(r"\(([\d,]+) predictions", table_row_text(WARM_STATE, first_cell))
    predictions = predictions or re.search(r"([\d,]+)\s+predictions\s+per direction", WARM_STATE)
    assert f"targets per direction  {predictions.group(1)}" in out
    assert_as_documented(out, row)


def test_held_out_perplexity_from_the_warm_state(checkpoint_dir, tmp_path, capsys):
    row = table_row(WARM_STATE, "`--start warm`")
    sentences = re.search(r"\(([\d,]+) training sentences\)", table_row_text(WARM_STATE, "`--start warm`")).group(1)
    folder = tmp_path / "bilm"
    shutil.copytree(checkpoint_dir, folder)
    warm = ["warm-state", "--model", str(folder), "--in-place", str(CHECKPOINT / "train.txt")]
    assert cli_main([*warm, "--sentences", sentences.replace(",", "")]) == 0
    assert cli_main(["perplexity", "--model", str(folder), str(HELDOUT), "--start", "warm", "--batch-size", "50"]) == 0
    out = capsys.readouterr().out
    assert_as_documented(out, row)
    in_domain = table_row(WARM_STATE, sentences)[0]  # the N table's row for the same text and N
    assert in_domain.startswith(f"{row[0]} (")


def test_bilm_tf_row_is_the_fixture_record():
    """The row of bilm-tf's own `test()` is the fixture's record of it (tests/fixtures/bilm-tf-checkpoint)."""
    record = json.loads((CHECKPOINT / "bilmtf_perplexity.json").read_text())
    row = table_row(WARM_STATE, "bilm-tf `test()`, batch 1")
    batch_1 = record["batch_size_1"]
    expected = [batch_1["combined_ppl_as_test"], batch_1["forward_ppl"], batch_1["backward_ppl"]]
    assert row[:3] == [f"{value:.3f}" for value in expected]
    assert f"(printed: {record['printed_by_bilm_tf_test']['batch_size_1']})" in table_row_text(
        WARM_STATE, "bilm-tf `test()`"
    )
    assert f"bilm-tf: {record['batch_size_16']['combined_ppl_as_test']:.3f}" in WARM_STATE


@pytest.mark.parametrize("page", [README, GUARANTEES], ids=["README", "guarantees"])
def test_summaries_round_the_warm_state_table(page):
    """README.md and docs/guarantees.md quote the table above to two decimals."""
    warm, stream, zero = (
        float(table_row(WARM_STATE, cell)[0]) for cell in ("`--start warm`", "bilm-tf `test()`", "`--start zero`")
    )
    assert f"({warm:.2f} against bilm-tf's {stream:.2f}; {zero:.2f} from zeros)" in " ".join(page.split())


def test_demo_vocabulary_and_unigram_baseline(tmp_path):
    """`make demo`'s vocabulary (docs/tasks.md), held-out words and unigram perplexities (README.md): the demo's own
    split of the corpus, its vocabulary (min count 2), counted in float64."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from demo import split_corpus
    finally:
        sys.path.remove(str(ROOT / "examples"))
    train, held_out = split_corpus(tmp_path)
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([train], "pretokenizer", tokenizer, min_count=2))
    assert f"{len(tokenizer.word_vocabulary):,}-word vocabulary" in TASKS
    words = sum(len(sentence) + 1 for sentence in iter_sentences([str(held_out)], "pretokenizer", tokenizer))
    assert f"held-out perplexity ({words:,} words per direction, held_out.txt)" in README
    unigram = unigram_perplexity(tokenizer, [train], [held_out], split="pretokenizer")
    for direction in ("forward", "backward"):
        line = re.search(rf"^  {direction} +[\d.]+ +([\d.]+)$", README, re.M)
        assert line.group(1) == f"{unigram[direction]:.1f}", direction


def test_tagging_data_counts():
    """docs/tasks.md's and docs/warm-state.md's counts of the tagging example's data, as `examples/pos_tagging.py`
    reads it."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from pos_tagging import DATA, read_conllu
    finally:
        sys.path.remove(str(ROOT / "examples"))
    dev, _ = read_conllu(DATA / "en_ewt-ud-dev.conllu")
    test, _ = read_conllu(DATA / "en_ewt-ud-test.conllu")
    words = f"{sum(len(sentence) for sentence in test):,} words"
    assert f"{len(dev):,} EWT dev sentences, evaluates on the {len(test):,} test sentences ({words};" in " ".join(
        TASKS.split()
    )
    assert f"EWT test, {words};" in " ".join(WARM_STATE.split())


def test_long_protein_memory_arithmetic():
    """docs/proteins.md's bound per residue at SeqVec's sizes and what it gives for titin, and the measured peaks'
    growth per residue, from the shortest protein and between the two longest, within that bound: arithmetic on the
    page's own numbers."""
    page = " ".join((ROOT / "docs" / "proteins.md").read_text(encoding="utf-8").split())
    cells, width = (
        int(value.replace(",", "")) for value in re.search(r"\(([\d,]+) cells, 2P = ([\d,]+)\)", page).groups()
    )
    residues = int(re.search(r"a titin-sized protein of ([\d,]+) residues", page).group(1).replace(",", ""))
    per_residue = memory_bound_per_residue({"lstm": {"dim": cells, "projection_dim": width // 2}})
    assert f"that is {per_residue / 1024:.0f} KiB per residue" in page
    assert f"needs at most {residues * per_residue / 2**30:.1f} GiB beyond the model" in page
    measured = re.search(r"[\d,]+ MiB at [\d,]+ residues, (?:[\d,]+ MiB at [\d,]+, )+[\d,]+ MiB at [\d,]+\.", page)
    pairs = [
        tuple(int(v.replace(",", "")) for v in pair) for pair in re.findall(r"([\d,]+) MiB at ([\d,]+)", measured[0])
    ]
    (first, first_length), (before, before_length), (last, last_length) = pairs[0], pairs[-2], pairs[-1]
    assert last_length == residues
    growth = (last - first) * 2**20 / (last_length - first_length)
    assert (
        f"took {last - first:,} MiB more than the {first_length:,}-residue one, that is {growth / 1024:.0f} KiB" in page
    )
    assert growth <= per_residue
    marginal = (last - before) * 2**20 / (last_length - before_length)
    assert f"between {before_length:,} and {last_length:,} residues the peak grows by {marginal / 1024:.0f} KiB" in page
    assert f"(2 x 4 x {cells:,} float32, {2 * 4 * cells * 4 // 1024} KiB)" in page


PERFORMANCE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_performance_ratios_are_the_arithmetic_of_their_tables():
    """docs/performance.md's ratios and per-sentence memory, each recomputed from the measured figures it names:
    the tables' cells on the page, or the benchmark's table in benchmarks/RESULTS.md."""
    page = " ".join(PERFORMANCE.split())
    float32, float16 = (table_row(PERFORMANCE, f"{dtype} |") for dtype in ("float32", "float16"))
    ratios = re.search(r"\(([\d.]+)x and ([\d.]+)x slower than float32 in the table: ([\d,]+) / ([\d,]+) and", page)
    original, small = (number(float32[1]) / number(float16[1]), number(float32[0]) / number(float16[0]))
    assert ratios.groups() == (f"{original:.1f}", f"{small:.1f}", float32[1], float16[1])
    assert f"and {float32[0]} / {float16[0]})" in page

    memory_table = RESULTS[RESULTS.index("**Peak memory per batch size**") : RESULTS.index("**Where the time goes**")]
    peak_1, peak_256 = (number(table_row(memory_table, f"{batch} |")[1]) for batch in (1, 256))
    per_sentence = (peak_256 - peak_1) / 255
    assert f"({peak_256:,.0f} - {peak_1:,.0f}) MiB / 255 sentences = {per_sentence:.2f} MiB" in page

    transformers = number(table_row(PERFORMANCE, "`from transformers import AutoModel`")[0].split()[0])
    for case in ("**`import hf_elmo`**", "`import hf_elmo; from transformers import AutoModel`"):
        seconds = number(table_row(PERFORMANCE, case)[0].split()[0])
        assert f"{seconds / transformers:.2f}x" in table_row_text(PERFORMANCE, case)
        assert f"({seconds:.2f} / {transformers:.2f})" in table_row_text(PERFORMANCE, case)

    rows = [line for line in PERFORMANCE.splitlines() if re.match(r"\| (small|original), [12] thread", line)]
    assert len(rows) == 8, rows
    for line in rows:
        theirs, ours, ratio = (number(cell.split()[0].rstrip("x")) for cell in line.strip("|").split("|")[1:4])
        # the ratio of the medians before they were rounded to whole words per second, printed to two decimals
        assert (ours - 0.5) / (theirs + 0.5) - 0.005 <= ratio <= (ours + 0.5) / (theirs - 0.5) + 0.005, line
    reference_ratios = re.findall(r"([\d.]+)x \((original|small): ([\d,]+) / ([\d,]+)\)", page)
    assert len(reference_ratios) == 2, reference_ratios
    for ratio, size, ours, reference in reference_ratios:
        assert ratio == f"{number(ours) / number(reference):.2f}", size
        assert f"{reference} words/s" in table_row_text(PERFORMANCE, "straightforward reference path")
        assert ours in table_row_text(PERFORMANCE, "**`ElmoModel`**, float32")

    kept_1, kept_2, returned_1, returned_2, ratio, kept, returned = re.search(
        r"original (\d+) / (\d+) against (\d+) / (\d+) tokens/s \(([\d.]+)x: ([\d.]+) / ([\d.]+);", page
    ).groups()
    assert float(kept) == (int(kept_1) + int(kept_2)) / 2 and float(returned) == (int(returned_1) + int(returned_2)) / 2
    assert ratio == f"{float(kept) / float(returned):.1f}"
