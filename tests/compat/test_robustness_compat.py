"""Sizes and values the compatibility APIs refuse before building anything: too many mixes, mix weights beyond
float32, an output layer that does not exist, padded batches beyond the memory available."""

import re

import pytest
import torch
from conftest import FIXTURES
from test_robustness_model import one_line

import hf_elmo.compat.allennlp as compat_allennlp
from hf_elmo import ElmoModel
from hf_elmo.compat import loading
from hf_elmo.compat.elmoformanylangs import Embedder
from hf_elmo.compat.tfhub import TFHubElmo
from hf_elmo.io.files import ElmoInputError

OPTIONS, WEIGHTS = FIXTURES / "allennlp" / "options.json", FIXTURES / "allennlp" / "lm_weights.hdf5"

# --- the compatibility APIs ------------------------------------------------------------------------------------------

# One sentence of 2,000 words beside 200 of one word: every row padded to 2,002 positions.
LOPSIDED = [["word"] * 2000] + [["a"]] * 200


@pytest.fixture
def little_memory(monkeypatch):
    """64 MiB available: the lopsided batch's padded tensors need more, a batch of short sentences far less; no
    forward may start."""
    monkeypatch.setattr(loading, "available_memory", lambda: 64 * 2**20)

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran before the padded batch was checked")

    monkeypatch.setattr(ElmoModel, "forward", no_forward)


@pytest.mark.parametrize("route", ["ElmoEmbedder", "Elmo", "TFHubElmo"])
def test_padded_batches_beyond_the_memory_available_are_refused_before_allocating(route, little_memory, converted_dirs):
    with pytest.raises(ElmoInputError) as error:
        if route == "ElmoEmbedder":
            compat_allennlp.ElmoEmbedder(OPTIONS, WEIGHTS).embed_batch(LOPSIDED)
        elif route == "Elmo":
            compat_allennlp.Elmo(OPTIONS, WEIGHTS, 1)(compat_allennlp.batch_to_ids(LOPSIDED))
        else:
            TFHubElmo(str(converted_dirs["allennlp"]))([" ".join(words) for words in LOPSIDED])
    where = {"Elmo": "batch_to_ids"}.get(route, route)
    assert re.fullmatch(
        rf"{where}: 201 sentences padded to the longest, 2,00[02] positions, need about [\d.]+ GiB for their padded "
        r"tensors, more than the 0\.1 GiB available; give the longest sentences batches of their own \(or smaller "
        r"batches\)",
        one_line(error),
    )


def test_elmo_refuses_character_ids_whose_layers_would_not_fit(monkeypatch):
    """Character ids made while memory sufficed (by `batch_to_ids` or the caller): `Elmo` checks the layers it would
    return before its forward starts."""
    ids = compat_allennlp.batch_to_ids(LOPSIDED)
    elmo = compat_allennlp.Elmo(OPTIONS, WEIGHTS, 1)
    monkeypatch.setattr(loading, "available_memory", lambda: 64 * 2**20)
    monkeypatch.setattr(ElmoModel, "forward", lambda *args, **kwargs: pytest.fail("the forward started"))
    with pytest.raises(ElmoInputError) as error:
        elmo(ids)
    assert one_line(error).startswith("Elmo: 201 sentences padded to the longest, 2,002 positions, need about ")


def test_padded_batches_that_fit_pass_the_check(monkeypatch):
    """The same memory for 201 short sentences: the embedder runs them and gives each its words' vectors."""
    monkeypatch.setattr(loading, "available_memory", lambda: 64 * 2**20)
    vectors = compat_allennlp.ElmoEmbedder(OPTIONS, WEIGHTS, stateful=False).embed_batch([["a", "b"]] * 201)
    assert [v.shape[1] for v in vectors] == [2] * 201


def test_allennlp_elmo_refuses_a_million_mixes_before_loading_the_model(monkeypatch):
    def not_before_the_check(*args):
        raise AssertionError("the model was loaded before num_output_representations was checked")

    monkeypatch.setattr(compat_allennlp, "load_elmo", not_before_the_check)
    with pytest.raises(ElmoInputError) as error:
        compat_allennlp.Elmo(OPTIONS, WEIGHTS, num_output_representations=10**6)
    assert one_line(error) == (
        "num_output_representations is 1,000,000, more than the limit of 1,000 mixes (each call returns a "
        "(batch_size, timesteps, 2P) tensor per mix)"
    )


@pytest.mark.parametrize("weights", [[1e39, 0, 0], [0, -1e39, 0], [3.5e38, 0, 0]])
def test_allennlp_elmo_refuses_mix_weights_that_are_not_float32_numbers(weights):
    with pytest.raises(ElmoInputError) as error:
        compat_allennlp.Elmo(OPTIONS, WEIGHTS, 1, scalar_mix_parameters=weights)
    assert re.search(r"scalar_mix_parameters: .*must be finite float32 numbers \(at most 3\.403e\+38", one_line(error))


def test_allennlp_elmo_mixes_with_the_largest_float32_weight():
    """3e38 is a float32 number: the mix puts all its weight on layer 0, the character CNN's `[x | x]`."""
    elmo = compat_allennlp.Elmo(OPTIONS, WEIGHTS, 1, dropout=0.0, scalar_mix_parameters=[3e38, 0, 0], stateful=False)
    ids = compat_allennlp.batch_to_ids([["The", "cat", "sat", "."], ["Hi"]])
    with torch.no_grad():
        out = elmo(ids)
        layers, _ = elmo._elmo_lstm(ids)
    (mixed,) = out["elmo_representations"]
    expected = compat_allennlp._without_boundaries(layers[0], out["mask"])
    assert torch.isfinite(mixed).all()
    torch.testing.assert_close(mixed, expected, rtol=0, atol=0)


def test_sents2elmo_refuses_an_output_layer_below_minus_two(converted_dirs):
    embedder = Embedder(converted_dirs["allennlp"])
    layers = embedder.model.config.num_layers + 1
    for output_layer in (-3, -layers, layers):
        with pytest.raises(ElmoInputError) as error:
            embedder.sents2elmo([["The", "cat"]], output_layer=output_layer)
        assert one_line(error) == (
            f"output_layer must be -1 (average), -2 (all layers) or a layer in [0, {layers - 1}], got {output_layer}"
        )
