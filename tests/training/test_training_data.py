"""The training data: windows of whole sentences and their targets, the word vocabulary, the collator, compact windows
(the same batches and loss as full rows, prepared once), shards, bad data and vocabulary files.
"""

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FIXTURES
from transformers import AutoTokenizer

from hf_elmo import ElmoTokenizer
from hf_elmo.character_rows import words_to_char_ids
from hf_elmo.folder_files import cache_record_path
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.corpus import build_word_vocabulary, iter_sentences
from hf_elmo.training.windows import encode_windows, load_bilm_dataset, pack_sentences, window_arrays
from hf_elmo.training.word_table import STORED_WINDOWS, WordTable, load_compact_bilm_dataset
from hf_elmo.word_vocabulary import read_word_vocabulary, write_word_vocabulary

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = ROOT / "data/tinyshakespeare/input.txt"
BILM_TF_TRAIN = FIXTURES / "bilm-tf/train"


def tokenizer_with(words):
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(words)
    return tokenizer


def test_window_layout_and_targets():
    vocab = ["<S>", "</S>", "<UNK>", "a", "b", "c"]
    encoded = encode_windows([[["a", "b"], ["c", "zz"]]], tokenizer_with(vocab))
    (ids,), (labels,) = encoded["input_ids"], encoded["labels"]
    # <S> a b </S> <S> c zz </S>: each sentence is its own LM problem, nothing predicted across sentences.
    S, E, U, a, b, c, none = 0, 1, 2, 3, 4, 5, -100
    assert labels[:, 0].tolist() == [a, b, E, none, c, U, E, none]  # the next word
    assert labels[:, 1].tolist() == [none, S, a, b, none, S, c, U]  # the previous word
    tokenizer = ElmoTokenizer()
    expected = np.concatenate(
        [
            tokenizer([s], is_split_into_words=True, return_tensors="np")["input_ids"][0]
            for s in (["a", "b"], ["c", "zz"])
        ]
    )
    assert np.array_equal(ids, expected)


def test_packing_is_greedy_and_keeps_every_sentence_once():
    sentences = [["w"] * n for n in [3, 5, 1, 10, 18, 2, 2, 7]]
    windows = list(pack_sentences(sentences, window=20))
    assert [s for w in windows for s in w] == sentences
    for window, following in zip(windows, windows[1:] + [None]):
        used = sum(len(s) + 2 for s in window)
        assert used <= 20
        if following is not None:
            assert used + len(following[0]) + 2 > 20  # the next sentence did not fit
    assert list(pack_sentences([["a"], ["w"] * 19, ["b"]], 20)) == [[["a"]], [["w"] * 19], [["b"]]]  # alone


def test_a_sentence_longer_than_the_window_is_cut_and_each_target_kept_once():
    tokenizer = tokenizer_with(["<S>", "</S>", "<UNK>", "a", "b", "w"])
    sentences = [["a", "b"], ["w"] * 9, ["b"]]
    cut = encode_windows(list(pack_sentences(sentences, 5)), tokenizer, window=5)
    assert [len(ids) for ids in cut["input_ids"]] == [4, 5, 5, 1, 3]
    # The windows read the same positions with the same targets as one window holding everything, uncut.
    whole = encode_windows([sentences], tokenizer)
    for name in ("input_ids", "labels"):
        assert np.array_equal(np.concatenate(cut[name]), whole[name][0])


def test_vocabulary_builder_counts_the_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\n\nthe dog sat down\nthe cat\n", encoding="utf-8")
    counts = Counter(corpus.read_text().split())
    words = build_word_vocabulary([corpus])
    assert words[:3] == ["<S>", "</S>", "<UNK>"]
    assert sorted(words[3:]) == sorted(counts)
    assert [counts[w] for w in words[3:]] == sorted(counts.values(), reverse=True)
    assert build_word_vocabulary([corpus], min_count=2) == ["<S>", "</S>", "<UNK>", "the", "cat", "sat"]
    assert build_word_vocabulary([corpus], max_size=4) == ["<S>", "</S>", "<UNK>", "the"]
    path = write_word_vocabulary(words, tmp_path / "vocab.txt")
    assert read_word_vocabulary(path) == words


def test_original_vocabulary_file_and_tokenizer_round_trip(tmp_path):
    words = read_word_vocabulary(BILM_TF_TRAIN / "vocab.txt")
    tokenizer = tokenizer_with(words)
    assert tokenizer.word_targets(["of", "the", "no-such-word", "<S>", "</S>"]).tolist() == [3, 4, 2, 0, 1]
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8") == (BILM_TF_TRAIN / "vocab.txt").read_text()
    assert AutoTokenizer.from_pretrained(tmp_path).word_vocabulary == words
    with pytest.raises(ValueError, match="has no word vocabulary"):
        ElmoTokenizer().word_targets(["a"])


@pytest.mark.parametrize(
    "lines, message",
    [
        (["the", "<S>", "</S>", "<UNK>"], "line 1 must be '<S>'"),
        (["<S>", "</S>", "the"], "line 3 must be '<UNK>'"),
        (["<S>", "</S>"], "line 3 must be '<UNK>'.*got None"),
        (["<S>", "</S>", "<UNK>", "a", "b", "a"], "'a' appears twice \\(line 4 and 6\\)"),
        (["<S>", "</S>", "<UNK>", "the 12"], "line 4 must be one token without whitespace"),
        (["<S>", "</S>", "<UNK>", ""], "line 4 must be one token"),
    ],
)
def test_bad_vocabulary_files(tmp_path, lines, message):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"Word vocabulary '{path}': {message}"):
        read_word_vocabulary(path)
    with pytest.raises(ValueError, match=message):
        ElmoTokenizer(word_vocab_file=str(path))


def test_dataset_windows_hold_every_sentence_in_order(tmp_path):
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()[:2500]  # more than one map batch of 1000 lines
    corpus = tmp_path / "slice.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([corpus], "pretokenizer", tokenizer, min_count=2))
    sentences = list(iter_sentences([corpus], "pretokenizer", tokenizer))
    flat = [w for s in sentences for w in ["<S>", *s, "</S>"]]

    dataset = load_bilm_dataset([corpus], tokenizer, window=22, split="pretokenizer", cache_dir=tmp_path / "cache")
    windows = [window_arrays(row) for row in dataset]
    assert all(len(ids) <= 22 for ids, _ in windows)
    assert np.array_equal(np.concatenate([ids for ids, _ in windows]), words_to_char_ids(flat))
    expected = encode_windows(list(pack_sentences(sentences, 22)), tokenizer)["labels"]
    # Targets never cross sentences, so they do not depend on where the windows were cut.
    assert np.array_equal(np.concatenate([labels for _, labels in windows]), np.concatenate(expected))
    streamed = load_bilm_dataset([corpus], tokenizer, window=22, split="pretokenizer", streaming=True)
    assert all(np.array_equal(a["labels"], b["labels"]) for a, b in zip(dataset, streamed, strict=True))


def test_collator_pads_with_zero_rows_and_ignored_targets():
    tokenizer = tokenizer_with(["<S>", "</S>", "<UNK>", "a"])
    encoded = encode_windows([[["a", "a", "a"]], [["a"]]], tokenizer)
    examples = [{"input_ids": ids, "labels": labels} for ids, labels in zip(encoded["input_ids"], encoded["labels"])]
    batch = DataCollatorForBiLM(pad_to_multiple_of=8)(examples)
    assert batch["input_ids"].shape == (2, 8, 50) and batch["labels"].shape == (2, 8, 2)
    assert batch["attention_mask"].tolist() == [[1] * 5 + [0] * 3, [1] * 3 + [0] * 5]
    assert torch.all(batch["input_ids"][1, 3:] == 0) and torch.all(batch["labels"][1, 3:] == -100)
    assert torch.equal(batch["labels"][0, :5], torch.from_numpy(encoded["labels"][0]).long())
    flattened = [{name: np.asarray(value).reshape(-1) for name, value in e.items()} for e in examples]
    flat_batch = DataCollatorForBiLM(pad_to_multiple_of=8)(flattened)
    assert all(torch.equal(flat_batch[k], batch[k]) for k in batch)
    expected_shapes = r"Example 0: expected input_ids \(T, C\) and labels \(T, 2\) \(or flattened\)"
    with pytest.raises(ValueError, match=expected_shapes):
        DataCollatorForBiLM()([{"input_ids": encoded["input_ids"][0], "labels": encoded["labels"][1]}])
    with pytest.raises(ValueError, match=expected_shapes):  # an odd number of flat targets
        DataCollatorForBiLM()([{"input_ids": flattened[0]["input_ids"], "labels": flattened[0]["labels"][:-1]}])
    with pytest.raises(ValueError, match=expected_shapes):  # characters not a whole number of rows
        DataCollatorForBiLM()([{"input_ids": flattened[0]["input_ids"][:-1], "labels": flattened[0]["labels"]}])
    with pytest.raises(ValueError, match="Example 1: 49 characters per position, example 0 has 50"):
        DataCollatorForBiLM()(
            [examples[0], {"input_ids": encoded["input_ids"][1][:, :49], "labels": encoded["labels"][1]}]
        )


def test_bad_data_files(tmp_path):
    tokenizer = tokenizer_with(["<S>", "</S>", "<UNK>"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"Training file '{empty}' is empty"):
        load_bilm_dataset([empty], tokenizer, role="training")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_bilm_dataset([tmp_path / "missing.txt"], tokenizer)
    long = tmp_path / "long.txt"
    long.write_text("a b\n\n" + " ".join(["w"] * 30) + "\n", encoding="utf-8")
    # A line longer than the window is cut, not refused.
    cut = load_bilm_dataset([long], tokenizer, window=20, cache_dir=tmp_path / "cache")
    assert [len(window_arrays(row)[0]) for row in cut] == [4, 20, 12]
    with pytest.raises(ValueError, match="has no word vocabulary"):
        load_bilm_dataset([long], ElmoTokenizer())


def test_perplexity_of_a_line_longer_than_the_window_scores_its_cut_windows(tmp_path):
    from hf_elmo import ElmoConfig, ElmoForBiLM
    from hf_elmo.character_rows import BOS_TOKEN, EOS_TOKEN
    from hf_elmo.training.perplexity import compute_perplexity

    words = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "on", "mat", "."]
    tokenizer = tokenizer_with(words)
    torch.manual_seed(0)
    config = ElmoConfig(
        char_embedding_dim=4,
        filters=[[1, 4], [2, 4]],
        n_highway=1,
        cell_dim=8,
        projection_dim=4,
        num_layers=1,
        vocab_size=len(words),
    )
    model = ElmoForBiLM(config).eval()
    text = tmp_path / "long.txt"
    text.write_text("the cat sat on the mat .\n", encoding="utf-8")

    # By hand: <S> the cat sat on | the mat . </S>, each window from the start state, every target once.
    S, E, the, cat, sat, on, mat, dot, none = 0, 1, 3, 4, 5, 6, 7, 8, -100
    windows = [
        ([BOS_TOKEN, "the", "cat", "sat", "on"], [[the, none], [cat, S], [sat, the], [on, cat], [the, sat]]),
        (["the", "mat", ".", EOS_TOKEN], [[mat, on], [dot, the], [E, mat], [none, dot]]),
    ]
    nll = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for positions, labels in windows:
            ids = torch.from_numpy(tokenizer.characters.rows(positions).astype(np.int64))[None]
            out = model(input_ids=ids, labels=torch.tensor([labels]))
            counts = torch.tensor(labels).ne(none).sum(dim=0)
            nll += torch.stack([out.forward_loss, out.backward_loss]).double() * counts
    expected = torch.exp(nll / 8).tolist()

    result = compute_perplexity(model, tokenizer, [text], window=5, split="whitespace")
    assert result["targets"] == 8
    assert [result["forward"], result["backward"]] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("streaming", [False, True], ids=["cached", "streaming"])
def test_training_windows_read_lines_as_every_command_does(tmp_path, streaming):
    """A byte-order mark is not part of the first word, `\\n`, `\\r\\n` and `\\r` end lines and nothing else does
    (U+2028, form feed and vertical tab stay inside a line, as `file_io.read_lines` keeps them); an edited file is read
    again, not taken from the cache."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("\ufeffa b\r\nc\u2028d\rb\x0ca\x0bc\nd\n".encode("utf-8"))
    tokenizer = tokenizer_with(["<S>", "</S>", "<UNK>", "a", "b", "c", "d"])
    sentences = [["a", "b"], ["c", "d"], ["b", "a", "c"], ["d"]]
    flat = [w for s in sentences for w in ["<S>", *s, "</S>"]]
    options = dict(window=20, split="whitespace", streaming=streaming, cache_dir=tmp_path / "cache")
    windows = [window_arrays(row) for row in load_bilm_dataset([corpus], tokenizer, **options)]
    assert np.array_equal(np.concatenate([ids for ids, _ in windows]), words_to_char_ids(flat))
    corpus.write_text("d c\n", encoding="utf-8")
    windows = [window_arrays(row) for row in load_bilm_dataset([corpus], tokenizer, **options)]
    assert np.array_equal(np.concatenate([ids for ids, _ in windows]), words_to_char_ids(["<S>", "d", "c", "</S>"]))


def hostile_corpus(folder: Path) -> list[Path]:
    """Two files: sentences longer than the window, blank lines, the literal words <S>, </S> and <UNK>, words outside
    the vocabulary, and more lines than one packing block (1000)."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(60)] + ["<S>", "</S>", "<UNK>", "é" * 40]
    files = []
    for name, count in (("a.txt", 2300), ("b.txt", 400)):
        lengths = rng.choice([0, 1, 2, 5, 9, 17, 18, 19, 30, 41], count)
        lines = [" ".join(rng.choice(words, n)) for n in lengths]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        files.append(folder / name)
    return files


@pytest.mark.parametrize("window", [20, 7])
def test_compact_windows_give_the_batches_and_the_loss_of_full_rows(tmp_path, window):
    from hf_elmo import ElmoConfig, ElmoForBiLM

    files = hostile_corpus(tmp_path)
    tokenizer = tokenizer_with(build_word_vocabulary(files, max_size=40))  # words outside it: <UNK> targets
    full = load_bilm_dataset(files, tokenizer, window, cache_dir=tmp_path / "full")
    table = WordTable.of_files(files, tokenizer)
    compact = load_compact_bilm_dataset(files, table, tokenizer, window, cache_dir=tmp_path / "compact", processes=1)
    assert len(compact) == len(full)
    # Three processes share the blocks of lines of each file (fewer files than processes): the same rows.
    shared = load_compact_bilm_dataset(files, table, tokenizer, window, cache_dir=tmp_path / "shared", processes=3)
    assert all(np.array_equal(a["positions"], b["positions"]) for a, b in zip(shared, compact, strict=True))
    order = np.random.default_rng(0).permutation(len(full))
    model = ElmoForBiLM(
        ElmoConfig(
            filters=[[1, 4], [2, 4]],
            n_highway=1,
            cell_dim=8,
            projection_dim=4,
            num_layers=1,
            vocab_size=len(tokenizer.word_vocabulary),
        )
    ).eval()
    for start in range(0, len(order), 64):
        rows = order[start : start + 64].tolist()
        expected = DataCollatorForBiLM(pad_to_multiple_of=8)([full[i] for i in rows])
        batch = DataCollatorForBiLM(pad_to_multiple_of=8, words=table)([compact[i] for i in rows])
        assert all(torch.equal(batch[name], expected[name]) for name in expected)
        with torch.no_grad():
            assert torch.equal(model(**batch).loss, model(**expected).loss)
        # The stored windows made into the batch where the model runs, as `ElmoTrainer` does.
        stored = DataCollatorForBiLM(pad_to_multiple_of=8, words=table, stored_only=True)([compact[i] for i in rows])
        for device in DEVICES:
            made = table.expand(stored[STORED_WINDOWS].to(device))
            assert all(
                made[name].device.type == device and torch.equal(made[name].cpu(), expected[name]) for name in expected
            )


def test_a_data_loader_gets_the_compact_rows_and_the_batches_of_full_rows(tmp_path):
    """The windows a `DataLoader` fetches for a batch (one Arrow slice) are the rows `datasets` gives one by one, and
    its batches, in the main process or a worker, those of the full rows: made by the collator, or from the stored
    windows alone (`stored_only`, one int32 tensor) by `WordTable.expand` where the model runs."""
    files = hostile_corpus(tmp_path)
    tokenizer = tokenizer_with(build_word_vocabulary(files, max_size=40))
    full = load_bilm_dataset(files, tokenizer, cache_dir=tmp_path / "full")
    table = WordTable.of_files(files, tokenizer)
    compact = load_compact_bilm_dataset(files, table, tokenizer, cache_dir=tmp_path / "compact", processes=1)
    order = np.random.default_rng(1).permutation(len(compact)).tolist()
    # One row, the last, and rows of both files in random order.
    for keys in ([7], [len(compact) - 1], order[:300]):
        fetched = compact.__getitems__(keys)
        expected = [compact[i]["positions"] for i in keys]
        assert len(fetched) == len(keys)
        assert all(
            np.array_equal(a["positions"], b) and a["positions"].dtype == b.dtype for a, b in zip(fetched, expected)
        )
    for workers, stored_only in ((0, False), (1, False), (0, True), (1, True)):
        collate = DataCollatorForBiLM(pad_to_multiple_of=8, words=table, stored_only=stored_only)
        loader = torch.utils.data.DataLoader(
            compact, batch_size=64, sampler=order, collate_fn=collate, num_workers=workers
        )
        for start, batch in zip(range(0, len(order), 64), loader, strict=True):
            expected = DataCollatorForBiLM(pad_to_multiple_of=8)([full[i] for i in order[start : start + 64]])
            if stored_only:
                assert batch.keys() == {STORED_WINDOWS} and batch[STORED_WINDOWS].dtype == torch.int32
                batch = table.expand(batch[STORED_WINDOWS])
            assert batch.keys() == expected.keys()
            assert all(
                batch[name].dtype == expected[name].dtype and torch.equal(batch[name], expected[name])
                for name in expected
            )


def test_datasets_made_from_compact_windows_stay_compact_windows_of_their_table(tmp_path):
    """`select`, `shuffle`, `filter`, `train_test_split` ... of the compact windows are windows of the same table:
    their batches (one Arrow slice each) are those of the full rows chosen the same way, and a collator of another
    table refuses them."""
    from hf_elmo.training.window_dataset import WindowDataset

    files = hostile_corpus(tmp_path)
    tokenizer = tokenizer_with(build_word_vocabulary(files, max_size=40))
    full = load_bilm_dataset(files, tokenizer, cache_dir=tmp_path / "full")
    table = WordTable.of_files(files, tokenizer)
    compact = load_compact_bilm_dataset(files, table, tokenizer, cache_dir=tmp_path / "compact", processes=1)
    chosen = np.random.default_rng(2).permutation(len(compact))[:150].tolist()
    made = {
        "select": lambda d: d.select(chosen),
        "shuffle": lambda d: d.shuffle(seed=3),
        "filter": lambda d: d.filter(lambda row: len(row["positions" if "positions" in row else "labels"]) % 3 == 1),
        "train_test_split": lambda d: d.train_test_split(test_size=0.2, seed=4)["test"],
        "select, then shuffle": lambda d: d.select(chosen).shuffle(seed=5),
    }
    other = WordTable.of_files(files, tokenizer_with(build_word_vocabulary(files, max_size=20)))
    for name, make in made.items():
        windows, rows = make(compact), make(full)
        assert isinstance(windows, WindowDataset) and len(windows) == len(rows) > 0, name
        keys = list(range(len(windows)))[::-1][:64]
        batch = DataCollatorForBiLM(words=table)(windows.__getitems__(keys))
        expected = DataCollatorForBiLM()([rows[i] for i in keys])
        assert all(torch.equal(batch[k], expected[k]) for k in expected), name
        with pytest.raises(ValueError, match="prepared with another word table than the collator's"):
            DataCollatorForBiLM(words=other)(windows.__getitems__(keys))


def test_compact_windows_take_a_few_bytes_a_position_and_are_prepared_once(tmp_path):
    files = hostile_corpus(tmp_path)
    tokenizer = tokenizer_with(build_word_vocabulary(files))
    table = WordTable.of_files(files, tokenizer)
    cache = tmp_path / "cache"
    dataset = load_compact_bilm_dataset(files, table, tokenizer, cache_dir=cache)
    positions = sum(len(row["positions"]) - 2 for row in dataset)
    stored = sorted(cache.rglob("*.arrow"))
    assert len(stored) == 2 and sum(p.stat().st_size for p in stored) <= 8 * positions
    records = [cache_record_path(p) for p in stored]  # each file's length and digest, written after it
    assert sorted(p for p in cache.rglob("*") if p.is_file()) == sorted(stored + records)  # nothing half-written left
    times = {p: p.stat().st_mtime_ns for p in stored}
    load_compact_bilm_dataset(files, table, tokenizer, cache_dir=cache)
    assert {p: p.stat().st_mtime_ns for p in sorted(cache.rglob("*.arrow"))} == times
    files[1].write_text("w1 w2\n", encoding="utf-8")  # edited: prepared again, the other file not
    edited = load_compact_bilm_dataset(files, table, tokenizer, cache_dir=cache)
    assert len(list(cache.rglob("*.arrow"))) == 3 and all(p.stat().st_mtime_ns == t for p, t in times.items())
    assert edited[-1]["positions"].tolist() == [-1, 0, table.index["w1"], table.index["w2"], 1, -1]


def test_parts_left_by_killed_writers_of_this_machine_are_removed_and_the_others_kept(tmp_path):
    """A writer killed while it prepared a file leaves its parts, named by host and process id: the next preparation
    removes those of ended processes of this machine and keeps those of running writers and of other machines."""
    files = hostile_corpus(tmp_path)
    tokenizer = tokenizer_with(build_word_vocabulary(files))
    table = WordTable.of_files(files, tokenizer)
    cache = tmp_path / "cache"
    load_compact_bilm_dataset(files[:1], table, tokenizer, cache_dir=cache, processes=1)
    (target,) = (cache / "hf_elmo_windows").glob("*.arrow")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, dead = socket.gethostname(), int(ended.stdout)
    left = [f".{target.name}.{host}.{dead}.partial", f".{target.name}.{host}.{dead}.partial.1"]
    kept = [f".{target.name}.{host}.{os.getpid()}.partial.0", f".{target.name}.other-{host}.{dead}.partial"]
    for name in left + kept:
        (target.parent / name).write_bytes(b"cut short")
    load_compact_bilm_dataset(files[:1], table, tokenizer, cache_dir=cache, processes=1)
    assert sorted(path.name for path in target.parent.glob(".*")) == sorted(kept)


def test_a_folder_or_a_pattern_of_shards_reads_as_its_files_in_order(tmp_path):
    first, second = hostile_corpus(tmp_path)
    shards = tmp_path / "shards"
    shards.mkdir()
    lines = (first.read_text(encoding="utf-8") + second.read_text(encoding="utf-8")).splitlines(keepends=True)
    names = [f"part-{i:02d}.txt" for i in range(5)]
    for index, name in enumerate(names):
        (shards / name).write_text("".join(lines[index::5]), encoding="utf-8")
    (shards / ".notes").write_text("not a shard\n", encoding="utf-8")
    listed = [shards / name for name in names]
    tokenizer = tokenizer_with(build_word_vocabulary(listed, max_size=40))
    assert build_word_vocabulary([shards], max_size=40) == tokenizer.word_vocabulary
    table = WordTable.of_files(listed, tokenizer)
    expected = load_compact_bilm_dataset(listed, table, tokenizer, cache_dir=tmp_path / "one", processes=1)
    for corpus in ([shards], [str(shards / "part-*.txt")]):
        assert WordTable.of_files(corpus, tokenizer).words == table.words
        # Prepared by several processes (one per shard, up to one per core) into a cache of its own.
        dataset = load_compact_bilm_dataset(corpus, table, tokenizer, cache_dir=tmp_path / type(corpus[0]).__name__)
        assert len(dataset) == len(expected)
        assert all(np.array_equal(a["positions"], b["positions"]) for a, b in zip(dataset, expected))
