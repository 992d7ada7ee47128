"""Training data of the biLM: plain-text corpora -> packed windows of character ids and LM targets.

A corpus is one or more UTF-8 text files with one sentence per line; blank lines are skipped. Words are
either the whitespace-separated tokens of the line (`split="whitespace"`, the original's format: text already
tokenised, e.g. the 1B Word Benchmark) or the words of `ElmoTokenizer.split_words` (`split="pretokenizer"`,
for raw text).
"""

import codecs
import glob
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..folder_files import (
    cache_file_damage,
    length_and_digest,
    record_cache_file,
    remove_cache_file,
    replace_atomically,
)
from ..io.fasta import read_fasta
from ..io.files import ElmoInputError, json_field, read_json_object, read_lines
from ..tokenization_elmo import ElmoTokenizer
from ..word_vocabulary import count_word_vocabulary

logger = logging.getLogger(__name__)

SPLITS = ("whitespace", "pretokenizer")
SPLIT_HELP = (
    "pretokenizer: raw text, split as the tokenizer splits text given to the model; whitespace: text tokenised already "
    "(the original's 1B Word Benchmark)"
)
MODEL_SPLIT_HELP = (
    f"{SPLIT_HELP} (default: the split the model was trained with, recorded in its folder by hf-elmo train, else "
    "whitespace)"
)
TRAINING_OPTIONS_FILE = "bilm_training_options.json"
"""What `hf-elmo train` writes into its output folder: the run's options, the text split among them."""


def split_line(line: str, split: str, tokenizer: ElmoTokenizer | None = None, where: str | None = None) -> list[str]:
    """The words of one line: `line.split()` or `tokenizer.split_words(line)`; `where` (e.g. `"file, line 12"`)
    names the line in the splitter's errors."""
    if split == "whitespace":
        return line.split()
    if split == "pretokenizer":
        try:
            return tokenizer.split_words(line)
        except ValueError as error:
            raise ValueError(f"{where or 'a line'}: {error}") from None
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")


def model_split(model_dir: str | os.PathLike, split: str | None = None) -> str:
    """`split` if given, else the split the model in `model_dir` was trained with (recorded by `hf-elmo train` in
    the folder's `TRAINING_OPTIONS_FILE`), else `"whitespace"`: a model reads text as it was trained to."""
    if split is not None:
        return split
    path = Path(model_dir) / TRAINING_OPTIONS_FILE
    if not path.is_file():
        return "whitespace"
    recorded = json_field(read_json_object(path, "training options"), "split", str(path), "whitespace")
    if recorded not in SPLITS:
        raise ElmoInputError(f"{path}: field 'split' must be one of {', '.join(SPLITS)}, got {recorded!r}")
    return recorded


def _check_split(split: str, tokenizer: ElmoTokenizer | None):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    if split == "pretokenizer" and tokenizer is None:
        raise ValueError("split='pretokenizer' needs the tokenizer whose split_words cuts the lines.")


def _check_targets(tokenizer: ElmoTokenizer):
    if tokenizer.word_vocabulary is None:
        raise ValueError(
            "The tokenizer has no word vocabulary for the LM targets: build one (build_word_vocabulary) and attach "
            "it with tokenizer.set_word_vocabulary(words)."
        )


def expand_shards(files: Sequence[str | os.PathLike] | str | os.PathLike, role: str = "data") -> list[str]:
    """The text files a corpus names: a folder stands for its files (hidden ones aside) and a pattern (`*`, `?`, `[`)
    naming no file itself for the files it matches, each in sorted order, as the 1B Word Benchmark's shards."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    expanded = []
    for name in map(os.fspath, files):
        if os.path.isdir(name):
            shards = sorted(str(p) for p in Path(name).iterdir() if p.is_file() and not p.name.startswith("."))
            if not shards:
                raise ValueError(f"{role.capitalize()} folder {name!r} holds no file.")
        elif not os.path.exists(name) and set("*?[") & set(name):
            shards = sorted(glob.glob(name))
            if not shards:
                raise ValueError(f"{role.capitalize()} files {name!r}: no file matches the pattern.")
        else:
            shards = [name]
        expanded += shards
    return expanded


def check_text_files(files: Sequence[str | os.PathLike], role: str = "data") -> list[str]:
    """Paths as strings (folders and patterns as `expand_shards` gives them); raises if one is missing, not a file, not
    UTF-8 text (naming the line), or has no word at all. Reads every file once, in blocks."""
    files = expand_shards(files, role)
    if not files:
        raise ValueError(f"No {role} files given.")
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{role.capitalize()} file {path!r} does not exist or is not a file.")
        decoder, has_words = codecs.getincrementaldecoder("utf-8-sig")(), False
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    text = decoder.decode(block)
                    has_words = has_words or not (text.isspace() or not text)
                decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ValueError(f"{role.capitalize()} file {path!r}: {_first_invalid_line(path)}.") from None
        if not has_words:
            raise ValueError(f"{role.capitalize()} file {path!r} is empty: it has no words.")
    return files


def _first_invalid_line(path) -> str:
    """Where the first invalid UTF-8 of a file is, counting lines as text mode does (LF, CRLF and CR end a line)."""
    number = 0
    with open(path, "rb") as f:
        for chunk in f:
            for line in chunk.splitlines():
                number += 1
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    return f"line {number} is not valid UTF-8 (byte {error.start + 1}: {error.reason})"
    return "not valid UTF-8"  # a multi-byte character cut by the end of the file: the last line


def iter_sentences(
    files: Sequence[str | os.PathLike],
    split: str = "whitespace",
    tokenizer: ElmoTokenizer | None = None,
    locations: bool = False,
    blank_lines: bool = False,
) -> Iterator[list[str]] | Iterator[tuple[str, list[str]]]:
    """The word lists of the non-blank lines of `files` (with `blank_lines`, of every line, a blank one as an empty
    sentence, as bilm-tf reads them), in order; with `locations`, `("file, line N", words)` pairs. The lines are
    those of `file_io.read_lines`."""
    _check_split(split, tokenizer)
    for path in expand_shards(files):
        for number, line in enumerate(read_lines(path), start=1):
            where = f"{path}, line {number}"
            words = split_line(line, split, tokenizer, where)
            if words or blank_lines:
                yield (where, words) if locations else words


def build_word_vocabulary(
    files: Sequence[str | os.PathLike],
    split: str = "whitespace",
    tokenizer: ElmoTokenizer | None = None,
    min_count: int = 1,
    max_size: int | None = None,
) -> list[str]:
    """The vocabulary of the corpus in `files` (`word_vocabulary.count_word_vocabulary`): `<S>`, `</S>`, `<UNK>`,
    then the words seen at least `min_count` times, most frequent first, at most `max_size` entries in all. Save it
    with `word_vocabulary.write_word_vocabulary`."""
    files = check_text_files(files, "corpus")
    return count_word_vocabulary(iter_sentences(files, split, tokenizer), min_count, max_size)


def residue_text_files(fasta_files: Sequence[str | os.PathLike], cache_dir: str | os.PathLike) -> list[str]:
    """The protein sequences of FASTA files (`io.fasta`, read as SeqVec reads them) as text files a biLM trains on
    with `split="whitespace"`: one protein per line, its residues as words, in file order; one file per FASTA file
    under `cache_dir/hf_elmo_residues`, named by the FASTA file's SHA-256, made once and checked against its record
    (length and digest, written last) before each use."""
    folder = Path(cache_dir) / "hf_elmo_residues"
    texts = []
    for fasta in expand_shards(fasta_files, "FASTA"):
        if not os.path.isfile(fasta):
            raise ElmoInputError(f"{fasta}: no such FASTA file")
        text = folder / f"{Path(fasta).stem}-{length_and_digest(Path(fasta))['sha256'][:16]}.txt"
        damage = cache_file_damage(text) if text.exists() else None
        if damage is not None:
            logger.warning(f"{text}: a damaged residue text ({damage}): made again from {fasta}")
            remove_cache_file(text)
        if not text.exists():
            records = read_fasta(fasta)
            folder.mkdir(parents=True, exist_ok=True)

            def write(path, records=records):
                with open(path, "w", encoding="utf-8") as out:
                    out.writelines(" ".join(record.sequence) + "\n" for record in records)

            replace_atomically(text, write)
            record_cache_file(text)
        texts.append(str(text))
    return texts
