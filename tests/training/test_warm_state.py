"""The warm start state: estimated from text, stored with the weights, the start of every row unless `state=`."""

import copy
import json
import re
import shutil
import textwrap
import warnings

import h5py
import numpy as np
import pytest
import torch
from conftest import CHECKPOINT, FIXTURES, as_a_folder_copy_runs, run_without_hf_elmo
from datasets import Dataset
from fake_hub import FakeHub
from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer, pipeline

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.convert.to_original import export
from hf_elmo.features.task_data import ElmoLayerCache
from hf_elmo.training.perplexity import load_bilm
from hf_elmo.training.warm_state import estimate_warm_state, store_warm_state

BILM_TF_STREAM = json.loads((CHECKPOINT / "bilmtf_perplexity.json").read_text())["batch_size_1"]["combined_ppl_as_test"]
WORDS = [["The", "bank", "of", "the", "river", "."], ["Deposit", "money", "!"], ["Yes"]]
TEXT = ["the cat sat on the mat .", "a dog ran .", "it rained all day in the town ."]


@pytest.fixture(scope="module")
def warm_dir(converted_dirs, tmp_path_factory):
    """The allennlp fixture model with a warm start state estimated from a few sentences."""
    folder = tmp_path_factory.mktemp("warm") / "model"
    shutil.copytree(converted_dirs["allennlp"], folder)
    text = folder.parent / "text.txt"
    text.write_text("\n".join(TEXT * 4) + "\n")
    assert cli_main(["warm-state", "--model", str(folder), "--in-place", str(text)]) == 0
    return folder


def run(model, **kwargs):
    batch = ElmoTokenizer()(WORDS, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, **kwargs)


def test_warm_start_scores_like_bilm_tf_stream(checkpoint_dir, tmp_path, capsys):
    folder = tmp_path / "bilm"
    shutil.copytree(checkpoint_dir, folder)
    arguments = [
        "warm-state",
        "--model",
        str(folder),
        "--in-place",
        str(CHECKPOINT / "train.txt"),
        "--sentences",
        "200",
    ]
    assert cli_main(arguments) == 0
    assert f"Warm start state from 200 sentences written to {folder}" in capsys.readouterr().out
    model, _ = load_bilm(folder)
    assert model.config.warm_state and model.elmo.warm_state is not None
    combined = {}
    for start in ("warm", "zero"):
        arguments = ["perplexity", "--model", str(folder), str(CHECKPOINT / "heldout.txt"), "--start", start]
        assert cli_main([*arguments, "--batch-size", "50"]) == 0
        out = capsys.readouterr().out
        assert "targets per direction  6,008" in out
        combined[start] = float(re.search(r"^geometric mean\s+([\d.]+)$", out, re.M).group(1))
    assert combined["warm"] == pytest.approx(BILM_TF_STREAM, rel=0.01)
    assert combined["warm"] < 0.95 * combined["zero"]


def stream_mean_by_hand(model, sentences, streams):
    """The warm-state estimate built from explicit `state=` calls, one row and one direction at a time: sentence k
    goes to stream k mod `streams`; each stream's forward LM reads `<S> w_1 .. w_n` and its backward LM
    `w_1 .. w_n </S>` (read right to left), each carrying its own state from the stream's previous sentence; the
    state after every sentence is averaged."""
    characters = ElmoTokenizer().characters
    P, D = model.config.projection_dim, model.config.cell_dim
    zeros = model.initial_state(1, warm=False)
    carried = {(k, direction): zeros for k in range(streams) for direction in (0, 1)}
    total_hidden, total_memory = torch.zeros_like(zeros[0][:, 0]), torch.zeros_like(zeros[1][:, 0])
    for index, words in enumerate(sentences):
        for direction, tokens in enumerate([["<S>", *words], [*words, "</S>"]]):
            input_ids = torch.as_tensor(characters.rows(tokens))[None]
            with torch.no_grad():
                hidden, memory = model(input_ids, state=carried[index % streams, direction], use_cache=True).state
            carried[index % streams, direction] = (hidden, memory)
            total_hidden[:, direction * P : (direction + 1) * P] += hidden[:, 0, direction * P : (direction + 1) * P]
            total_memory[:, direction * D : (direction + 1) * D] += memory[:, 0, direction * D : (direction + 1) * D]
    return total_hidden / len(sentences), total_memory / len(sentences)


def test_the_estimate_is_the_mean_over_continuous_streams(converted_dirs):
    """`estimate_warm_state` against the same mean built by hand (float64 weights; the estimator keeps the carried
    state in float32 between sentences, so within the propagation of that rounding, about 1e-7 of the values)."""
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"]).double().eval()
    sentences = [line.split() for line in TEXT * 2] + [["one"], ["Two", "words"]]
    estimate = estimate_warm_state(model, sentences, streams=3)
    by_hand = stream_mean_by_hand(model, sentences, streams=3)
    for got, expected in zip(estimate, by_hand):
        assert (got.double() - expected).abs().max() <= 1e-6 * expected.abs().max()
    # Each sentence from zeros instead (the mistake this guards against) is far outside that.
    from_zeros = stream_mean_by_hand(model, sentences, streams=len(sentences))
    assert (from_zeros[0] - by_hand[0]).abs().max() > 1e-3 * by_hand[0].abs().max()


def test_warm_state_is_where_every_row_starts(warm_dir, converted_dirs):
    model = ElmoModel.from_pretrained(warm_dir).eval()
    plain = ElmoModel.from_pretrained(converted_dirs["allennlp"]).eval()
    hidden, memory = model.warm_state
    assert hidden.shape == (2, 32) and memory.shape == (2, 128) and hidden.abs().sum() > 0
    start = tuple(t[:, None].expand(-1, len(WORDS), -1).contiguous() for t in (hidden, memory))
    default, explicit = run(model), run(model, state=start)
    assert all(torch.equal(a, b) for a, b in zip(default.hidden_states, explicit.hidden_states))
    # state= overrides it: from zeros the model computes what the same weights without a warm state compute.
    zeros = model.initial_state(len(WORDS), warm=False)
    assert all(torch.equal(a, b) for a, b in zip(run(model, state=zeros).hidden_states, run(plain).hidden_states))
    assert not torch.allclose(default.last_hidden_state, run(plain).last_hidden_state, atol=1e-3)
    # Deterministic and batch-invariant: each sentence alone gives what it gives in the padded batch.
    assert torch.equal(run(model).last_hidden_state, default.last_hidden_state)
    for row, words in enumerate(WORDS):
        batch = ElmoTokenizer()([words], is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            alone = model(**batch).last_hidden_state[0]
        n = len(words) + 2
        # float32 rounding in another order of summation, some 1e-7 of the magnitudes (test_modeling_elmo's bound)
        assert (alone - default.last_hidden_state[row, :n]).abs().max() <= 1e-5 * default.last_hidden_state.abs().max()


def test_warm_state_survives_loading_moving_and_heads(warm_dir, tmp_path):
    model = ElmoModel.from_pretrained(warm_dir).eval()
    expected = run(model).last_hidden_state
    model.save_pretrained(tmp_path / "again")
    assert torch.equal(run(ElmoModel.from_pretrained(tmp_path / "again")).last_hidden_state, expected)
    assert torch.equal(AutoModel.from_pretrained(warm_dir).warm_hidden, model.warm_hidden)
    half = ElmoModel.from_pretrained(warm_dir).to(torch.bfloat16)
    assert half.warm_hidden.dtype == torch.bfloat16 and run(half).last_hidden_state.dtype == torch.bfloat16
    without = ElmoModel.from_pretrained(warm_dir, warm_state=False)
    assert without.warm_state is None and not without.config.warm_state
    # A head built on the folder runs its biLM from the warm state.
    tagger = AutoModelForTokenClassification.from_pretrained(warm_dir, num_labels=3).eval()
    assert torch.equal(tagger.elmo.warm_memory, model.warm_memory)
    batch = ElmoTokenizer()(WORDS, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = torch.stack(run(model).hidden_states, dim=2)
        from_layers = tagger(**batch, elmo_hidden_states=layers).logits
        assert torch.equal(tagger(**batch).logits, from_layers)
    # Removing it returns to zeros.
    model.set_warm_state(None)
    assert model.warm_state is None and not hasattr(model, "warm_hidden")


def test_pipeline_embed_and_layer_cache_use_the_warm_state(warm_dir, tmp_path):
    model = ElmoModel.from_pretrained(warm_dir).eval()
    text = "the cat sat ."
    extractor = pipeline("feature-extraction", model=str(warm_dir))
    tokenizer = AutoTokenizer.from_pretrained(warm_dir)
    on_device = copy.deepcopy(model).to(extractor.device)  # the pipeline takes a GPU where there is one
    with torch.no_grad():
        batch = tokenizer(text, return_tensors="pt").to(extractor.device)
        expected = on_device(**batch).last_hidden_state.cpu().numpy()
    assert np.array_equal(np.array(extractor(text), dtype=np.float32), expected)

    source = tmp_path / "in.txt"
    source.write_text("\n".join(" ".join(w) for w in WORDS) + "\n")
    for extra in ([], ["--carry-state"]):
        output = tmp_path / f"out{len(extra)}.hdf5"
        assert cli_main(["embed", str(source), str(output), "--model", str(warm_dir), "--top", "--quiet", *extra]) == 0
        with h5py.File(output, "r") as f:
            # The first batch of --carry-state starts from the warm state too.
            top = run(model).last_hidden_state
            for row, words in enumerate(WORDS):
                np.testing.assert_allclose(f[str(row)][...], top[row, 1 : len(words) + 1].numpy(), atol=1e-6, rtol=0)

    ids = ElmoTokenizer()(WORDS, is_split_into_words=True)["input_ids"]
    cached = Dataset.from_dict({"input_ids": ids}).map(ElmoLayerCache(model), batched=True)
    layers = torch.stack(run(model).hidden_states, dim=2)
    for row, words in enumerate(WORDS):
        np.testing.assert_allclose(
            np.asarray(cached[row]["elmo_hidden_states"]), layers[row, : len(words) + 2].numpy(), atol=1e-6, rtol=0
        )


def test_remote_code_and_hub_carry_the_warm_state(warm_dir, tmp_path, monkeypatch):
    FakeHub(tmp_path / "hub-cache").install(monkeypatch)
    model = ElmoModel.from_pretrained(warm_dir).eval()
    model.push_to_hub("org/warm-elmo")
    AutoTokenizer.from_pretrained(warm_dir).push_to_hub("org/warm-elmo")
    script = textwrap.dedent(
        f"""
        import numpy, torch
        from transformers import AutoModel, AutoTokenizer
        for index, source in enumerate([{str(warm_dir)!r}, "org/warm-elmo"]):
            model = AutoModel.from_pretrained(source, trust_remote_code=True).eval()
            assert model.config.warm_state and model.warm_state is not None
            batch = AutoTokenizer.from_pretrained(source, trust_remote_code=True)(
                {WORDS!r}, is_split_into_words=True, padding=True, return_tensors="pt")
            with torch.no_grad():
                numpy.save(f"top{{index}}.npy", model(**batch).last_hidden_state.numpy())
        """
    )
    run_without_hf_elmo(script, tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub-cache"))
    with as_a_folder_copy_runs(model):
        expected = run(model).last_hidden_state.numpy()
    for index in range(2):
        assert np.array_equal(np.load(tmp_path / f"top{index}.npy"), expected)


def test_convert_with_warm_state_text_and_export_warning(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(TEXT) + "\n")
    folder = FIXTURES / "allennlp"
    arguments = ["convert", "--options", str(folder / "options.json"), "--weights", str(folder / "lm_weights.hdf5")]
    assert cli_main([*arguments, "--output-dir", str(tmp_path / "warm"), "--warm-state-text", str(text)]) == 0
    assert cli_main([*arguments, "--output-dir", str(tmp_path / "plain")]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export(tmp_path / "plain", tmp_path / "exported-plain")
    # On the device the converter used (a GPU's rounding differs from the CPU's).
    assert cli_main(["warm-state", "--model", str(tmp_path / "plain"), "--in-place", str(text), "--device", "cpu"]) == 0
    converted, stored = ElmoModel.from_pretrained(tmp_path / "warm"), ElmoModel.from_pretrained(tmp_path / "plain")
    assert all(torch.equal(a, b) for a, b in zip(converted.warm_state, stored.warm_state))
    with pytest.warns(UserWarning, match="no place for the model's warm start state; it is not exported"):
        export(tmp_path / "warm", tmp_path / "exported")


def test_bilm_checkpoint_with_warm_state_and_estimator_input(checkpoint_dir):
    model = ElmoForBiLM.from_pretrained(checkpoint_dir).eval()
    with pytest.raises(ValueError, match="needs at least one sentence"):
        estimate_warm_state(model.elmo, [])
    # One stream of one sentence: the state after reading <S> w1 .. wn forward and </S> wn .. w1 backward, from zeros.
    state = estimate_warm_state(model.elmo, [["a", "b"]])
    tokenizer = ElmoTokenizer()
    P, D = model.config.projection_dim, model.config.cell_dim
    with torch.no_grad():
        forward = model.elmo(
            **tokenizer([["<S>", "a", "b"]], is_split_into_words=True, add_special_tokens=False, return_tensors="pt"),
            state=model.elmo.initial_state(1, warm=False),
            use_cache=True,
        ).state
        backward = model.elmo(
            **tokenizer([["a", "b", "</S>"]], is_split_into_words=True, add_special_tokens=False, return_tensors="pt"),
            state=model.elmo.initial_state(1, warm=False),
            use_cache=True,
        ).state
    torch.testing.assert_close(state[0], torch.cat([forward[0][:, 0, :P], backward[0][:, 0, P:]], -1))
    torch.testing.assert_close(state[1], torch.cat([forward[1][:, 0, :D], backward[1][:, 0, D:]], -1))


def test_long_lines_are_read_in_pieces_with_their_state_carried(converted_dirs, monkeypatch):
    from hf_elmo.training import warm_state

    model = ElmoModel.from_pretrained(converted_dirs["allennlp"]).eval()
    # Two streams; lines of 210, 3, 40 and 3 words, so that the rows of a step end in different pieces.
    sentences = [TEXT[0].split() * 30, TEXT[1].split(), TEXT[2].split() * 5, TEXT[1].split()]
    whole = estimate_warm_state(model, sentences, streams=2)  # every line in one call: the truth
    positions = []
    model.register_forward_pre_hook(lambda module, args: positions.append(args[0].shape[1]))
    monkeypatch.setattr(warm_state, "PIECE", 16)
    in_pieces = estimate_warm_state(model, sentences, streams=2)
    assert max(positions) == 16 and len(positions) == 17  # 211 positions: 14 pieces; 41: 3 pieces
    for carried, expected in zip(in_pieces, whole):
        torch.testing.assert_close(carried, expected)


def test_warm_state_errors(warm_dir, converted_dirs, tmp_path, capsys, monkeypatch):
    model = ElmoModel.from_pretrained(converted_dirs["allennlp"])
    shapes = r"must be \(hidden, memory\) of shapes \(2, 32\) and \(2, 128\).*got \[\(2, 16\)"
    with pytest.raises(ValueError, match=shapes):
        model.set_warm_state((torch.zeros(2, 16), torch.zeros(2, 128)))
    with pytest.raises(ValueError, match="must be finite; it contains NaN"):
        model.set_warm_state((torch.full((2, 32), float("nan")), torch.zeros(2, 128)))
    model.set_warm_state((torch.ones(2, 1, 32), torch.ones(2, 1, 128)))  # one row's state, as use_cache returns it
    assert model.warm_hidden.shape == (2, 32)

    empty, text = tmp_path / "empty.txt", tmp_path / "text.txt"
    empty.write_text("\n\n")
    text.write_text("a b c\n")
    no_weights = tmp_path / "no-weights"
    shutil.copytree(warm_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    runs = {
        (str(warm_dir), str(empty)): "is empty: it has no words",
        (str(warm_dir), str(tmp_path / "missing.txt")): "does not exist",
        (str(warm_dir), str(text), "--sentences", "0"): "--sentences must be >= 1, got 0",
        (str(no_weights), str(text)): "cannot load the model",
    }
    for (folder, *rest), message in runs.items():
        assert cli_main(["warm-state", "--model", folder, "--in-place", *rest]) == 2
        assert message in capsys.readouterr().err

    # An interrupted write leaves the folder as it was, and no temporary file.
    folder = tmp_path / "copy"
    shutil.copytree(converted_dirs["allennlp"], folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store_warm_state(folder, (torch.zeros(2, 32), torch.zeros(2, 128)))
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_warm_state_input_errors(converted_dirs, tmp_path, capsys):
    folder = tmp_path / "no-weights"
    shutil.copytree(converted_dirs["allennlp"], folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no-weights: no model.safetensors; load the model, call set_warm_state"):
        store_warm_state(folder, (torch.zeros(2, 32), torch.zeros(2, 128)))
    (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match="sharded weights are not supported"):
        store_warm_state(folder, (torch.zeros(2, 32), torch.zeros(2, 128)))
    words = ElmoModel(
        ElmoConfig(
            char_embedding_dim=4,
            filters=[[1, 4]],
            n_highway=0,
            cell_dim=8,
            projection_dim=4,
            num_layers=1,
            input_word_vocab_size=5,
            input_word_dim=3,
        )
    )
    with pytest.raises(ValueError, match="reading word embeddings \\(ELMoForManyLangs\\) is not supported"):
        estimate_warm_state(words, [["a"]])
    options, weights = FIXTURES / "allennlp/options.json", FIXTURES / "allennlp/lm_weights.hdf5"
    runs = {
        (
            "--options",
            str(options),
            "--weights",
            str(weights),
            "--warm-state-text",
            str(tmp_path / "absent.txt"),
        ): "--warm-state-text: Text file",
        (
            "--format",
            "elmoformanylangs",
            "--model-dir",
            str(tmp_path),
            "--warm-state-text",
            str(options),
        ): "--warm-state-text is not supported for --format elmoformanylangs",
    }
    for arguments, message in runs.items():
        assert cli_main(["convert", *arguments, "--output-dir", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
