"""Damaged prepared windows caches and residue texts: named in one line and prepared again, never read short."""

import logging
import os
import re
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from hf_elmo import ElmoTokenizer
from hf_elmo.folder_files import cache_file_damage, cache_record_path
from hf_elmo.training.corpus import residue_text_files
from hf_elmo.training.windows import load_bilm_dataset
from hf_elmo.training.word_table import WordTable, load_compact_bilm_dataset

# --- prepared windows caches on disk ---------------------------------------------------------------------------------


def cut_at_a_record_batch_boundary(path):
    """The file without its last record batches and its end: a stream pyarrow reads whole, short (the whole file is
    kept beside it as `.whole`)."""
    shutil.copy(path, f"{path}.whole")
    with pa.OSFile(str(path)) as source:
        reader = pa.ipc.open_stream(source)
        reader.read_next_batch()
        reader.read_next_batch()
        boundary = source.tell()
    os.truncate(path, boundary)


def cut_inside_a_record_batch(path):
    os.truncate(path, path.stat().st_size * 2 // 3)


def emptied(path):
    os.truncate(path, 0)


def garbage(path):
    path.write_bytes(np.random.default_rng(0).integers(0, 256, path.stat().st_size, dtype=np.uint8).tobytes())


def other_valid_indices(path):
    """Every stored word index moved to the next word of the table, batch by batch: a valid file of other windows, of
    the same length."""
    with pa.OSFile(str(path)) as source:  # read into memory: a mapped file would be truncated under its batches
        batches = list(pa.ipc.open_stream(source))
    schema, largest = batches[0].schema, max(pc.max(pc.list_flatten(b.column(0))).as_py() for b in batches)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            column = batch.column(0)
            values = pc.list_flatten(column).to_numpy()
            moved = pa.array(np.where(values >= 0, (values + 1) % (largest + 1), values).astype(np.int32))
            writer.write_batch(pa.record_batch([pa.ListArray.from_arrays(column.offsets, moved)], schema=schema))


def record_removed(path):
    cache_record_path(path).unlink()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """2,500 lines: three record batches of windows (one per `LINES_PER_PACK` lines)."""
    folder = tmp_path_factory.mktemp("corpus")
    words = np.random.default_rng(1).integers(0, 40, size=(2500, 6)).astype(str)
    (folder / "corpus.txt").write_text("".join(" ".join(f"w{w}" for w in line) + "\n" for line in words))
    vocabulary = ["<S>", "</S>", "<UNK>", *(f"w{k}" for k in range(30))]
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(vocabulary)
    files = [folder / "corpus.txt"]
    return files, WordTable.of_files(files, tokenizer), tokenizer


@pytest.mark.parametrize(
    "damage, what",
    [
        (cut_at_a_record_batch_boundary, r"[\d,]+ bytes where corpus-key\.arrow\.record\.json records [\d,]+"),
        (cut_inside_a_record_batch, r"[\d,]+ bytes where .*\.record\.json records [\d,]+"),
        (emptied, r"0 bytes where .*\.record\.json records [\d,]+"),
        (garbage, r"its SHA-256 differs from the one .*\.record\.json records"),
        (other_valid_indices, r"its SHA-256 differs from the one .*\.record\.json records"),
        (record_removed, r"no .*\.arrow\.record\.json beside it \(its length and digest, written after the data\)"),
    ],
)
def test_a_damaged_windows_cache_is_named_in_one_line_and_prepared_again(corpus, tmp_path, caplog, damage, what):
    files, table, tokenizer = corpus
    fresh = load_compact_bilm_dataset(files, table, tokenizer, window=5, cache_dir=tmp_path, processes=1)
    expected = [row["positions"].tolist() for row in fresh]
    (stored,) = (tmp_path / "hf_elmo_windows").glob("*.arrow")
    whole = stored.read_bytes()
    damage(stored)
    if damage is cut_at_a_record_batch_boundary:  # the case: pyarrow reads it without complaint, short
        assert 0 < len(datasets.Dataset.from_file(str(stored))) < len(expected)
    with caplog.at_level(logging.WARNING, logger="hf_elmo.training.word_table"):
        again = load_compact_bilm_dataset(files, table, tokenizer, window=5, cache_dir=tmp_path, processes=1)
    assert [row["positions"].tolist() for row in again] == expected
    (line,) = [record.getMessage() for record in caplog.records]
    pattern = what.replace("corpus-key", re.escape(stored.stem))
    assert re.fullmatch(
        rf"{re.escape(str(stored))}: a damaged windows cache \({pattern}.*\): prepared again from .*corpus\.txt", line
    ), line
    assert stored.read_bytes() == whole and cache_file_damage(stored) is None


@pytest.mark.parametrize("damage", [cut_at_a_record_batch_boundary, garbage, record_removed])
@pytest.mark.parametrize("stored", ["generator-train.arrow", "cache-*.arrow"], ids=["lines", "windows"])
def test_a_damaged_datasets_cache_of_the_full_windows_is_named_and_prepared_again(
    corpus, tmp_path, caplog, damage, stored
):
    files, _, tokenizer = corpus
    fresh = load_bilm_dataset(files, tokenizer, window=5, cache_dir=tmp_path)
    expected = [(row["input_ids"].tolist(), row["labels"].tolist()) for row in fresh]
    (path,) = tmp_path.rglob(stored)
    damage(path)
    if damage is cut_at_a_record_batch_boundary:  # the case: datasets reads it without complaint, short
        assert 0 < len(datasets.Dataset.from_file(str(path))) < len(datasets.Dataset.from_file(str(path) + ".whole"))
    with caplog.at_level(logging.WARNING, logger="hf_elmo.training.windows"):
        again = load_bilm_dataset(files, tokenizer, window=5, cache_dir=tmp_path)
    assert [(row["input_ids"].tolist(), row["labels"].tolist()) for row in again] == expected
    (line,) = [record.getMessage() for record in caplog.records]
    assert re.fullmatch(
        rf"{re.escape(str(path))}: a damaged windows cache \(.*\): prepared again from .*corpus\.txt", line
    )
    assert all(cache_file_damage(file) is None for file in tmp_path.rglob("*.arrow"))


@pytest.mark.parametrize(
    "damage, what",
    [
        (cut_inside_a_record_batch, r"[\d,]+ bytes where .*\.txt\.record\.json records [\d,]+"),
        (emptied, r"0 bytes where .*\.txt\.record\.json records [\d,]+"),
        (garbage, r"its SHA-256 differs from the one .*\.txt\.record\.json records"),
        (record_removed, r"no .*\.txt\.record\.json beside it \(its length and digest, written after the data\)"),
    ],
)
def test_a_damaged_residue_text_is_named_in_one_line_and_made_again(tmp_path, caplog, damage, what):
    fasta = tmp_path / "family.fasta"
    fasta.write_text(">p1 first\nMKTAYIAKQR\nQISFVKSHFS\n>p2\nMEEPQSDPSV\n", encoding="utf-8")
    (stored,) = residue_text_files([fasta], tmp_path / "cache")
    whole = Path(stored).read_bytes()
    assert whole == b"M K T A Y I A K Q R Q I S F V K S H F S\nM E E P Q S D P S V\n"
    damage(Path(stored))
    with caplog.at_level(logging.WARNING, logger="hf_elmo.training.corpus"):
        assert residue_text_files([fasta], tmp_path / "cache") == [stored]
    (line,) = [record.getMessage() for record in caplog.records]
    assert re.fullmatch(
        rf"{re.escape(stored)}: a damaged residue text \({what}\): made again from .*family\.fasta", line
    )
    assert Path(stored).read_bytes() == whole and cache_file_damage(Path(stored)) is None
