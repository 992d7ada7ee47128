"""Tests of the ELMo character-id tokenizer.

Expected rows are written out by hand from the rule of the original code (AllenNLP's `ELMoCharacterMapper`, bilm-tf's
`UnicodeCharsVocabulary`): a word is its UTF-8 bytes cut to the first 48, each byte b -> b + 1, between
begin-of-word 259 and end-of-word 260, the rest of its 50 slots the padding character 261; the sentence boundaries
are the rows of the <S> character 257 and the </S> character 258; a padding position is a row of zeros.
"""

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_elmo.batch_encoding_elmo import ElmoBatchEncoding
from hf_elmo.character_rows import BOS_WORD_IDS, EOS_WORD_IDS, MAX_WORD_LENGTH, words_to_char_ids
from hf_elmo.tokenization_elmo import ElmoTokenizer

BOW, EOW, PADC = 259, 260, 261
BOS_ROW = [259, 257, 260] + [261] * 47
EOS_ROW = [259, 258, 260] + [261] * 47
ZERO_ROW = [0] * 50


def row(*content):
    """Row for a word whose shifted byte ids are `content` (ids, not bytes)."""
    ids = [BOW, *content, EOW]
    return ids + [PADC] * (50 - len(ids))


@pytest.fixture(scope="module")
def tok():
    return ElmoTokenizer()


# --- character ids ------------------------------------------------------------------------------

HAND_ROWS = {
    # 'c' = 0x63, 'a' = 0x61, 't' = 0x74
    "cat": row(0x64, 0x62, 0x75),
    # é = c3 a9
    "café": row(0x64, 0x62, 0x67, 0xC4, 0xAA),
    # 日 = e6 97 a5, 本 = e6 9c ac
    "日本": row(0xE7, 0x98, 0xA6, 0xE7, 0x9D, 0xAD),
    # U+1F600 = f0 9f 98 80
    "😀": row(0xF1, 0xA0, 0x99, 0x81),
    # 60 ASCII bytes: only 48 are kept and the row is full
    "a" * 60: [BOW] + [0x62] * 48 + [EOW],
    # 1 + 30 * 2 bytes; the 48-byte cut keeps 'a', 23 whole é and the first byte (c3) of the 24th
    "a" + "é" * 30: [BOW, 0x62] + [0xC4, 0xAA] * 23 + [0xC4] + [EOW],
    # exactly 48 bytes: full row, nothing dropped
    "b" * 48: [BOW] + [0x63] * 48 + [EOW],
    # 47 bytes: one padding char left
    "b" * 47: [BOW] + [0x63] * 47 + [EOW, PADC],
    # a lone surrogate cannot be encoded and vanishes
    "a\ud800b": row(0x62, 0x63),
    "\udfff": row(),
    "": row(),
    "<S>": BOS_ROW,
    "</S>": EOS_ROW,
    # only the exact literals are boundaries: '<' = 0x3c, 's' = 0x73, '>' = 0x3e, '/' = 0x2f
    "<s>": row(0x3D, 0x74, 0x3F),
    "<S>x": row(0x3D, 0x54, 0x3F, 0x79),
    "</S": row(0x3D, 0x30, 0x54),
    # byte 0 and byte 255 never appear alone in UTF-8, but U+0000 is byte 00 -> id 1
    "\x00": row(0x01),
    # U+00FF = c3 bf
    "ÿ": row(0xC4, 0xC0),
}


@pytest.mark.parametrize("word", list(HAND_ROWS), ids=[repr(w)[:20] for w in HAND_ROWS])
def test_hand_derived_rows(word):
    ids = words_to_char_ids([word])
    assert ids.shape == (1, 50)
    assert ids.dtype == np.int64
    assert ids[0].tolist() == HAND_ROWS[word]


def test_many_words_at_once_match_one_by_one():
    words = list(HAND_ROWS)
    ids = words_to_char_ids(words)
    assert ids.shape == (len(words), 50)
    assert ids.tolist() == [HAND_ROWS[w] for w in words]
    assert words_to_char_ids([]).shape == (0, 50)


def test_boundary_constants():
    assert MAX_WORD_LENGTH == 50
    assert BOS_WORD_IDS.tolist() == BOS_ROW
    assert EOS_WORD_IDS.tolist() == EOS_ROW


@pytest.mark.parametrize("bad", [["ok", 3], ["ok", b"bytes"], ["ok", None], [["nested"]]])
def test_non_string_word_is_a_type_error(bad):
    with pytest.raises(TypeError, match="word 1|word 0"):
        words_to_char_ids(bad)


def test_single_string_is_not_a_word_list():
    with pytest.raises(TypeError):
        words_to_char_ids("cat")


# --- encoding batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
def test_batch_layout(tok, return_tensors):
    batch = [["the", "cat", "sat"], ["a"], []]
    enc = tok(batch, is_split_into_words=True, padding=True, return_tensors=return_tensors)
    assert isinstance(enc, ElmoBatchEncoding)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if return_tensors == "pt":
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
        ids, mask = ids.numpy(), mask.numpy()
    else:
        assert isinstance(ids, np.ndarray) and ids.dtype == np.int64
    assert ids.shape == (3, 5, 50)
    assert mask.shape == (3, 5)
    expected = [
        [BOS_ROW, row(0x75, 0x69, 0x66), row(0x64, 0x62, 0x75), row(0x74, 0x62, 0x75), EOS_ROW],
        [BOS_ROW, row(0x62), EOS_ROW, ZERO_ROW, ZERO_ROW],
        [BOS_ROW, EOS_ROW, ZERO_ROW, ZERO_ROW, ZERO_ROW],
    ]
    assert ids.tolist() == expected
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]


def test_without_special_tokens(tok):
    enc = tok(
        [["the", "cat"], ["a"]], is_split_into_words=True, add_special_tokens=False, padding=True, return_tensors="pt"
    )
    assert enc["input_ids"].tolist() == [
        [row(0x75, 0x69, 0x66), row(0x64, 0x62, 0x75)],
        [row(0x62), ZERO_ROW],
    ]
    assert enc["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert enc.word_ids(1) == [0, None]


def test_single_input_lists_and_batch_axis(tok):
    enc = tok(["hi", "you"], is_split_into_words=True)
    assert enc["input_ids"] == [BOS_ROW, row(0x69, 0x6A), row(0x7A, 0x70, 0x76), EOS_ROW]
    assert enc["attention_mask"] == [1, 1, 1, 1]
    assert enc.word_ids() == [None, 0, 1, None]
    for return_tensors in ("pt", "np"):
        enc = tok(["hi", "you"], is_split_into_words=True, return_tensors=return_tensors)
        assert tuple(enc["input_ids"].shape) == (1, 4, 50)
        assert tuple(enc["attention_mask"].shape) == (1, 4)
        assert enc.word_ids(0) == [None, 0, 1, None]
    enc = tok("hi you", return_tensors="pt")
    assert tuple(enc["input_ids"].shape) == (1, 4, 50)
    assert tok.encode("hi you") == [BOS_ROW, row(0x69, 0x6A), row(0x7A, 0x70, 0x76), EOS_ROW]


def test_empty_single_sentence(tok):
    enc = tok([], is_split_into_words=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == [[BOS_ROW, EOS_ROW]]
    enc = tok("", return_tensors="pt")
    assert enc["input_ids"].tolist() == [[BOS_ROW, EOS_ROW]]


def test_literal_boundary_words_map_to_boundary_rows(tok):
    enc = tok(["<S>", "x", "</S>"], is_split_into_words=True)
    assert enc["input_ids"] == [BOS_ROW, BOS_ROW, row(0x79), EOS_ROW, EOS_ROW]
    # the exact word alignment is still known from the encoding
    assert enc.word_ids() == [None, 0, 1, 2, None]


def test_truncation_keeps_end_boundary(tok):
    batch = [["a", "b", "c", "d", "e"], ["x"]]
    enc = tok(batch, is_split_into_words=True, truncation=True, max_length=4, padding=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == [
        [BOS_ROW, row(0x62), row(0x63), EOS_ROW],
        [BOS_ROW, row(0x79), EOS_ROW, ZERO_ROW],
    ]
    assert enc.word_ids(0) == [None, 0, 1, None]
    assert enc.word_ids(1) == [None, 0, None, None]
    # max_length alone (no padding argument) also truncates, as in transformers
    enc = tok(["a", "b", "c"], is_split_into_words=True, max_length=3)
    assert enc["input_ids"] == [BOS_ROW, row(0x62), EOS_ROW]
    # max_length == 2: only the boundaries
    enc = tok(["a", "b"], is_split_into_words=True, truncation=True, max_length=2)
    assert enc["input_ids"] == [BOS_ROW, EOS_ROW]
    with pytest.raises(ValueError, match="boundary"):
        tok(["a"], is_split_into_words=True, truncation=True, max_length=1)
    # without special tokens max_length counts words only
    enc = tok(["a", "b", "c"], is_split_into_words=True, truncation=True, max_length=2, add_special_tokens=False)
    assert enc["input_ids"] == [row(0x62), row(0x63)]


def test_left_truncation_keeps_last_words_and_their_indices():
    tok = ElmoTokenizer(truncation_side="left")
    enc = tok(["a", "b", "c", "d"], is_split_into_words=True, truncation=True, max_length=4)
    assert enc["input_ids"] == [BOS_ROW, row(0x64), row(0x65), EOS_ROW]
    assert enc.word_ids() == [None, 2, 3, None]


def test_padding_strategies(tok):
    batch = [["a", "b"], ["c"]]
    enc = tok(batch, is_split_into_words=True, padding="max_length", max_length=6, return_tensors="np")
    assert enc["input_ids"].shape == (2, 6, 50)
    assert enc["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert not enc["input_ids"][0, 4:].any()
    enc = tok(batch, is_split_into_words=True, padding=True, pad_to_multiple_of=8, return_tensors="np")
    assert enc["input_ids"].shape == (2, 8, 50)
    assert enc.word_ids(0) == [None, 0, 1, None, None, None, None, None]
    # no padding: ragged python lists, and no tensors
    enc = tok(batch, is_split_into_words=True)
    assert [len(x) for x in enc["input_ids"]] == [4, 3]
    assert enc["attention_mask"] == [[1, 1, 1, 1], [1, 1, 1]]
    with pytest.raises(ValueError, match="padding"):
        tok(batch, is_split_into_words=True, return_tensors="pt")


def test_optional_outputs(tok):
    enc = tok(
        [["a", "b"], ["c"]],
        is_split_into_words=True,
        padding=True,
        return_tensors="pt",
        return_special_tokens_mask=True,
        return_length=True,
        return_token_type_ids=True,
    )
    assert enc["special_tokens_mask"].tolist() == [[1, 0, 0, 1], [1, 0, 1, 1]]
    assert enc["length"].tolist() == [4, 3]
    assert enc["token_type_ids"].tolist() == [[0] * 4] * 2
    enc = tok(["a"], is_split_into_words=True, return_attention_mask=False)
    assert set(enc.keys()) == {"input_ids"}


def test_word_alignment_helpers(tok):
    enc = tok([["the", "cat", "sat"], ["hi"]], is_split_into_words=True, padding="max_length", max_length=6)
    assert enc.word_ids(0) == [None, 0, 1, 2, None, None]
    assert enc.word_ids(1) == [None, 0, None, None, None, None]
    assert enc.token_to_word(0, 2) == 1
    assert enc.token_to_word(0, 0) is None
    assert tuple(enc.word_to_tokens(0, 2)) == (3, 4)
    assert enc.word_to_tokens(1, 5) is None
    restored = pickle.loads(pickle.dumps(enc))
    assert restored.word_ids(0) == [None, 0, 1, 2, None, None]


# --- raw text -----------------------------------------------------------------------------------

SPLITS = {
    "I don't think it's raining, is it?": ["I", "do", "n't", "think", "it", "'s", "raining", ",", "is", "it", "?"],
    "It's we're I'll I've I'd I'm": ["It", "'s", "we", "'re", "I", "'ll", "I", "'ve", "I", "'d", "I", "'m"],
    "can't won't DON'T": ["ca", "n't", "wo", "n't", "DO", "N'T"],
    'She said: "yes" (quietly); ok!': ["She", "said", ":", '"', "yes", '"', "(", "quietly", ")", ";", "ok", "!"],
    "The U.S. grew 3.14% in 2019, e.g. 1,000 jobs.": [
        "The",
        "U.S.",
        "grew",
        "3.14",
        "%",
        "in",
        "2019",
        ",",
        "e.g.",
        "1,000",
        "jobs",
        ".",
    ],
    "O'Neill's well-known rock'n'roll...": ["O'Neill", "'s", "well-known", "rock'n'roll", "..."],
    "  spaces\tand\nnewlines  ": ["spaces", "and", "newlines"],
    "<S> hi </S>": ["<S>", "hi", "</S>"],
    "café 日本 😀😀": ["café", "日本", "😀", "😀"],
}


@pytest.mark.parametrize("text", list(SPLITS))
def test_split_words(tok, text):
    assert tok.split_words(text) == SPLITS[text]
    assert tok.tokenize(text) == SPLITS[text]
    assert [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)] == SPLITS[text]


def test_raw_text_batch_equals_pre_split(tok):
    texts = list(SPLITS)
    raw = tok(texts, padding=True, return_tensors="np")
    split = tok([SPLITS[t] for t in texts], is_split_into_words=True, padding=True, return_tensors="np")
    np.testing.assert_array_equal(raw["input_ids"], split["input_ids"])
    np.testing.assert_array_equal(raw["attention_mask"], split["attention_mask"])


def test_split_words_drops_lone_surrogates(tok):
    assert tok.split_words("a\ud800b c") == ["ab", "c"]


# --- decoding and vocabulary --------------------------------------------------------------------


def test_decode(tok):
    enc = tok([["I", "do", "n't", "know", "."], ["café"]], is_split_into_words=True, padding=True, return_tensors="pt")
    assert tok.decode(enc["input_ids"][0]) == "<S> I do n't know . </S>"
    assert tok.decode(enc["input_ids"][1]) == "<S> café </S> <pad> <pad> <pad> <pad>"
    assert tok.decode(enc["input_ids"][1], skip_special_tokens=True) == "café"
    assert tok.decode(enc["input_ids"][0].numpy(), skip_special_tokens=True, clean_up_tokenization_spaces=True) == (
        "I don't know."
    )
    assert tok.batch_decode(enc["input_ids"], skip_special_tokens=True) == ["I do n't know .", "café"]
    assert tok.decode(enc["input_ids"].tolist(), skip_special_tokens=True) == ["I do n't know .", "café"]
    # a cut inside a multi-byte character decodes with a replacement character
    cut = tok(["a" + "é" * 30], is_split_into_words=True, add_special_tokens=False)["input_ids"]
    assert tok.decode(cut) == "a" + "é" * 23 + "\ufffd"
    assert tok.decode(row(0x62)) == "a"
    assert tok.decode([]) == ""


def test_vocabulary(tok):
    vocab = tok.get_vocab()
    assert vocab["<pad>"] == 0 == tok.pad_token_id
    assert tok.bos_token == "<S>" and tok.eos_token == "</S>"
    assert vocab["<S>"] == 257 and vocab["</S>"] == 258
    assert tok.vocab_size == 262 == len(tok)
    assert sorted(vocab.values()) == list(range(262))
    assert tok.model_input_names == ["input_ids", "attention_mask"]
    assert tok.padding_side == "right"
    assert tok.convert_tokens_to_ids(["<pad>", "<S>", "</S>"]) == [0, 257, 258]
    assert tok.convert_ids_to_tokens(0) == "<pad>"
    assert tok.convert_ids_to_tokens([257, 258, 0x62]) == ["<S>", "</S>", "<0x61>"]
    assert tok.convert_tokens_to_ids("not-a-pseudo-token") is None
    ids = tok(["hi"], is_split_into_words=True, padding="max_length", max_length=4)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<S>", "hi", "</S>", "<pad>"]
    assert tok.convert_ids_to_tokens(ids, skip_special_tokens=True) == ["hi"]
    assert tok.num_special_tokens_to_add() == 2


def test_left_padding_is_refused(tok):
    with pytest.raises(ValueError, match="right"):
        ElmoTokenizer(padding_side="left")
    with pytest.raises(ValueError, match="right"):
        tok.padding_side = "left"
    with pytest.raises(ValueError, match="right"):
        tok([["a"], ["b", "c"]], is_split_into_words=True, padding=True, padding_side="left")
    assert tok.padding_side == "right"


@pytest.mark.parametrize(
    ("text", "kwargs", "error", "message"),
    [
        ([["a", 1]], {"is_split_into_words": True}, TypeError, "word 1"),
        (["a", None], {"is_split_into_words": True}, TypeError, "word 1"),
        ([[["a"]]], {"is_split_into_words": True}, TypeError, "nested list"),
        ([["a"], "b"], {"is_split_into_words": True}, TypeError, "nested list"),
        ([["a", "b"]], {}, ValueError, "is_split_into_words"),
        ("a b", {"is_split_into_words": True}, ValueError, "list of words"),
        (["a", 3], {}, TypeError, "Item 1"),
        (3, {}, TypeError, "int"),
    ],
)
def test_bad_input(tok, text, kwargs, error, message):
    with pytest.raises(error, match=message):
        tok(text, **kwargs)


# --- sentence pairs: each side a sentence of its own, as ELMo computes them --------------------------------------


def _alone(tok, sentences, **kwargs):
    return {key: value.tolist() for key, value in tok(sentences, padding=True, return_tensors="pt", **kwargs).items()}


@pytest.mark.parametrize("split", [False, True])
def test_pairs_encode_each_side_as_its_own_sentence(tok, split):
    premises, hypotheses = ["A man sleeps .", "Hi"], ["Someone is resting on a sofa", "Bye ."]
    if split:
        premises, hypotheses = [p.split() for p in premises], [h.split() for h in hypotheses]
    pair = tok(premises, hypotheses, padding=True, return_tensors="pt", is_split_into_words=split)
    first = _alone(tok, premises, is_split_into_words=split)
    second = _alone(tok, hypotheses, is_split_into_words=split)
    assert sorted(pair) == ["attention_mask", "input_ids", "pair_attention_mask", "pair_input_ids"]
    assert pair["input_ids"].tolist() == first["input_ids"]
    assert pair["attention_mask"].tolist() == first["attention_mask"]
    assert pair["pair_input_ids"].tolist() == second["input_ids"]
    assert pair["pair_attention_mask"].tolist() == second["attention_mask"]
    assert pair.word_ids(1) == [None, 0, None, None, None, None]
    assert pair.pair_word_ids(1) == [None, 0, 1, None, None, None, None, None]
    # one pair, keyword form: lists without a batch axis
    single = tok(text="A man sleeps .", text_pair="Bye .")
    assert single["input_ids"] == [BOS_ROW, row(0x42), row(0x6E, 0x62, 0x6F), *single["input_ids"][3:]]
    assert single["pair_input_ids"] == [BOS_ROW, row(0x43, 0x7A, 0x66), row(0x2F), EOS_ROW]
    assert single.pair_word_ids() == [None, 0, 1, None]


def test_pairs_are_not_truncated_unless_asked(tok):
    short, long = "a b", " ".join(["w"] * 30)
    pair = tok(long, long)
    assert (len(pair["input_ids"]), len(pair["pair_input_ids"])) == (32, 32)
    for strategy, lengths in (("longest_first", (5, 5)), ("only_first", (5, 32)), ("only_second", (32, 5))):
        pair = tok(long, long, truncation=strategy, max_length=5)
        assert (len(pair["input_ids"]), len(pair["pair_input_ids"])) == lengths, strategy
        assert pair["input_ids"][-1] == EOS_ROW and pair["pair_input_ids"][-1] == EOS_ROW
    assert len(tok(short, long, truncation=True, max_length=5)["input_ids"]) == 4


def test_pad_and_collators_pad_both_sides(tok):
    from transformers import DataCollatorWithPadding

    from hf_elmo.features.task_data import DataCollatorForElmo

    premises, hypotheses = [["a", "b"], ["c"]], [["d"], ["e", "f", "g"]]
    features = [
        dict(tok(p, h, is_split_into_words=True), labels=i) for i, (p, h) in enumerate(zip(premises, hypotheses))
    ]
    expected = tok(premises, hypotheses, is_split_into_words=True, padding=True, return_tensors="pt")
    for batch in (
        tok.pad(features, return_tensors="pt"),
        DataCollatorWithPadding(tok)(features),
        DataCollatorForElmo(tok)(features),
    ):
        for key in expected:
            assert batch[key].tolist() == expected[key].tolist(), key
        assert batch["labels"].tolist() == [0, 1]
    assert tok.pad(features).pair_word_ids(0) == [None, 0, None, None, None]
    with pytest.raises(ValueError, match="with and without `pair_input_ids`"):
        tok.pad([features[0], dict(tok(["x"], is_split_into_words=True))])


# --- save / load --------------------------------------------------------------------------------


def test_save_and_load_round_trip(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer_config.json").exists()
    batch = [["The", "café"], ["I", "do", "n't"]]
    expected = tok(batch, is_split_into_words=True, padding=True, return_tensors="np")
    for loaded in (ElmoTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert isinstance(loaded, ElmoTokenizer)
        assert loaded.pad_token_id == 0
        assert loaded.special_tokens_map == tok.special_tokens_map
        got = loaded(batch, is_split_into_words=True, padding=True, return_tensors="np")
        np.testing.assert_array_equal(got["input_ids"], expected["input_ids"])
        np.testing.assert_array_equal(got["attention_mask"], expected["attention_mask"])
        assert loaded.split_words("it's") == ["it", "'s"]


def test_pickle_and_deepcopy(tok):
    import copy

    for clone in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok)):
        assert clone.split_words("don't") == ["do", "n't"]
        assert clone(["a"], is_split_into_words=True)["input_ids"] == [BOS_ROW, row(0x62), EOS_ROW]


# --- padding encoded examples -------------------------------------------------------------------


def _examples(tok, sentences, **kwargs):
    return [dict(tok(words, is_split_into_words=True, **kwargs)) for words in sentences]


EXPECTED_PADDED = [
    [BOS_ROW, row(0x62), row(0x63), EOS_ROW],
    [BOS_ROW, row(0x64), EOS_ROW, ZERO_ROW],
]


def test_pad_list_of_examples(tok):
    for kwargs in ({}, {"return_attention_mask": False}):
        features = _examples(tok, [["a", "b"], ["c"]], **kwargs)
        assert ("attention_mask" in features[0]) == (kwargs == {})
        batch = tok.pad(features, return_tensors="pt")
        assert batch["input_ids"].tolist() == EXPECTED_PADDED
        assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
        assert batch.word_ids(1) == [None, 0, None, None]
    batch = tok.pad(_examples(tok, [["a", "b"], ["c"]]), padding="max_length", max_length=5, return_tensors="np")
    assert batch["input_ids"].shape == (2, 5, 50)
    # tensors in -> tensors out
    features = [{"input_ids": torch.tensor(f["input_ids"])} for f in _examples(tok, [["a", "b"], ["c"]])]
    batch = tok.pad(features)
    assert isinstance(batch["input_ids"], torch.Tensor)
    assert batch["input_ids"].tolist() == EXPECTED_PADDED


def test_pad_example_without_positions(tok):
    features = _examples(tok, [[], ["a"]], add_special_tokens=False)
    assert features[0]["input_ids"] == []
    batch = tok.pad(features, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[ZERO_ROW], [row(0x62)]]
    assert batch["attention_mask"].tolist() == [[0], [1]]


def test_pad_single_example_is_not_a_batch(tok):
    example = dict(tok(["a"], is_split_into_words=True))
    padded = tok.pad(example, padding="max_length", max_length=5)
    assert padded["input_ids"] == [BOS_ROW, row(0x62), EOS_ROW, ZERO_ROW, ZERO_ROW]
    assert padded["attention_mask"] == [1, 1, 1, 0, 0]
    # a 2-example batch given as a dict of lists
    features = _examples(tok, [["a", "b"], ["c"]])
    batch = tok.pad({key: [f[key] for f in features] for key in features[0]}, return_tensors="pt")
    assert batch["input_ids"].tolist() == EXPECTED_PADDED


def test_pad_rejects_flat_ids(tok):
    with pytest.raises(ValueError, match="50"):
        tok.pad([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    with pytest.raises(ValueError, match="50"):
        tok.pad([{"input_ids": [[1, 2, 3]]}])


def test_data_collator_with_padding(tok):
    from transformers import DataCollatorWithPadding

    features = _examples(tok, [["a", "b"], ["c"]])
    for label, feature in enumerate(features):
        feature["label"] = label
    batch = DataCollatorWithPadding(tok)(features)
    assert batch["input_ids"].shape == (2, 4, 50)
    assert batch["input_ids"].tolist() == EXPECTED_PADDED
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist() == [0, 1]


def test_data_collator_for_token_classification(tok):
    from transformers import DataCollatorForTokenClassification

    features = _examples(tok, [["a", "b"], ["c"]])
    features[0]["labels"] = [-100, 3, 4, -100]
    features[1]["labels"] = [-100, 5, -100]
    batch = DataCollatorForTokenClassification(tok)(features)
    assert batch["input_ids"].tolist() == EXPECTED_PADDED
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 3, 4, -100], [-100, 5, -100, -100]]


def test_feature_extraction_pipeline(tok):
    """A single text through the pipeline needs the batch axis (tiny random model)."""
    hf_elmo = pytest.importorskip("hf_elmo")
    if not hasattr(hf_elmo, "ElmoModel"):
        pytest.skip("model not available")
    from transformers import pipeline

    config = hf_elmo.ElmoConfig(
        char_embedding_dim=4, filters=[[1, 4], [2, 4]], n_highway=1, cell_dim=8, projection_dim=4
    )
    model = hf_elmo.ElmoModel(config).eval()
    features = np.asarray(pipeline("feature-extraction", model=model, tokenizer=tok)("I don't know."))
    assert features.shape[:2] == (1, 7)


# --- properties ---------------------------------------------------------------------------------

# Any code point including lone surrogates (rare in st.characters, so mixed in explicitly).
any_char = st.one_of(st.characters(codec=None, exclude_categories=()), st.characters(categories=["Cs"]))
any_word = st.one_of(st.text(any_char, max_size=40), st.sampled_from(["<S>", "</S>", ""]))


def _check_row(word, ids):
    assert ids.shape == (50,)
    assert ids.min() >= 1 and ids.max() <= 261
    if word in ("<S>", "</S>"):
        assert ids.tolist() == (BOS_ROW if word == "<S>" else EOS_ROW)
        return
    data = word.encode("utf-8", "ignore")[:48]
    n = len(data)
    assert ids[0] == BOW
    assert bytes((ids[1 : n + 1] - 1).tolist()) == data
    assert ids[n + 1] == EOW
    assert (ids[n + 2 :] == PADC).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(any_word, max_size=12))
def test_property_rows(words):
    ids = words_to_char_ids(words)
    assert ids.shape == (len(words), 50) and ids.dtype == np.int64
    for word, word_ids in zip(words, ids):
        _check_row(word, word_ids)
    np.testing.assert_array_equal(words_to_char_ids(words), ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(any_word, max_size=6), min_size=1, max_size=4))
def test_property_batches(tok, sentences):
    enc = tok(sentences, is_split_into_words=True, padding=True, return_tensors="np")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    longest = max(len(s) for s in sentences)
    assert ids.shape == (len(sentences), longest + 2, 50)
    assert ids.min() >= 0 and ids.max() <= 261
    for b, words in enumerate(sentences):
        n = len(words)
        assert mask[b].tolist() == [1] * (n + 2) + [0] * (longest - n)
        assert ids[b, 0].tolist() == BOS_ROW and ids[b, n + 1].tolist() == EOS_ROW
        assert not ids[b, n + 2 :].any()
        for t, word in enumerate(words):
            _check_row(word, ids[b, t + 1])
        assert enc.word_ids(b) == [None, *range(n), None] + [None] * (longest - n)
        # round trip for words that survive intact (valid UTF-8, not cut, not boundary literals)
        if all(w not in ("<S>", "</S>") and len(w.encode("utf-8", "ignore")) <= 48 for w in words):
            clean = [w.encode("utf-8", "ignore").decode("utf-8") for w in words]
            assert tok.convert_ids_to_tokens(ids[b], skip_special_tokens=True) == clean


# Unicode White_Space, which the Rust WhitespaceSplit uses (Python's str.split differs slightly).
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}


@settings(max_examples=200, deadline=None)
@given(st.text(st.one_of(any_char, st.sampled_from(list(" '.,n't-sS<>/\u00a0"))), max_size=60))
def test_property_split_words_loses_nothing(tok, text):
    words = tok.split_words(text)
    visible = "".join(c for c in text if c not in WHITE_SPACE and not 0xD800 <= ord(c) <= 0xDFFF)
    assert "".join(words) == visible
    assert all(words) and not any(c in WHITE_SPACE for w in words for c in w)
    assert tok.tokenize(text) == words
