"""`hf-elmo vocab` given careless or hostile input (corpora, output files): refused with one line, nothing changed;
interrupted while writing, nothing left.
"""

import pytest
from hostile import Case, check_refused, check_signal_while_writing, write

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "vocab over an existing vocabulary, without --force": Case(
        "vocab corpus.txt --output v.txt",
        r"^error: v\.txt: file exists \(use --force to replace it\)$",
        [write("v.txt", "<S>\n</S>\n<UNK>\nmine\n")],
        ("v.txt",),
    ),
    "vocab over its corpus, --force": Case(
        "vocab corpus.txt --output corpus.txt --force",
        r"^error: corpus\.txt: is the input corpus\.txt; write the output elsewhere$",
        untouched=("corpus.txt",),
    ),
    "vocab --force over a file that is not a vocabulary": Case(
        "vocab corpus.txt --output notes.txt --force",
        r"^error: notes\.txt: is not a word vocabulary",
        [write("notes.txt", "mine")],
    ),
    "vocab into a folder": Case("vocab corpus.txt --output d", r"^error: d: is a folder, expected a file name$"),
    # --- stack traces and unclear messages ---
    "vocab: an empty corpus": Case(
        "vocab empty.txt --output v.txt", r"Corpus file 'empty\.txt' is empty", [write("empty.txt", "\n \n")]
    ),
    "vocab: invalid UTF-8": Case(
        "vocab bad.txt --output v.txt",
        r"Corpus file 'bad\.txt': line 3 is not valid UTF-8 \(byte 1",
        [write("bad.txt", b"a b\r\nc\r\xe9t\xe9\n")],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


SIGNAL_CASES = {
    # name: (where the signal is sent from: module, class, method, on which call; the signal; the command)
    "vocab, SIGTERM": (
        ("hf_elmo.commands.vocab", "", "write_word_vocabulary", 1),
        "SIGTERM",
        "vocab corpus.txt --output v.txt",
    ),
}


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_signal_while_writing_leaves_nothing(name, workspace):
    check_signal_while_writing(SIGNAL_CASES[name], workspace)
