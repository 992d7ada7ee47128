"""`hf_elmo.compat.elmoformanylangs.Embedder` on the ELMoForManyLangs-format folder of `test_elmoformanylangs` (read
directly, or converted): `sents2elmo`'s output layers and types against a float64 NumPy implementation of their
model, and its numbers equal to the converted model's."""

import numpy as np
import pytest
import torch
from test_elmoformanylangs import SENTENCES, converted, their_folder, their_layers  # noqa: F401  (fixtures)
from transformers import AutoModel, AutoTokenizer

from hf_elmo.compat.allennlp import Elmo
from hf_elmo.compat.elmoformanylangs import Embedder

SELECT = {
    -1: lambda layers: layers.mean(axis=0),
    -2: lambda layers: layers,
    0: lambda layers: layers[0],
    1: lambda layers: layers[1],
    2: lambda layers: layers[2],
}


@pytest.mark.parametrize("output_layer", list(SELECT))
def test_their_folder_gives_their_numbers_for_every_output_layer(output_layer, their_folder):  # noqa: F811
    embedder = Embedder(their_folder, batch_size=2)  # two batches, the second with the empty sentence
    embedder.model.double()
    vectors = embedder.sents2elmo(SENTENCES, output_layer=output_layer)
    assert isinstance(vectors, list) and len(vectors) == len(SENTENCES)
    for got, words in zip(vectors, SENTENCES):
        expected = SELECT[output_layer](their_layers(their_folder, words))
        assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


def test_float32_arrays_equal_the_converted_models(their_folder, converted):  # noqa: F811
    model = AutoModel.from_pretrained(converted).eval()
    batch = AutoTokenizer.from_pretrained(converted)(
        SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        layers = torch.stack(model(**batch, output_hidden_states=True).hidden_states).numpy()
    for source in (their_folder, converted):
        vectors = Embedder(source).sents2elmo(SENTENCES, output_layer=-2)
        for k, (got, words) in enumerate(zip(vectors, SENTENCES)):
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, layers[:, k, 1 : len(words) + 1])
    averaged = Embedder(converted).sents2elmo(SENTENCES)
    assert [a.shape for a in averaged] == [(len(words), 16) for words in SENTENCES]
    assert averaged[3].shape == (0, 16), "an empty sentence gives an empty array"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda e: e.sents2elmo([["a"]], output_layer=3), r"output_layer must be .* in \[0, 2\], got 3"),
        (lambda e: e.sents2elmo([["a"]], output_layer="top"), "output_layer must be"),
        (lambda e: e.sents2elmo("the cat"), "got a str"),
        (lambda e: e.sents2elmo(["the cat"]), "sentence 0 must be a list of str"),
        (lambda e: Embedder(e.model_dir, batch_size=0), "batch_size must be an int >= 1, got 0"),
        (lambda e: Elmo(str(e.model_dir), None, 1), "use hf_elmo.compat.elmoformanylangs.Embedder"),
    ],
)
def test_bad_arguments_are_one_line_value_errors(call, message, converted):  # noqa: F811
    with pytest.raises(ValueError, match=message) as error:
        call(Embedder(converted))
    assert "\n" not in str(error.value)
