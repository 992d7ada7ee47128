"""Raw text -> words, in the Penn-Treebank style of the corpus ELMo was trained on (a `tokenizers` `Split`), and
what a tokenizer is given (a text, texts, words, lists of words) -> sentences of words (`collect_sentences`)."""

import re
from collections.abc import Callable
from typing import Any

from tokenizers import Regex, pre_tokenizers

_WORD_CHARS = r"\p{L}\p{M}\p{N}_"
_CLITICS = r"(?:s|m|d|ll|re|ve)"
_APOSTROPHE = r"['’]"

PRE_TOKENIZER_PATTERN = "|".join(
    [
        # sentence-boundary literals stay whole (they map to the boundary rows)
        r"</?S>",
        # dotted abbreviations: U.S., e.g., U.S.A.
        r"(?:\p{L}\.){2,}",
        # numbers with inner separators: 3.14, 1,000, 10:30, 1/2
        r"\p{N}+(?:[.,:/]\p{N}+)+",
        # the stem before n't: do|n't, ca|n't, wo|n't
        rf"[{_WORD_CHARS}]+?(?=(?i:n{_APOSTROPHE}t)(?![{_WORD_CHARS}]))",
        rf"(?i:n{_APOSTROPHE}t)(?![{_WORD_CHARS}])",
        # clitics split off their word: 's 'm 'd 'll 're 've
        rf"{_APOSTROPHE}(?i:{_CLITICS})(?![{_WORD_CHARS}])",
        # words, keeping inner hyphens and non-clitic apostrophes: well-known, O'Neill, rock'n'roll
        rf"[{_WORD_CHARS}]+(?:(?:{_APOSTROPHE}(?!(?i:{_CLITICS})(?![{_WORD_CHARS}]))|-)[{_WORD_CHARS}]+)*",
        # ellipses and dashes
        r"\.{2,}|-{2,}",
        # any other character (punctuation, symbols, emoji) on its own
        rf"[^{_WORD_CHARS}\s]",
    ]
)
"""Regex of one word for the `Split` pre-tokenizer (Oniguruma syntax, alternatives tried in order).

It approximates the Penn-Treebank tokenisation of the 1B Word Benchmark that ELMo was trained on:
`don't -> do n't`, `can't -> ca n't`, `It's -> It 's`, `we're -> we 're`, `I'll / I've / I'd / I'm`
split before the apostrophe, punctuation and symbols split off one character at a time (except
`...` and `--`), while dotted abbreviations (`U.S.`, `e.g.`), numbers such as `3.14` / `1,000` /
`10:30`, hyphenated words and non-clitic apostrophes (`O'Neill`) stay whole. Not handled: a period
after a non-dotted abbreviation (`Mr.` -> `Mr .`), `cannot`/`gonna` splitting and PTB quote
rewriting (`"` stays `"`, not `` `` `` / `''`).
"""


def build_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Whitespace split followed by the PTB-style `Split` on `PRE_TOKENIZER_PATTERN`."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            # "isolated": every match is its own word and nothing is dropped, because the last
            # alternative matches any single non-space character the others leave.
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        ]
    )


MAX_RUN_LENGTH = 100_000
"""Characters without whitespace the splitter takes at once. The regex engine gives up (a Rust panic, which Python's
`except Exception` does not catch) on runs of a few million; no word is anywhere near this long."""
# The whitespace of WhitespaceSplit (Rust's char::is_whitespace: Unicode White_Space), which Python's \s is not.
_LONG_RUN = re.compile(
    f"[^\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]{{{MAX_RUN_LENGTH + 1}}}"
)


def split_words(pre_tokenizer: pre_tokenizers.PreTokenizer, text: str) -> list[str]:
    """The words of `text` by `pre_tokenizer`. Lone surrogates are dropped first: they cannot reach the Rust
    pre-tokenizer (and would vanish from the character ids anyway). A run of more than `MAX_RUN_LENGTH` characters
    without whitespace is a `ValueError`."""
    if not isinstance(text, str):
        raise TypeError(f"split_words expects a str, got {type(text).__name__}")
    if len(text) > MAX_RUN_LENGTH and (run := _LONG_RUN.search(text)):
        raise ValueError(
            f"the text has more than {MAX_RUN_LENGTH:,} characters without whitespace (from character "
            f"{run.start():,}), more than the word splitter takes: split it, or give the words (is_split_into_words)"
        )
    try:
        try:
            pieces = pre_tokenizer.pre_tokenize_str(text)
        except UnicodeEncodeError:
            pieces = pre_tokenizer.pre_tokenize_str(text.encode("utf-8", "ignore").decode("utf-8"))
    except BaseException as error:  # a Rust panic arrives as pyo3's PanicException, a BaseException
        if type(error).__name__ != "PanicException":
            raise
        raise ValueError(f"the word splitter failed on this text ({' '.join(str(error).split())})") from None
    return [piece for piece, _ in pieces]


def _checked_words(words: Any, where: str) -> list[str]:
    for index, word in enumerate(words):
        if not isinstance(word, str):
            kind = "a nested list" if isinstance(word, (list, tuple)) else type(word).__name__
            raise TypeError(
                f"{where}: word {index} is {kind} ({word!r:.60}), expected str. With "
                "is_split_into_words=True pass a list of words or a list of lists of words."
            )
    return list(words)


def collect_sentences(
    text: Any, is_split_into_words: bool, split: Callable[[str], list[str]]
) -> tuple[list[list[str]], bool]:
    """The sentences of a tokenizer's input as word lists, and whether it was a batch.

    `text` is a str or a list of str (raw text, cut into words by `split`) or, with `is_split_into_words`, a list of
    words or a list of such lists. Anything else (a pair of texts, a word that is not a str) is a one-line error.
    """
    if is_split_into_words:
        if isinstance(text, str):
            raise ValueError(
                "is_split_into_words=True expects a list of words (or a list of such lists), got a str; "
                "pass raw text with is_split_into_words=False"
            )
        if not isinstance(text, (list, tuple)):
            raise TypeError(f"Expected a list of words or a list of word lists, got {type(text).__name__}")
        if text and all(isinstance(sentence, (list, tuple)) for sentence in text):
            return [_checked_words(sentence, f"sentence {i}") for i, sentence in enumerate(text)], True
        return [_checked_words(text, "input")], False

    if isinstance(text, str):
        return [split(text)], False
    if not isinstance(text, (list, tuple)):
        raise TypeError(f"Expected a str or a list of str, got {type(text).__name__}")
    for index, item in enumerate(text):
        if isinstance(item, (list, tuple)):
            raise ValueError(
                f"Item {index} of the batch is a {type(item).__name__} of {len(item)}: for pre-split words pass "
                "is_split_into_words=True; a batch of pairs is tuples (text, text_pair) throughout"
            )
        if not isinstance(item, str):
            raise TypeError(f"Item {index} of the batch is {type(item).__name__}, expected str")
    return [split(item) for item in text], True


def split_batch_of_pairs(text: Any, is_split_into_words: bool) -> tuple[list, list] | None:
    """`(texts, text_pairs)` of a batch given as pairs, as BERT's tokenizers take them (`[("a b", "c"), ...]`), or
    None when `text` is not such a batch. A pair is a tuple of two texts, or pre-split of two word lists; not a list
    (BERT's tokenizers take `["a b", "c"]` as a pair too, but here a list in a batch is the words of a sentence given
    without `is_split_into_words=True`, refused by `collect_sentences`), and a tuple of words stays one sentence. A
    batch holds pairs throughout or none (a one-line error)."""
    if not isinstance(text, (list, tuple)) or not text:
        return None

    def is_pair(item) -> bool:
        side_type = (list, tuple) if is_split_into_words else str
        return isinstance(item, tuple) and len(item) == 2 and all(isinstance(side, side_type) for side in item)

    pairs = [is_pair(item) for item in text]
    if not any(pairs):
        return None
    if not all(pairs):
        single = pairs.index(False)
        raise ValueError(
            f"Item {pairs.index(True)} of the batch is a pair (text, text_pair) but item {single} is not "
            f"({text[single]!r:.60}): a batch holds pairs throughout or none"
        )
    return [item[0] for item in text], [item[1] for item in text]


__all__ = [
    "MAX_RUN_LENGTH",
    "PRE_TOKENIZER_PATTERN",
    "build_pre_tokenizer",
    "collect_sentences",
    "split_batch_of_pairs",
    "split_words",
]
