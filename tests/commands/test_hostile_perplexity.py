"""`hf-elmo perplexity` given careless or hostile input (text files, model folders, options): refused with one line,
nothing changed; text files read as text mode reads them and split as the model was trained.
"""

import json
import re
import shutil

import pytest
from conftest import FIXTURES
from hostile import Case, check_memory_refusal, check_refused, edit_json, run_memory_cases, write

from hf_elmo import ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main

CASES = {
    # --- silent wrong answers: NaN, zero sizes, options that do not describe the weights ---
    "perplexity: --batch-size 0": Case(
        "perplexity --model B corpus.txt --batch-size 0", r"batch_size must be >= 1, got 0"
    ),
    "perplexity: --window 0": Case("perplexity --model B corpus.txt --window 0", r"window must be >= 3 positions"),
    # --- stack traces and unclear messages ---
    "perplexity: a corrupt tokenizer_config.json": Case(
        "perplexity --model B corpus.txt",
        r"^error: B: tokenizer_config\.json is not valid JSON",
        [write("B/tokenizer_config.json", "{bad")],
    ),
    "perplexity: invalid UTF-8": Case(
        "perplexity --model B bad.txt",
        r"Evaluation file 'bad\.txt': line 1 is not valid UTF-8",
        [write("bad.txt", b"\xc3(")],
    ),
    "perplexity: config.json's softmax larger than the vocabulary": Case(
        "perplexity --model B corpus.txt",
        r"B: the model's softmax has 100,000,000 words \(config\.json vocab_size\) but its vocabulary "
        r"\(vocab\.txt\) has 9",
        [edit_json("B/config.json", vocab_size=10**8)],
    ),
    # --- embedding, perplexity, export and warm-state commands: output dtypes, devices, the model's text split ---
    "perplexity --device bogus": Case(
        "perplexity --model B corpus.txt --device bogus", r"^error: --device: unknown device 'bogus' \(e\.g\. cpu,"
    ),
    "perplexity --device cuda:99": Case(
        "perplexity --model B corpus.txt --device cuda:99",
        r"^error: --device cuda:99: (CUDA is not available on this machine|this machine has \d+ CUDA device\(s\))$",
    ),
    "perplexity: a training options file with an unknown split": Case(
        "perplexity --model B corpus.txt",
        r"^error: B/bilm_training_options\.json: field 'split' must be one of whitespace, pretokenizer, got 'words'$",
        [write("B/bilm_training_options.json", json.dumps({"split": "words"}))],
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "perplexity: tokenizer_class BertTokenizer": Case(
        "perplexity --model B corpus.txt",
        r"^error: B: tokenizer_config\.json names tokenizer_class 'BertTokenizer', expected 'ElmoTokenizer'",
        [edit_json("B/tokenizer_config.json", tokenizer_class="BertTokenizer")],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    "config.json vocab_size 10**8": (
        ("B/config.json", {"vocab_size": 10**8}),
        "perplexity --model B corpus.txt",
        r"B: the model's softmax has 100,000,000 words",
    ),
    # --- embedding, perplexity, export and warm-state commands ---
    "perplexity --stream --batch-size 10**9": (
        ("B/config.json", {}),
        "perplexity --model B corpus.txt --stream --batch-size 1000000000",
        r"^error: 3 lines cannot fill one batch of 1000000000 streams: every row needs a line of its own",
    ),
    # --- checkpoint conversion, configuration and model-input checks ---
    "tokenizer_config.json max_characters_per_token 10**9": (
        ("B/tokenizer_config.json", {"max_characters_per_token": 10**9}),
        "perplexity --model B corpus.txt",
        r"^error: B: .*max_characters_per_token is 1,000,000,000, more than the limit of 1,000 slots per word",
    ),
}


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory, converted_dirs, bilm_dir):
    return run_memory_cases(MEMORY_CASES, tmp_path_factory, converted_dirs, bilm_dir)


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_sizes_are_checked_before_anything_is_allocated(name, memory_results):
    check_memory_refusal(MEMORY_CASES[name], memory_results[name])


HELD_OUT = (FIXTURES / "bilm-tf-checkpoint" / "heldout.txt").read_text(encoding="utf-8").split("\n")[:40]


def perplexity_printed(capsys, model, *arguments) -> list[str]:
    assert cli_main(["perplexity", "--model", str(model), *map(str, arguments)]) == 0
    return capsys.readouterr().out.strip().split("\n")


# The bilm-tf checkpoint's biLM: a trained model, whose perplexity tells a word from another.
@pytest.mark.parametrize("mode", [[], ["--stream", "--batch-size", "4"], ["--start", "zero"]], ids=str)
@pytest.mark.parametrize("variant", ["byte-order mark", "CR and CRLF"])
def test_perplexity_reads_text_files_as_text_mode_does(variant, mode, checkpoint_dir, tmp_path, capsys):
    text = "\n".join(HELD_OUT) + "\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    if variant == "byte-order mark":
        (tmp_path / "variant.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    else:
        (tmp_path / "variant.txt").write_bytes(text.replace("\n", "\r", 3).replace("\n", "\r\n", 3).encode())
    plain = perplexity_printed(capsys, checkpoint_dir, tmp_path / "plain.txt", "--window", "60", *mode)
    assert perplexity_printed(capsys, checkpoint_dir, tmp_path / "variant.txt", "--window", "60", *mode) == plain


@pytest.mark.parametrize("mode", [[], ["--stream", "--batch-size", "4"], ["--start", "zero"]], ids=str)
def test_perplexity_splits_text_as_the_model_was_trained(mode, checkpoint_dir, tmp_path, capsys):
    model = tmp_path / "bilm"
    shutil.copytree(checkpoint_dir, model)
    # Raw text: the held-out sentences with their punctuation attached to the words before it.
    raw = "".join(re.sub(r" ([.,:;?!])", r"\1", line) + "\n" for line in HELD_OUT)
    (tmp_path / "raw.txt").write_text(raw, encoding="utf-8")
    # The truth: the words of the tokenizer's splitter, written out separated by spaces, read as they are.
    tokenizer = ElmoTokenizer.from_pretrained(model)
    split = "".join(" ".join(tokenizer.split_words(line)) + "\n" for line in raw.splitlines())
    (tmp_path / "split.txt").write_text(split, encoding="utf-8")
    window = ["--window", "60"]
    truth = perplexity_printed(capsys, model, tmp_path / "split.txt", "--split", "whitespace", *window, *mode)
    assert truth[0] == "text split             whitespace"
    (model / "bilm_training_options.json").write_text(json.dumps({"split": "pretokenizer"}))
    recorded = perplexity_printed(capsys, model, tmp_path / "raw.txt", *window, *mode)
    assert recorded == [truth[0].replace("whitespace", "pretokenizer"), *truth[1:]]
    # An explicit --split overrides the recorded one; on the raw text, whitespace gives other words and numbers.
    whitespace = perplexity_printed(capsys, model, tmp_path / "raw.txt", "--split", "whitespace", *window, *mode)
    assert whitespace[0] == truth[0] and whitespace[2:] != truth[2:]
