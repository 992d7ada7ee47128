"""`max_characters_per_token` other than 50 (bilm-tf's own tests train with 10): tokenizer, converter and model."""

import json

import numpy as np
import pytest
import torch
from conftest import CHECKPOINT, reference_from

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert.from_bilm_tf_checkpoint import convert_bilm_tf_checkpoint
from hf_elmo.training.perplexity import load_bilm

BOW, EOW, PAD = 259, 260, 261


def test_rows_of_ten_as_bilm_tf_writes_them():
    # bilm-tf's UnicodeCharsVocabulary(max_word_length=10): begin of word, the first 8 UTF-8 bytes, end of word,
    # padding; then +1 for every id (its Batcher), so a byte b is b + 1.
    tokenizer = ElmoTokenizer(max_characters_per_token=10)
    batch = tokenizer([["cat", "abcdefghijk", "é", "<S>"]], is_split_into_words=True, return_tensors="np")
    expected = [
        [BOW, 257, EOW] + [PAD] * 7,  # <S>
        [BOW, 100, 98, 117, EOW] + [PAD] * 5,  # c a t
        [BOW, *range(98, 106), EOW],  # a..h: the word cut to 8 bytes
        [BOW, 0xC3 + 1, 0xA9 + 1, EOW] + [PAD] * 6,  # é is two bytes
        [BOW, 257, EOW] + [PAD] * 7,  # a literal <S> is the boundary row
        [BOW, 258, EOW] + [PAD] * 7,  # </S>
    ]
    assert batch["input_ids"].tolist() == [expected]
    padded = tokenizer([["a"], ["a", "b"]], is_split_into_words=True, padding=True, return_tensors="np")
    assert padded["input_ids"].shape == (2, 4, 10) and not padded["input_ids"][0, 3].any()
    assert tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True) == "cat abcdefgh é"  # <S> rows skipped


def test_width_survives_saving_and_errors(tmp_path):
    ElmoTokenizer(max_characters_per_token=10).save_pretrained(tmp_path)
    assert ElmoTokenizer.from_pretrained(tmp_path).max_characters_per_token == 10
    with pytest.raises(ValueError, match="max_characters_per_token must be an int >= 3 .* got 2"):
        ElmoTokenizer(max_characters_per_token=2)
    with pytest.raises(ValueError, match="a character vocabulary \\(ELMoForManyLangs\\) has rows of 50"):
        ElmoTokenizer(max_characters_per_token=10, char_vocab={"a": 1})
    assert ElmoConfig(max_characters_per_token=10, filters=[[1, 4], [10, 4]]).max_characters_per_token == 10
    with pytest.raises(ValueError, match="max_characters_per_token must be >= 3"):
        ElmoConfig(max_characters_per_token=2, filters=[[1, 4]])
    with pytest.raises(ValueError, match="filters width 11 exceeds max_characters_per_token=10"):
        ElmoConfig(max_characters_per_token=10, filters=[[11, 4]])


@pytest.fixture(scope="module")
def ten_dir(tmp_path_factory):
    """The bilm-tf checkpoint converted with options saying 10 characters per token."""
    folder = tmp_path_factory.mktemp("ten")
    options = json.loads((CHECKPOINT / "tf_checkpoint/options.json").read_text())
    options["char_cnn"]["max_characters_per_token"] = 10
    (folder / "options.json").write_text(json.dumps(options))
    return convert_bilm_tf_checkpoint(
        CHECKPOINT / "tf_checkpoint", folder / "bilm", CHECKPOINT / "vocab.txt", folder / "options.json"
    )


def test_converted_model_reads_rows_of_ten(ten_dir, capsys):
    model, tokenizer = load_bilm(ten_dir)
    assert model.config.max_characters_per_token == 10 and tokenizer.max_characters_per_token == 10
    batch = tokenizer(
        [["The", "extraordinarily", "long", "words"], ["Hi"]],
        is_split_into_words=True,
        padding=True,
        return_tensors="pt",
    )
    assert batch["input_ids"].shape == (2, 6, 10)
    with torch.no_grad():
        fast = model.elmo(**batch, output_hidden_states=True).hidden_states
        reference, _ = reference_from(model.elmo)(batch["input_ids"], batch["attention_mask"])
    for ours, straightforward in zip(fast, reference):
        torch.testing.assert_close(ours, straightforward, rtol=0, atol=1e-5)
    wide = ElmoTokenizer()([["The"]], is_split_into_words=True, return_tensors="pt")
    with pytest.raises(ValueError, match=r"input_ids must have shape \(batch, words, 10\), got \(1, 3, 50\)"):
        model.elmo(**wide)
    # Perplexity and continued training read the folder's width.
    held_out = str(CHECKPOINT / "heldout.txt")
    assert cli_main(["perplexity", "--model", str(ten_dir), held_out, "--stream", "--batch-size", "16"]) == 0
    assert "targets per direction  5,808" in capsys.readouterr().out


def test_continued_training_with_rows_of_ten(ten_dir, tmp_path):
    arguments = [
        "train",
        "--init-from",
        str(ten_dir),
        "--train-files",
        str(CHECKPOINT / "heldout.txt"),
        "--output-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "1",
        "--per-device-train-batch-size",
        "2",
        "--window",
        "160",
        "--disable-tqdm",
        "--data-cache-dir",
        str(tmp_path / "cache"),
    ]
    assert cli_main(arguments) == 0
    trained = ElmoForBiLM.from_pretrained(tmp_path / "run")
    assert trained.config.max_characters_per_token == 10
    assert ElmoTokenizer.from_pretrained(tmp_path / "run").max_characters_per_token == 10
    before = ElmoForBiLM.from_pretrained(ten_dir).state_dict()["elmo.char_encoder.char_embedding.weight"]
    assert not np.array_equal(before.numpy(), trained.state_dict()["elmo.char_encoder.char_embedding.weight"].numpy())
