"""The training data and `ElmoTrainer` given careless or hostile input through Python (word tables, stored windows,
collators, stream datasets, Trainer options): a `ValueError` naming the problem, nothing changed; a byte-order mark
is not part of a word.
"""

import pytest
from hostile import (
    CORPUS,
    check_api_refusal,
    collate_compact,
    collate_with_another_table,
    compact_windows,
    full_row,
    stream_dataset_then,
    trainer_of_a_smaller_softmax,
    trainer_with,
    windows_split_otherwise,
    word_table,
    write,
)

from hf_elmo import ElmoTokenizer
from hf_elmo.training.collator import DataCollatorForBiLM
from hf_elmo.training.word_table import WordTable

API_CASES = {
    # --- compact training data, its guard-rails and embedding in several processes ---
    "compact windows of a file with the word table of other files": (
        [],
        lambda root: compact_windows(root, table_words=[]),
        r"^corpus\.txt: the word 'on' is not in the word table: the file changed after the table was made from it, or "
        r"the table was made from other files$",
    ),
    "a compact window too short": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [0, 50]),
        r"^Example 1: expected a stored window of 3 entries or more, got \(2,\)\.$",
    ),
    "compact windows collated with the word table of other files": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, 50, 1, -1]),
        r"^Example 1: stored word indices must be in \[-1, 8\], got \[-1, 50\]: the window was prepared with another "
        r"word table\.$",
    ),
    "a word table without a word vocabulary": (
        [],
        lambda root: WordTable(ElmoTokenizer(), ["a"]),
        r"^The tokenizer has no word vocabulary for the LM targets",
    ),
    # --- lazy streams (train --stream over shards) ---
    "a stream dataset's shard removed after the run started": (
        *stream_dataset_then(lambda root: (root / "shards/b.txt").unlink()),
        r"^shards/b\.txt: cannot read input \(No such file or directory\)$",
    ),
    "a stream dataset's shard emptied after the run started": (
        *stream_dataset_then(write("shards/b.txt", "")),
        r"^Training file 'shards/b\.txt' is empty: it has no words\.$",
    ),
    "a stream dataset's shard made invalid UTF-8 after the run started": (
        *stream_dataset_then(write("shards/a.txt", b"the cat .\n\xff\n")),
        r"^shards/a\.txt: line 2 is not valid UTF-8 \(byte 1: invalid start byte\)$",
    ),
    "a stream dataset of one line for two processes": (
        *stream_dataset_then(lambda root: None, shards=("the cat .\n",), rank=1, processes=2),
        r"^Process 1 of 2 has no sentence of the training text to read: use fewer processes or more text\.$",
    ),
    # --- ElmoTrainer in a script of one's own: the rows of one collator given to the other ---
    "rows of load_bilm_dataset collated with a word table": (
        [],
        lambda root: DataCollatorForBiLM(words=word_table())([full_row()]),
        r"^Example 0: DataCollatorForBiLM\(words=\.\.\.\) takes stored windows \(positions, the rows of "
        r"load_compact_bilm_dataset\), got \['input_ids', 'labels'\]: rows of load_bilm_dataset need "
        r"DataCollatorForBiLM\(\) without words\.$",
    ),
    "stored windows collated without their word table": (
        [],
        lambda root: DataCollatorForBiLM()([{"positions": [-1, 0, 3, 1, -1]}]),
        r"^Example 0: expected input_ids and labels \(a row of load_bilm_dataset\), got \['positions'\]: stored "
        r"windows need DataCollatorForBiLM\(words=<their WordTable>\)\.$",
    ),
    "stored windows whose word indices are not integers": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, 3.5, 1, -1]),
        r"^Example 1: stored word indices must be integers, got float64\.$",
    ),
    "stored windows collated with the word table of other files": (
        [],
        collate_with_another_table,
        r"^Example 0: the window was prepared with another word table than the collator's \(of 13 words\): give "
        r"DataCollatorForBiLM the WordTable given to load_compact_bilm_dataset\.$",
    ),
    "a stored window with a neighbour's -1 among its positions": (
        [],
        collate_compact([-1, 0, 3, 1, -1], [-1, 0, -1, 1, -1]),
        r"^Example 1: the positions of a stored window must be word indices in \[0, 8\], got -1 \(-1 is only the "
        r"neighbour before or after them\)\.$",
    ),
    "compact windows split otherwise than the words of their word table": (
        [write("raw.txt", "A bird flew.\n")],
        windows_split_otherwise,
        r"^The word table was made of the words of split='whitespace', the windows would be split with "
        r"split='pretokenizer': give both the same split\.$",
    ),
    "ElmoTrainer of a model whose softmax is smaller than the word table's vocabulary": (
        [],
        trainer_of_a_smaller_softmax,
        r"^The word table's targets are word ids up to 8, the model's softmax has 5 \(vocab_size\): make the table "
        r"with the model's tokenizer, or the model with vocab_size=len\(tokenizer\.word_vocabulary\)\.$",
    ),
    # --- review of the batches made on the device: Trainer's losses of their own took the labels from the model ---
    "ElmoTrainer with label smoothing": (
        [],
        trainer_with({"label_smoothing_factor": 0.1}),
        r"^label_smoothing_factor must be 0 for ElmoForBiLM, got 0\.1: the model computes its loss itself, Trainer's "
        r"label smoothing would read logits it does not return\.$",
    ),
    "ElmoTrainer with a compute_loss_func": (
        [],
        trainer_with(compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss),
        r"^compute_loss_func: ElmoTrainer takes none, ElmoForBiLM computes its loss itself from the labels and "
        r"returns no logits; override compute_loss in a subclass instead\.$",
    ),
}


@pytest.mark.parametrize("name", API_CASES)
def test_api_refuses_with_a_clear_value_error(name, workspace):
    check_api_refusal(API_CASES[name], workspace)


def test_a_byte_order_mark_is_not_part_of_a_training_word(workspace):
    from hf_elmo.training.corpus import build_word_vocabulary
    from hf_elmo.training.windows import load_bilm_dataset

    (workspace / "bom.txt").write_bytes(b"\xef\xbb\xbf" + CORPUS.encode())
    words = build_word_vocabulary(["bom.txt"])
    assert words == build_word_vocabulary(["corpus.txt"]) and "\ufeffthe" not in words
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(words)
    with_mark, without = (load_bilm_dataset([name], tokenizer, cache_dir="cache") for name in ("bom.txt", "corpus.txt"))
    assert with_mark[0]["input_ids"].tolist() == without[0]["input_ids"].tolist()
