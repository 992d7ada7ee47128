"""A transformers (BERT) user's habits with the model and tokenizer APIs: each works as it does for BERT, or gets one
line saying what to do instead."""

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments, pipeline

from hf_elmo import (
    ElmoConfig,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoTokenizer,
)
from hf_elmo.data_elmo import DataCollatorForElmo

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
