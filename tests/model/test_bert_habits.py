"""A transformers (BERT) user's habits with the model and tokenizer APIs: each works as it does for BERT, or gets one
line saying what to do instead."""

import json
import textwrap

import pytest
import torch
from conftest import run_without_hf_elmo
from datasets import Dataset
from fake_hub import FakeHub
from transformers import AutoTokenizer, Trainer, TrainingArguments, pipeline
from transformers.modeling_layers import GradientCheckpointingLayer

from hf_elmo import (
    ElmoConfig,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoTokenizer,
)
from hf_elmo.features.task_data import DataCollatorForElmo
from hf_elmo.modeling_elmo import ElmoBiLstm, ElmoCharacterEncoder

TINY = dict(char_embedding_dim=4, filters=[[1, 4], [2, 4]], n_highway=1, cell_dim=8, projection_dim=4, num_layers=1)
TEXTS = ["the cat sat", "a dog", "birds fly high up", "no", "fish swim", "the end"]
CLASSES = [0, 1, 2, 1, 0, 2]


# --- Trainer with a dataset's `label` column -------------------------------------------------------------------------


def trained_on_column(label_column: str, tmp_path) -> dict[str, torch.Tensor]:
    """The weights of a sentence classifier after two `Trainer` steps on `TEXTS` with the classes in `label_column`."""
    tokenizer = ElmoTokenizer()
    dataset = Dataset.from_dict({"text": TEXTS, label_column: CLASSES})
    dataset = dataset.map(lambda rows: tokenizer(rows["text"]), batched=True, remove_columns=["text"])
    torch.manual_seed(0)
    model = ElmoForSequenceClassification(ElmoConfig(**TINY, num_labels=3, dropout=0.0, freeze_elmo=False))
    args = TrainingArguments(
        output_dir=str(tmp_path / label_column),
        max_steps=2,
        per_device_train_batch_size=3,
        learning_rate=0.1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=1,
    )
    collator = DataCollatorForElmo(tokenizer)
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    return model.state_dict()


@pytest.mark.parametrize("label_column", ["label", "label_ids"])
def test_trainer_takes_a_label_column_as_labels_as_data_collator_with_padding_does(label_column, tmp_path):
    with_labels = trained_on_column("labels", tmp_path)
    with_column = trained_on_column(label_column, tmp_path)
    torch.manual_seed(0)
    start = ElmoForSequenceClassification(ElmoConfig(**TINY, num_labels=3)).state_dict()
    assert not torch.equal(with_labels["classifier.weight"], start["classifier.weight"])  # the loss was used
    for name, value in with_labels.items():
        assert torch.equal(with_column[name], value), name


def test_the_collator_renames_label_and_pads_as_with_labels():
    tokenizer = ElmoTokenizer()
    features = [dict(tokenizer(text), label=label) for text, label in zip(TEXTS[:3], CLASSES[:3])]
    batch = DataCollatorForElmo(tokenizer)(features)
    assert "label" not in batch and torch.equal(batch["labels"], torch.tensor(CLASSES[:3]))
    renamed = [dict(tokenizer(text), labels=label) for text, label in zip(TEXTS[:3], CLASSES[:3])]
    expected = DataCollatorForElmo(tokenizer)(renamed)
    assert batch.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(batch[key], value), key


# --- a batch of pairs given as tuples -----------------------------------------------------------------------------


def same_encoding(got, expected):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
        else:  # unpadded: ragged lists
            assert got[key] == value, key


@pytest.mark.parametrize("options", [{}, dict(padding=True, return_tensors="pt")])
def test_a_batch_of_pairs_as_tuples_is_the_batch_of_text_and_text_pair(options):
    tokenizer = ElmoTokenizer()
    got = tokenizer([("a b", "c"), ("d", "e f")], **options)
    expected = tokenizer(["a b", "d"], ["c", "e f"], **options)
    assert "pair_input_ids" in expected
    same_encoding(got, expected)
    assert [got.pair_word_ids(i) for i in range(2)] == [expected.pair_word_ids(i) for i in range(2)]


def test_a_pre_split_batch_of_pairs_is_tuples_of_word_lists_and_a_tuple_of_words_stays_a_sentence():
    tokenizer = ElmoTokenizer()
    got = tokenizer([(["a", "b"], ["c"]), (["d"], ["e", "f"])], is_split_into_words=True, padding=True)
    expected = tokenizer([["a", "b"], ["d"]], [["c"], ["e", "f"]], is_split_into_words=True, padding=True)
    same_encoding(got, expected)
    words = tokenizer([("a", "b"), ("c", "d")], is_split_into_words=True, padding=True)
    assert "pair_input_ids" not in words and tokenizer.batch_decode(words["input_ids"], skip_special_tokens=True) == [
        "a b",
        "c d",
    ]


@pytest.mark.parametrize(
    "batch, message",
    [
        ([("a b", "c"), "d"], r"^Item 0 of the batch is a pair \(text, text_pair\) but item 1 is not \('d'\)"),
        ([("a", "b", "c")], r"^Item 0 of the batch is a tuple of 3: .* a batch of pairs is tuples \(text, text_pair\)"),
        # BERT's tokenizers take a list of two texts as a pair; here it is a sentence's words missing
        # is_split_into_words=True
        ([["The", "cat"]], r"^Item 0 of the batch is a list of 2: for pre-split words pass is_split_into_words=True"),
    ],
)
def test_a_batch_mixing_pairs_and_texts_is_refused_in_one_line(batch, message):
    with pytest.raises(ValueError, match=message) as refused:
        ElmoTokenizer()(batch)
    assert "\n" not in str(refused.value)


# --- a task pipeline given a folder saved from another class ------------------------------------------------------


@pytest.fixture
def tagger_folder(tmp_path):
    folder = tmp_path / "tagger"
    ElmoForTokenClassification(ElmoConfig(**TINY, num_labels=3)).save_pretrained(folder)
    ElmoTokenizer().save_pretrained(folder)
    return folder


def test_the_question_answering_pipeline_refuses_a_tagger_folder_in_one_line_as_it_refuses_a_tagger(tagger_folder):
    with pytest.raises(ValueError, match="needs an ElmoForQuestionAnswering model") as as_object:
        tagger = ElmoForTokenClassification.from_pretrained(tagger_folder)
        pipeline("question-answering", model=tagger, tokenizer=ElmoTokenizer())
    with pytest.raises(ValueError) as as_folder:
        pipeline("question-answering", model=str(tagger_folder))
    message = str(as_folder.value)
    assert message.startswith(f"{tagger_folder} holds ElmoForTokenClassification (config.json architectures), not ")
    assert "ElmoForQuestionAnswering head is untrained" in message and "(token-classification)" in message
    assert "\n" not in message and "\n" not in str(as_object.value)


def test_a_head_put_on_another_folder_runs_in_its_pipeline_once_trained(tagger_folder):
    model = ElmoForQuestionAnswering.from_pretrained(tagger_folder)
    tokenizer = ElmoTokenizer.from_pretrained(tagger_folder)
    with pytest.raises(ValueError, match="head is untrained"):
        pipeline("question-answering", model=model, tokenizer=tokenizer)
    batch = tokenizer(["Who sat?"], ["The cat sat."], return_tensors="pt")
    loss = model(**batch, start_positions=torch.tensor([1]), end_positions=torch.tensor([2])).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    answer = pipeline("question-answering", model=model, tokenizer=tokenizer)(
        question="Who sat?", context="The cat sat."
    )
    assert answer["answer"] in "The cat sat."
    tagger = ElmoForTokenClassification.from_pretrained(tagger_folder)  # the folder's own head
    assert pipeline("token-classification", model=tagger, tokenizer=tokenizer)("The cat sat.") is not None


# --- a model folder, saved or pushed, carries its tokenizer ----------------------------------------------------------

WORDS = [["The", "cat", "sat", "."], ["Über", "naïve"]]
ENCODE_WITHOUT_THE_PACKAGE = """
    import json, sys
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
    assert type(tokenizer).__module__.startswith("transformers_modules"), type(tokenizer).__module__
    batch = tokenizer({words!r}, is_split_into_words=True, padding=True)
    json.dump({{key: batch[key] for key in ("input_ids", "attention_mask")}}, open("encoded.json", "w"))
"""


def encoded_without_the_package(name_or_path, tmp_path, **env) -> dict:
    script = ENCODE_WITHOUT_THE_PACKAGE.format(words=WORDS)
    run_without_hf_elmo(
        f"import sys; sys.argv[1:] = [{str(name_or_path)!r}]\n" + textwrap.dedent(script), tmp_path, **env
    )
    return json.loads((tmp_path / "encoded.json").read_text())


def expected_encoding(**tokenizer_options) -> dict:
    batch = ElmoTokenizer(**tokenizer_options)(WORDS, is_split_into_words=True, padding=True)
    return {key: batch[key] for key in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("max_characters_per_token", [50, 10])
def test_a_saved_model_folder_loads_with_auto_tokenizer_with_and_without_the_package(
    max_characters_per_token, tmp_path
):
    folder = tmp_path / "model"
    config = ElmoConfig(**TINY, num_labels=3, max_characters_per_token=max_characters_per_token)
    ElmoForSequenceClassification(config).save_pretrained(folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["auto_map"]["AutoTokenizer"][0] == "tokenization_elmo.ElmoTokenizer"
    expected = expected_encoding(max_characters_per_token=max_characters_per_token)
    assert len(expected["input_ids"][0][0]) == max_characters_per_token
    installed = AutoTokenizer.from_pretrained(folder)
    batch = installed(WORDS, is_split_into_words=True, padding=True)
    assert {key: batch[key] for key in expected} == expected
    assert encoded_without_the_package(folder, tmp_path) == expected


def test_a_model_saved_into_a_folder_with_a_tokenizer_leaves_it_as_it_is(tmp_path):
    tokenizer = ElmoTokenizer(max_characters_per_token=10, model_max_length=7)
    tokenizer.save_pretrained(tmp_path)
    before = (tmp_path / "tokenizer_config.json").read_text()
    ElmoModel(ElmoConfig(**TINY)).save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer_config.json").read_text() == before
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == 7


def test_a_model_of_a_character_vocabulary_saves_no_tokenizer_and_auto_tokenizer_says_what_is_missing(tmp_path):
    config = ElmoConfig(**TINY, char_vocabulary=True, n_characters=20)
    ElmoModel(config).save_pretrained(tmp_path)
    assert not (tmp_path / "tokenizer_config.json").exists()
    with pytest.raises(ValueError, match="the tokenizer files lack char_vocab.json but the model reads a character"):
        AutoTokenizer.from_pretrained(tmp_path)


def test_push_to_hub_uploads_the_tokenizer_and_keeps_one_pushed_before(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    ElmoForSequenceClassification(ElmoConfig(**TINY, num_labels=3)).push_to_hub("org/elmo-classifier")
    snapshot = hub.snapshot("org/elmo-classifier")
    assert {"tokenizer_config.json", "tokenization_elmo.py", "pre_tokenizer.py"} <= {p.name for p in snapshot.iterdir()}
    cache = dict(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub-cache"))
    assert encoded_without_the_package("org/elmo-classifier", tmp_path, **cache) == expected_encoding()

    ElmoTokenizer(model_max_length=7).push_to_hub("org/elmo-tagged")
    pushed = (hub.snapshot("org/elmo-tagged") / "tokenizer_config.json").read_text()
    ElmoModel(ElmoConfig(**TINY)).push_to_hub("org/elmo-tagged")
    assert (hub.snapshot("org/elmo-tagged") / "tokenizer_config.json").read_text() == pushed


# --- gradient checkpointing through transformers' GradientCheckpointingLayer ------------------------------------------


@pytest.mark.parametrize("lstm_path", ["reference", "sorted"])
def test_gradient_checkpointing_runs_through_gradient_checkpointing_layers(lstm_path, monkeypatch):
    config = ElmoConfig(**TINY, num_labels=3, freeze_elmo=False, paths={"lstm": lstm_path})
    model = ElmoForTokenClassification(config).train()
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert {type(m) for m in layers} == {ElmoCharacterEncoder, ElmoBiLstm}
    runs = []
    model.elmo.char_encoder.char_embedding.register_forward_hook(lambda *_: runs.append("characters"))
    directions_forward = ElmoBiLstm.directions_forward
    monkeypatch.setattr(
        ElmoBiLstm, "directions_forward", lambda self, *args: runs.append("biLSTM") or directions_forward(self, *args)
    )
    batch = ElmoTokenizer()([["The", "cat"], ["Hi"]], is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.tensor([[-100, 1, 2, -100], [-100, 0, -100, -100]])
    model(**batch, labels=labels).loss.backward()
    plain = {part: runs.count(part) for part in ("biLSTM", "characters")}
    assert plain["biLSTM"] == 1 and plain["characters"] >= 1
    model.activation_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in layers)
    runs.clear()
    model(**batch, labels=labels).loss.backward()
    assert {part: runs.count(part) for part in plain} == {part: 2 * n for part, n in plain.items()}  # again backward
    model.activation_checkpointing_disable()
    assert not any(layer.gradient_checkpointing for layer in layers)


# --- added tokens: words never split --------------------------------------------------------------------------------


def test_an_added_token_is_a_word_never_split_read_by_its_characters():
    tokenizer = ElmoTokenizer()
    assert ElmoTokenizer().tokenize("[E1]Paris[/E1] is nice") == [
        "[",
        "E1",
        "]",
        "Paris",
        "[",
        "/",
        "E1",
        "]",
        "is",
        "nice",
    ]
    assert tokenizer.add_tokens(["[E1]", "[/E1]"]) == 2
    assert tokenizer.add_tokens(["[E1]", "<S>"]) == 0  # already there, and a pseudo-vocabulary token
    text = "[E1]Paris[/E1] is nice"
    words = ["[E1]", "Paris", "[/E1]", "is", "nice"]
    assert tokenizer.tokenize(text) == words
    encoded = tokenizer([text], padding=True, return_tensors="pt")
    assert torch.equal(
        encoded["input_ids"], ElmoTokenizer()([words], is_split_into_words=True, return_tensors="pt")["input_ids"]
    )
    assert encoded.word_ids(0) == [None, 0, 1, 2, 3, 4, None]
    assert tokenizer.convert_tokens_to_ids(["[E1]", "[/E1]"]) == [262, 263] and len(tokenizer) == 264
    assert tokenizer.get_added_vocab() == {"<pad>": 0, "<S>": 257, "</S>": 258, "[E1]": 262, "[/E1]": 263}
    assert tokenizer.decode(encoded["input_ids"][0], skip_special_tokens=True) == "[E1] Paris [/E1] is nice"
    with pytest.raises(NotImplementedError, match="tokens added to ElmoTokenizer are read by their characters too"):
        ElmoModel(ElmoConfig(**TINY)).resize_token_embeddings(len(tokenizer))


def test_the_longer_of_two_added_tokens_at_one_place_is_the_word():
    tokenizer = ElmoTokenizer()
    tokenizer.add_tokens(["<e>", "<e>>"])
    assert tokenizer.tokenize("a<e>>b <e>c") == ["a", "<e>>", "b", "<e>", "c"]


def test_added_special_tokens_are_kept_whole_skipped_in_decoding_and_saved(tmp_path):
    tokenizer = ElmoTokenizer(extra_special_tokens=["[E1]"])
    assert tokenizer.add_special_tokens({"cls_token": "[CLS]"}) == 1
    assert tokenizer.tokenize("[CLS] x[E1]y") == ["[CLS]", "x", "[E1]", "y"]
    ids = tokenizer("[CLS] x[E1]y")["input_ids"]
    assert tokenizer.decode(ids) == "<S> [CLS] x [E1] y </S>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "x y"
    tokenizer.save_pretrained(tmp_path)
    for reloaded in (ElmoTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)):
        assert reloaded.tokenize("[CLS] x[E1]y") == ["[CLS]", "x", "[E1]", "y"]
        assert reloaded("[CLS] x[E1]y")["input_ids"] == ids
        assert reloaded.get_vocab() == tokenizer.get_vocab() and reloaded.cls_token == "[CLS]"
    script = """
        import json, sys
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(".", trust_remote_code=True)
        text = "[CLS] x[E1]y"
        json.dump({"words": tokenizer.tokenize(text), "ids": tokenizer(text)["input_ids"]}, open("out.json", "w"))
    """
    run_without_hf_elmo(script, tmp_path)
    assert json.loads((tmp_path / "out.json").read_text()) == {"words": ["[CLS]", "x", "[E1]", "y"], "ids": ids}
