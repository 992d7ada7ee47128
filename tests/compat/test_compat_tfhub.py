"""`hf_elmo.compat.tfhub.TFHubElmo`: TF-Hub ELMo's dictionary of outputs, against AllenNLP's fixtures (the char-CNN
output of `vocab_test.txt`, the first fixture batch's top layer) and a float64 recomputation of the mix."""

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES, fixture_batches

from hf_elmo import ElmoModel
from hf_elmo.compat.tfhub import TFHubElmo


@pytest.fixture(scope="module")
def hub_elmo(converted_dirs):
    return TFHubElmo(str(converted_dirs["allennlp"]))


def test_outputs_against_allennlps_fixtures(hub_elmo):
    words = (FIXTURES / "allennlp" / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(FIXTURES / "allennlp" / "elmo_token_embeddings.hdf5", "r") as f:
        token_embeddings = f["embedding"][...]
    picked = [0, 1, 2, 7, 100, 457]
    out = hub_elmo(tokens=[[words[i] for i in picked], [words[0], ""]], sequence_len=[len(picked), 1], as_dict=True)
    assert out["word_emb"].shape == (2, len(picked), 16)
    assert np.allclose(out["word_emb"][0].detach().numpy(), token_embeddings[picked], atol=1e-6, rtol=1e-5)
    assert not out["word_emb"][1, 1:].any(), "positions past the sentence are zero"

    (sentences, expected), _ = fixture_batches("allennlp")[:2]  # batch 0 starts from zeros, as every call here
    out = hub_elmo([" ".join(words) for words in sentences], as_dict=True)
    assert set(out) == {"word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default"}
    for k, words in enumerate(sentences):
        assert np.allclose(out["lstm_outputs2"][k, : len(words)].detach().numpy(), expected[k], atol=1e-6, rtol=1e-5)


def test_elmo_is_the_learned_mix_and_default_its_mean_over_words(hub_elmo):
    out = hub_elmo(["The bank of  the river .", "Hi", ""], as_dict=True)
    lengths = [6, 1, 0]
    layers = [np.concatenate([out["word_emb"].detach().numpy()] * 2, axis=-1)] + [
        out[f"lstm_outputs{k}"].detach().numpy().astype(np.float64) for k in (1, 2)
    ]
    np.testing.assert_allclose(out["elmo"].detach().numpy(), sum(layers) / 3, rtol=0, atol=1e-6)
    for k, n in enumerate(lengths):
        expected = out["elmo"][k, :n].detach().numpy().astype(np.float64).sum(axis=0) / max(n, 1)
        np.testing.assert_allclose(out["default"][k].detach().numpy(), expected, rtol=0, atol=1e-6)
    assert not out["default"][2].any()
    # Only the mix learns.
    out["elmo"].sum().backward()
    assert hub_elmo.mix.scalar_parameters.grad is not None and hub_elmo.mix.gamma.grad is not None
    assert not any(p.requires_grad for p in hub_elmo.model.parameters())


def test_strings_split_at_spaces_like_the_tokens_signature(hub_elmo, converted_dirs):
    from_strings = hub_elmo(["a  b c", "d"], as_dict=True)
    from_tokens = hub_elmo(tokens=[["a", "b", "c"], ["d", "", ""]], sequence_len=torch.tensor([3, 1]), as_dict=True)
    for key, value in from_strings.items():
        torch.testing.assert_close(value, from_tokens[key], rtol=0, atol=0)
    tokens = {"tokens": [["a", "b", "c"], ["d", "", ""]], "sequence_len": [3, 1]}
    as_in_tfhub = hub_elmo(inputs=tokens, signature="tokens", as_dict=True)
    torch.testing.assert_close(as_in_tfhub["elmo"], from_strings["elmo"], rtol=0, atol=0)
    torch.testing.assert_close(hub_elmo(["a  b c", "d"], as_dict=False), from_strings["default"], rtol=0, atol=0)
    from_model = TFHubElmo(ElmoModel.from_pretrained(converted_dirs["allennlp"]))(["a  b c", "d"], as_dict=True)
    torch.testing.assert_close(from_model["lstm_outputs2"], from_strings["lstm_outputs2"], rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda e: e("the cat"), "strings must be a list of words, got a single str"),
        (lambda e: e(["a"], tokens=[["a"]], sequence_len=[1]), "one of them"),
        (lambda e: e(tokens=[["a"]]), "tokens need sequence_len"),
        (lambda e: e(tokens=[["a", ""]], sequence_len=[3]), r"sequence_len\[0\] = 3 is not in \[0, 2\]"),
        (lambda e: e(tokens=[["a"]], sequence_len=[1, 1]), "one int per row of tokens"),
        (lambda e: e(["a"], signature="word_emb"), "signature must be 'default' or 'tokens', got 'word_emb'"),
        (lambda e: e(["a"], signature="tokens"), 'signature="tokens" takes inputs='),
    ],
)
def test_bad_arguments_are_one_line_value_errors(call, message, hub_elmo):
    with pytest.raises(ValueError, match=message) as error:
        call(hub_elmo)
    assert "\n" not in str(error.value)
