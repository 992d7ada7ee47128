"""`hf-elmo vocab`: count a corpus (`training.corpus.build_word_vocabulary`) and write a word vocabulary in the original
format."""

from dataclasses import dataclass
from functools import partial

from ..io.files import VOCABULARY_FILE, check_output, write_output
from ..tokenization_elmo import ElmoTokenizer
from ..training.corpus import SPLIT_HELP, SPLITS, build_word_vocabulary
from ..word_vocabulary import write_word_vocabulary
from .command_line import option
from .launch import check_one_process


@dataclass(kw_only=True)
class VocabOptions:
    files: list[str] = option(help="text files, one sentence per line", positional=True)
    output: str = option(help="vocabulary file to write")
    force: bool = option(False, help="replace an earlier vocabulary file", flag=True)
    min_count: int = option(1, help="keep words seen at least this often")
    max_size: int | None = option(None, help="at most this many entries, <S>, </S>, <UNK> included")
    split: str = option("pretokenizer", help=f"as in training; {SPLIT_HELP}", choices=SPLITS)


COMMAND_OPTIONS = VocabOptions


def run(options) -> int:
    """`options`: the fields of `VocabOptions`, as parsed."""
    check_one_process("vocab")
    check_output(options.output, VOCABULARY_FILE, options.files, options.force)
    words = build_word_vocabulary(options.files, options.split, ElmoTokenizer(), options.min_count, options.max_size)
    write_output(options.output, partial(write_word_vocabulary, words), VOCABULARY_FILE, options.files, options.force)
    print(f"{len(words):,} entries written to {options.output}")
    return 0
