"""`hf_elmo.compat.allennlp` against AllenNLP's behaviour: its fixture numbers (ten batches with the state carried,
AllenNLP's own tolerance), its state store growing and shrinking with the batch size (against the model run with
explicit states), its `ScalarMix` with and without layer norm (a float64 recomputation), its character ids (written
by hand from the documented rule) and the HDF5 layout of `allennlp elmo`."""

import json
import logging
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import FIXTURES, fixture_batches
from test_scalar_mix import reference_mix

from hf_elmo import ElmoModel, ElmoTokenizer
from hf_elmo.compat import allennlp as compat
from hf_elmo.compat.allennlp import Elmo, ElmoEmbedder, batch_to_ids


def original_files(name="allennlp"):
    return str(FIXTURES / name / "options.json"), str(FIXTURES / name / "lm_weights.hdf5")


def matches_fixture(actual, expected):
    # AllenNLP's test: numpy.allclose(atol=1e-6) with numpy's default rtol.
    return actual.shape == expected.shape and np.allclose(actual, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["allennlp", "bilm-tf"])
def test_embedder_reproduces_the_stateful_fixture_over_ten_batches(name):
    embedder = ElmoEmbedder(*original_files(name))
    for i, (sentences, expected) in enumerate(fixture_batches(name)):
        vectors = embedder.embed_batch(sentences)
        for k, words in enumerate(sentences):
            assert vectors[k].dtype == np.float32 and vectors[k].shape == (3, len(words), 32)
            assert matches_fixture(vectors[k][2], expected[k]), (i, k)


def test_stateless_and_reset_embedders_start_every_batch_from_zeros():
    batches = fixture_batches("allennlp")
    stateless = ElmoEmbedder(*original_files(), stateful=False)
    assert all(matches_fixture(v[2], e) for v, e in zip(stateless.embed_batch(batches[0][0]), batches[0][1]))
    second = stateless.embed_batch(batches[1][0])
    assert not matches_fixture(second[0][2], batches[1][1][0]), "batch 1 of the fixture needs batch 0's state"
    fresh = ElmoEmbedder(*original_files())
    for got, alone in zip(second, fresh.embed_batch(batches[1][0])):
        np.testing.assert_array_equal(got, alone)
    fresh.reset_states()
    for got, again in zip(second, fresh.embed_batch(batches[1][0])):
        np.testing.assert_array_equal(got, again)


def test_reset_states_with_a_mask_restarts_only_those_rows():
    first, second = [["a", "b"], ["c"]], [["d", "e", "f"], ["g", "h"]]
    carried = ElmoEmbedder(*original_files())
    carried.embed_batch(first)
    carried.reset_states()  # as if nothing came before
    fresh = carried.embed_batch(second)
    partly = ElmoEmbedder(*original_files())
    partly.embed_batch(first)
    after_first = ElmoEmbedder(*original_files())
    after_first.embed_batch(first)
    partly.elmo_bilm.reset_states(torch.tensor([False, True]))
    got, continued = partly.embed_batch(second), after_first.embed_batch(second)
    np.testing.assert_allclose(got[0], continued[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[1], fresh[1], rtol=0, atol=1e-6)
    assert not np.allclose(continued[1], fresh[1], atol=1e-3)


def test_without_carried_state_every_sentence_starts_from_the_warm_start_state(converted_dirs):
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"]).eval()
    warm = (torch.randn(2, 32) * 0.1, torch.randn(2, 128) * 0.1)
    model.set_warm_state(warm)
    elmo = Elmo(None, None, 1, dropout=0.0, module=model, scalar_mix_parameters=[-9e10, -9e10, 1.0], stateful=False)
    sentences = [["The", "bank"], ["of", "the", "river", "."]]
    encoded = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    start = tuple(t[:, None].expand(-1, 2, -1).contiguous() for t in warm)
    with torch.no_grad():
        expected = model(**encoded, state=start).last_hidden_state
        zeros = model(**encoded, state=model.initial_state(2, warm=False)).last_hidden_state
        for _ in range(2):  # the same every call
            got = elmo(batch_to_ids(sentences))["elmo_representations"][0]
            for k, words in enumerate(sentences):
                n = len(words)
                torch.testing.assert_close(got[k, :n], expected[k, 1 : n + 1])
                assert not torch.allclose(got[k, :n], zeros[k, 1 : n + 1], atol=1e-4)


def test_the_note_on_state_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(compat, "_noted_state", False)
    embedder = ElmoEmbedder(*original_files())
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        embedder.embed_sentence(["a"])
        embedder.embed_sentence(["b"])
        ElmoEmbedder(*original_files(), stateful=False).embed_sentence(["c"])
    notes = [r for r in caplog.records if "stateful=False" in r.getMessage()]
    assert len(notes) == 1


def test_the_state_store_grows_and_shrinks_like_allennlps():
    """Batches of 2, 1, 3 and 2 sentences: a smaller batch continues and replaces only the first rows, a larger one
    starts its new rows from zeros (AllenNLP's `_EncoderBase`), checked against the model run with explicit states."""
    batches = [
        [["a", "b", "c"], ["d", "e"]],
        [["f", "g", "h", "i"]],
        [["j"], ["k", "l"], ["m", "n", "o"]],
        [["p"], ["q"]],
    ]
    embedder = ElmoEmbedder(*original_files())
    model = embedder.elmo_bilm.model.double()
    tokenizer = ElmoTokenizer()
    store = model.initial_state(0)  # rows of AllenNLP's store so far, in row order
    for batch in batches:
        rows = len(batch)
        zeros = model.initial_state(max(0, rows - store[0].shape[1]))
        start = tuple(torch.cat([stored[:, :rows], new], dim=1) for stored, new in zip(store, zeros))
        encoded = tokenizer(batch, is_split_into_words=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(**encoded, state=start, use_cache=True, output_hidden_states=True)
        store = tuple(torch.cat([final, stored[:, rows:]], dim=1) for final, stored in zip(out.state, store))
        layers = torch.stack(out.hidden_states, dim=1)
        for k, (got, words) in enumerate(zip(embedder.embed_batch(batch), batch)):
            np.testing.assert_allclose(got, layers[k, :, 1 : len(words) + 1].numpy(), rtol=0, atol=1e-12)
    assert embedder.elmo_bilm._states[0].shape == (2, 3, 32)


def test_elmo_reproduces_the_fixture_through_a_fixed_mix_of_the_top_layer():
    elmo = Elmo(*original_files(), 2, dropout=0.0, scalar_mix_parameters=[-9e10, -9e10, 1.0])
    assert elmo.get_output_dim() == 32
    for i, (sentences, expected) in enumerate(fixture_batches("allennlp")):
        out = elmo(batch_to_ids(sentences))
        assert set(out) == {"elmo_representations", "mask"} and len(out["elmo_representations"]) == 2
        lengths = [len(words) for words in sentences]
        assert out["mask"].dtype == torch.bool
        assert out["mask"].tolist() == [[t < n for t in range(max(lengths))] for n in lengths]
        for representation in out["elmo_representations"]:
            assert representation.shape == (3, max(lengths), 32)
            for k, n in enumerate(lengths):
                assert matches_fixture(representation[k, :n].detach().numpy(), expected[k]), (i, k)
                assert not representation[k, n:].any()


@pytest.mark.parametrize("keep_sentence_boundaries", [False, True])
@pytest.mark.parametrize("do_layer_norm", [False, True])
def test_elmo_scalar_mix_matches_a_float64_recomputation(do_layer_norm, keep_sentence_boundaries):
    """AllenNLP mixes the layers with `<S>`/`</S>` (layer norm statistics over them too), then removes them."""
    sentences = [["The", "bank", "of", "the", "river", "."], ["Hi"], ["naïve", "😀", "x" * 60]]
    weights = [0.25, -1.25, 2.0]
    elmo = Elmo(
        *original_files(),
        1,
        do_layer_norm=do_layer_norm,
        dropout=0.0,
        keep_sentence_boundaries=keep_sentence_boundaries,
        scalar_mix_parameters=weights,
        stateful=False,
    ).double()
    model = elmo._elmo_lstm.model
    encoded = ElmoTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = [layer.numpy() for layer in model(**encoded, output_hidden_states=True).hidden_states]
        out = elmo(batch_to_ids(sentences))
    mask = encoded["attention_mask"].numpy().astype(bool)
    expected = reference_mix(layers, np.array(weights), 1.0, mask, do_layer_norm)
    lengths = [len(words) for words in sentences]
    if not keep_sentence_boundaries:
        expected = np.stack([np.where(np.arange(6)[:, None] < n, row[1:-1], 0.0) for row, n in zip(expected, lengths)])
        mask = np.arange(6)[None, :] < np.array(lengths)[:, None]
    np.testing.assert_allclose(out["elmo_representations"][0].numpy(), expected, rtol=0, atol=1e-12)
    assert out["mask"].numpy().tolist() == mask.tolist()


def test_scalar_mix_is_trainable_unless_fixed_and_the_bilm_only_with_requires_grad():
    learned = Elmo(*original_files(), 1, dropout=0.0)
    fixed = Elmo(*original_files(), 1, dropout=0.0, scalar_mix_parameters=[0.0, 0.0, 0.0], requires_grad=True)
    assert learned.scalar_mix_0.scalar_parameters.requires_grad and learned.scalar_mix_0.gamma.requires_grad
    assert not fixed.scalar_mix_0.scalar_parameters.requires_grad and not fixed.scalar_mix_0.gamma.requires_grad
    assert not any(p.requires_grad for p in learned._elmo_lstm.parameters())
    assert all(p.requires_grad for p in fixed._elmo_lstm.parameters())
    ids = batch_to_ids([["a", "b"], ["c"]])
    learned(ids)["elmo_representations"][0].sum().backward()
    assert learned.scalar_mix_0.scalar_parameters.grad is not None
    fixed(ids)["elmo_representations"][0].sum().backward()
    assert fixed._elmo_lstm.model.char_encoder.char_embedding.weight.grad is not None


def test_dropout_applies_in_training_only_and_not_inside_the_bilm():
    elmo = Elmo(*original_files(), 1, dropout=0.5, stateful=False)
    ids = batch_to_ids([["a", "b", "c"]])
    evaluated = elmo.eval()(ids)["elmo_representations"][0]
    trained = elmo.train()(ids)["elmo_representations"][0]
    assert not elmo._elmo_lstm.model.training
    kept = trained != 0
    assert 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(trained[kept], 2 * evaluated[kept], rtol=0, atol=1e-6)


def test_vocab_to_cache_reads_word_ids_and_falls_back_to_characters():
    vocab = ["<pad>", "the", "bank", "river"]
    elmo = Elmo(*original_files(), 1, dropout=0.0, vocab_to_cache=vocab, stateful=False)
    sentences = [["the", "bank"], ["river"]]
    by_characters = elmo(batch_to_ids(sentences))
    word_ids = torch.tensor([[1, 2], [3, 0]])
    by_words = elmo(batch_to_ids(sentences), word_ids)
    assert by_words["mask"].tolist() == [[True, True], [True, False]]
    torch.testing.assert_close(by_words["elmo_representations"][0], by_characters["elmo_representations"][0])
    unknown = elmo(batch_to_ids(sentences), torch.tensor([[1, 9], [3, 0]]))  # 9 is not cached: the characters count
    torch.testing.assert_close(unknown["elmo_representations"][0], by_characters["elmo_representations"][0])
    # Leading dimensions are kept, as in AllenNLP.
    nested = elmo(batch_to_ids(sentences).reshape(1, 2, 2, 50))
    assert nested["mask"].shape == (1, 2, 2) and nested["elmo_representations"][0].shape == (1, 2, 2, 32)
    torch.testing.assert_close(nested["elmo_representations"][0][0], by_characters["elmo_representations"][0])


def test_empty_sentences():
    out = Elmo(*original_files(), 1)(batch_to_ids([[]]))
    assert out["elmo_representations"][0].shape == (1, 0, 32) and out["mask"].shape == (1, 0)
    embedder = ElmoEmbedder(*original_files())
    assert [v.shape for v in embedder.embed_batch([[]])] == [(3, 0, 32)]
    assert embedder.elmo_bilm._states is None, "a batch of only an empty sentence is not run, as in AllenNLP"
    assert [v.shape for v in embedder.embed_batch([[], ["a"]])] == [(3, 0, 32), (3, 1, 32)]
    assert embedder.elmo_bilm._states[0].shape == (2, 2, 32), "an empty sentence still takes its row"


def test_batch_to_ids_writes_allennlps_ids():
    """Expected ids written by hand from AllenNLP's rule: UTF-8 bytes + 1 between begin-of-word 259 and end-of-word
    260, the first 48 bytes only (a cut may split a character), padding character 261, a literal <S> / </S> the
    boundary row (257 / 258 inside), padding positions all zeros."""

    def row(*inner):
        return [259, *inner, 260] + [261] * (48 - len(inner))

    sentences = [
        ["é", "naïve", "😀", "𝐀", "x" * 60, "a" + "😀" * 12, "<S>", "</S>", "<s>", ""],
        ["日本", "A"],
    ]
    expected_first = [
        row(0xC3 + 1, 0xA9 + 1),
        row(ord("n") + 1, ord("a") + 1, 0xC3 + 1, 0xAF + 1, ord("v") + 1, ord("e") + 1),
        row(0xF0 + 1, 0x9F + 1, 0x98 + 1, 0x80 + 1),
        row(0xF0 + 1, 0x9D + 1, 0x90 + 1, 0x80 + 1),
        row(*[ord("x") + 1] * 48),
        row(ord("a") + 1, *[0xF0 + 1, 0x9F + 1, 0x98 + 1, 0x80 + 1] * 11, 0xF0 + 1, 0x9F + 1, 0x98 + 1),
        row(257),
        row(258),
        row(ord("<") + 1, ord("s") + 1, ord(">") + 1),
        row(),
    ]
    expected_second = [
        row(0xE6 + 1, 0x97 + 1, 0xA5 + 1, 0xE6 + 1, 0x9C + 1, 0xAC + 1),
        row(ord("A") + 1),
    ] + [[0] * 50] * 8
    ids = batch_to_ids(sentences)
    assert ids.dtype == torch.int64 and ids.shape == (2, 10, 50)
    assert ids[0].tolist() == expected_first
    assert ids[1].tolist() == expected_second


def test_folder_and_module_give_the_numbers_of_the_original_files(converted_dirs):
    sentences = [["The", "bank"], ["of", "the", "river", "."]]
    expected = ElmoEmbedder(*original_files()).batch_to_embeddings(sentences)[0]
    from_folder = ElmoEmbedder(str(converted_dirs["allennlp"])).batch_to_embeddings(sentences)[0]
    torch.testing.assert_close(from_folder, expected, rtol=0, atol=0)
    module = ElmoModel.from_pretrained(converted_dirs["allennlp"])
    elmo = Elmo(None, None, 1, dropout=0.0, module=module, scalar_mix_parameters=[-9e10, -9e10, 1.0])
    torch.testing.assert_close(elmo(batch_to_ids(sentences))["elmo_representations"][0], expected[:, 2])


def test_a_hub_id_gives_the_numbers_of_the_original_files(converted_dirs, tmp_path, monkeypatch):
    """`ElmoEmbedder("org/elmo")` and `Elmo("org/elmo", None, 1)` load a model pushed to a (faked) Hub by its id, in a
    fresh offline process, and give the original files' numbers."""
    from fake_hub import FakeHub

    hub = FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    ElmoModel.from_pretrained(converted_dirs["allennlp"]).push_to_hub("org/elmo")
    ElmoTokenizer.from_pretrained(converted_dirs["allennlp"]).push_to_hub("org/elmo")
    assert hub.snapshot("org/elmo") is not None
    sentences = [["The", "bank"], ["of", "the", "river", "."]]
    expected = ElmoEmbedder(*original_files()).batch_to_embeddings(sentences)[0]
    script = f"""
import numpy as np, torch
from hf_elmo.compat.allennlp import Elmo, ElmoEmbedder, batch_to_ids
sentences = {sentences!r}
layers = ElmoEmbedder("org/elmo").batch_to_embeddings(sentences)[0]
top = Elmo("org/elmo", None, 1, dropout=0.0, scalar_mix_parameters=[-9e10, -9e10, 1.0])(batch_to_ids(sentences))
np.save("layers.npy", layers.numpy()); np.save("top.npy", top["elmo_representations"][0].detach().numpy())
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub-cache")}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "layers.npy")), expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "top.npy")), expected[:, 2])


def test_embed_file_writes_allennlps_layout(tmp_path):
    lines = ["The bank of the river .", "a b", "  The bank of the river .  ", "x"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = ElmoEmbedder(*original_files(), stateful=True)
    expected = [
        *expected.embed_batch([line.split() for line in lines[:2]]),
        *expected.embed_batch([line.split() for line in lines[2:]]),
    ]
    for output_format, select in [("all", lambda v: v), ("top", lambda v: v[-1]), ("average", lambda v: v.mean(0))]:
        output = tmp_path / f"{output_format}.hdf5"
        ElmoEmbedder(*original_files()).embed_file(open(source, encoding="utf-8"), output, output_format, batch_size=2)
        with h5py.File(output, "r") as f:
            assert set(f) == {"0", "1", "2", "3", "sentence_to_index"}
            for i in range(4):
                assert f[str(i)].dtype == np.float32
                np.testing.assert_allclose(f[str(i)][...], select(expected[i]), rtol=1e-6, atol=1e-6)
            # The later of two equal lines wins, as in AllenNLP.
            assert json.loads(f["sentence_to_index"][0]) == {"The bank of the river .": "2", "a b": "1", "x": "3"}
    keyed = tmp_path / "keyed.hdf5"
    ElmoEmbedder(*original_files()).embed_file(str(source), keyed, "top", forget_sentences=True, batch_size=2)
    with h5py.File(keyed, "r") as f:
        assert set(f) == {"0", "1", "2", "3"}
    unique = tmp_path / "unique.txt"
    unique.write_text("a b\nc\n", encoding="utf-8")
    ElmoEmbedder(*original_files()).embed_file(str(unique), keyed, "top", use_sentence_keys=True)
    with h5py.File(keyed, "r") as f:
        assert set(f) == {"a b", "c"} and f["a b"].shape == (2, 32)


@pytest.mark.parametrize(
    "lines, options, message",
    [
        (["a", "", "b", " "], {}, r"empty lines at indexes \[1, 3\]"),
        (["a b", "c", "a b"], {"use_sentence_keys": True}, "line 2 repeats line 0"),
        (["a/b"], {"use_sentence_keys": True}, "cannot hold '/'"),
        (["a"], {"output_format": "mean"}, "output_format must be one of all, top, average; got 'mean'"),
        (["a"], {"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
    ],
)
def test_embed_file_refuses_bad_input_and_writes_nothing(lines, options, message, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "out.hdf5"
    embedder = ElmoEmbedder(*original_files())
    with pytest.raises(ValueError, match=message) as error:
        embedder.embed_file(str(source), output, **options)
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == [source]


def test_embed_file_never_replaces_its_input_or_the_model(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    weights = tmp_path / "weights.hdf5"
    weights.write_bytes((FIXTURES / "allennlp" / "lm_weights.hdf5").read_bytes())
    embedder = ElmoEmbedder(original_files()[0], str(weights))
    for output in (source, weights):
        before = output.read_bytes()
        with pytest.raises(ValueError, match=f"{output}: is the input"):
            embedder.embed_file(open(source, encoding="utf-8"), output)
        assert output.read_bytes() == before
    notes = tmp_path / "notes.hdf5"
    notes.write_text("not vectors", encoding="utf-8")
    with pytest.raises(ValueError, match="is not an HDF5 file"):
        embedder.embed_file(str(source), notes)
    assert notes.read_text(encoding="utf-8") == "not vectors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "notes.hdf5", "weights.hdf5"]


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Elmo(original_files()[0], None, 1), "needs its weight file"),
        (lambda: Elmo(*original_files(), 0), "num_output_representations must be an int >= 1, got 0"),
        (lambda: Elmo(*original_files(), 1, dropout=1.5), r"dropout must be a number in \[0, 1\], got 1.5"),
        (lambda: Elmo(*original_files(), 1, scalar_mix_parameters=[1.0, 2.0]), "2 initial weights for 3 layers"),
        (lambda: Elmo(*original_files(), 1, scalar_mix_parameters=[0.0, float("nan"), 0.0]), "must be finite"),
        (lambda: Elmo(*original_files(), 1, module=torch.nn.Linear(2, 2)), "not both"),
        (lambda: Elmo("https://example.org/options.json", "w.hdf5", 1), "URLs are not downloaded"),
        (lambda: Elmo(*original_files(), 1)(torch.zeros(2, 3, 10, dtype=torch.long)), r"\(batch_size, timesteps, 50\)"),
        (lambda: Elmo(*original_files(), 1)(-batch_to_ids([["a"]])), "character ids must be >= 0"),
        (lambda: Elmo(*original_files(), 1)(batch_to_ids([])), "the batch holds no sentence"),
        (lambda: Elmo("no/such/folder", None, 1), "no such model folder"),
        (lambda: batch_to_ids("The cat"), "expects a list of tokenized sentences"),
        (lambda: batch_to_ids(["The cat"]), "sentence 0 must be a list of str"),
        (lambda: batch_to_ids([["The", 3]]), "sentence 0: Every word must be a str, but word 1 is int"),
        (lambda: ElmoEmbedder(*original_files(), cuda_device=torch.cuda.device_count()), "CUDA devices"),
    ],
)
def test_bad_arguments_are_one_line_value_errors(build, message):
    with pytest.raises(ValueError, match=message) as error:
        build()
    assert "\n" not in str(error.value)


def test_saved_models_do_not_carry_the_compat_modules(tmp_path):
    elmo = Elmo(*original_files(), 1)
    elmo._elmo_lstm.model.save_pretrained(tmp_path / "saved")
    code = {path.name: path.read_text() for path in (tmp_path / "saved").glob("*.py")}
    assert code and not any("compat" in text for text in code.values())
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, hf_elmo; print(sorted(m for m in sys.modules if 'compat' in m))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "hf_elmo.compat" not in loaded.stdout, "importing the package must not import the compat modules"
