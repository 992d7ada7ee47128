"""`perplexity --stream` against bilm-tf's own `test()` numbers for the checkpoint it trained (fixture README)."""

import copy
import json
import re

import numpy as np
import pytest
import torch
from conftest import CHECKPOINT

from hf_elmo.commands.cli import main as cli_main
from hf_elmo.training.perplexity import load_bilm, sentence_perplexity, stream_perplexity
from hf_elmo.training.streams import assign_rows, build_streams

HELDOUT = CHECKPOINT / "heldout.txt"
BILM_TF = json.loads((CHECKPOINT / "bilmtf_perplexity.json").read_text())


def printed_perplexities(text):
    found = dict(re.findall(r"^(forward|backward|geometric mean)(?: perplexity)?\s+([\d.]+)$", text, re.M))
    return {key: float(value) for key, value in found.items()}


def test_stream_batch_1_matches_bilm_tf_per_token(checkpoint_dir):
    model, tokenizer = load_bilm(checkpoint_dir)
    result = stream_perplexity(model, tokenizer, [HELDOUT], batch_size=1, return_token_nll=True)
    expected = BILM_TF["batch_size_1"]
    assert result["targets"] == expected["n_predictions_per_direction"] == 6008
    assert result["forward"] == pytest.approx(expected["forward_ppl"], rel=1e-5)
    assert result["backward"] == pytest.approx(expected["backward_ppl"], rel=1e-5)
    assert result["geometric_mean"] == pytest.approx(expected["combined_ppl_as_test"], rel=1e-5)
    tokens = np.load(CHECKPOINT / "bilmtf_token_nll.npz")
    for direction in ("forward", "backward"):
        assert np.array_equal(result[f"{direction}_targets"], tokens[f"target_{direction}"])
        assert result[f"{direction}_nll"].shape == (6008, 1)
        np.testing.assert_allclose(result[f"{direction}_nll"], tokens[f"nll_{direction}"], rtol=0, atol=1e-4)


def test_stream_batch_16_from_the_command(checkpoint_dir, capsys):
    arguments = ["perplexity", "--model", str(checkpoint_dir), str(HELDOUT), "--stream", "--batch-size", "16"]
    assert cli_main(arguments) == 0
    out = capsys.readouterr().out
    expected = BILM_TF["batch_size_16"]
    assert "targets per direction  5,808" in out  # 363 complete batches of 16: the last incomplete one dropped
    printed = printed_perplexities(out)
    # Printed to 3 decimals: within 5e-4 / 105 < 5e-6 relative of the value.
    assert printed["forward"] == pytest.approx(expected["forward_ppl"], rel=1e-5)
    assert printed["backward"] == pytest.approx(expected["backward_ppl"], rel=1e-5)
    assert printed["geometric mean"] == pytest.approx(expected["combined_ppl_as_test"], rel=1e-5)


def test_rows_take_the_next_sentence_in_file_order():
    # Worked by hand from bilm-tf's _get_batch: sentences offering 3, 1 and 2 inputs, 2 rows, 1 step per batch.
    # Batch 0: row 0 takes s0, row 1 takes s1; batch 1: row 1 (s1 used up) takes s2; batch 2: both rows read on;
    # batch 3: row 0 finds no sentence left, so the batch is dropped.
    assert assign_rows([3, 1, 2], batch_size=2, num_steps=1) == ([[0], [1, 2]], 3)
    # With 2 steps per batch a row takes several sentences within one batch; row 1 then runs dry in batch 1.
    assert assign_rows([3, 1, 2, 1], batch_size=2, num_steps=2) == ([[0, 3], [1, 2]], 1)
    assert assign_rows([2], batch_size=2, num_steps=1) == ([[0], []], 0)


def sentence_perplexities_by_hand(model, tokenizer, lines, start_state):
    """Per direction, each line `w_1 .. w_n` run alone from `start_state` (`(L, 2P)`, `(L, 2D)`) in float64 and
    scored with the full softmax in NumPy: forward predicts `w_1 .. w_n </S>` from `<S> .. w_n`, backward
    `<S> w_1 .. w_n` from `w_1 .. </S>`; out-of-vocabulary targets as `<UNK>`."""
    elmo = copy.deepcopy(model.elmo).double().eval()
    weight, bias = (t.detach().double().numpy() for t in (model.softmax.weight, model.softmax.bias))
    ids = {word: k for k, word in enumerate(tokenizer.word_vocabulary)}
    P = model.config.projection_dim
    nll, count = np.zeros(2), 0
    for line in lines:
        words = line.split()
        targets = [ids.get(w, ids["<UNK>"]) for w in ["<S>", *words, "</S>"]]
        state = tuple(t.double()[:, None] for t in start_state)
        with torch.no_grad():
            top = elmo(**tokenizer([words], is_split_into_words=True, return_tensors="pt"), state=state)
        top = top.last_hidden_state[0].numpy()
        for direction, (hidden, target) in enumerate([(top[:-1, :P], targets[1:]), (top[1:, P:], targets[:-1])]):
            logits = hidden @ weight.T + bias
            nll[direction] += (np.logaddexp.reduce(logits, axis=1) - logits[np.arange(len(target)), target]).sum()
        count += len(words) + 1
    return np.exp(nll / count), count


@pytest.mark.parametrize("start", ["zero", "warm"])
def test_sentence_perplexity_per_direction_by_hand(checkpoint_dir, start, tmp_path):
    """`sentence_perplexity` of each direction against a float64 recomputation (the model in float64 too, so both
    sum the same products), from zeros and from a warm state; the geometric mean is the root of their product."""
    model, tokenizer = load_bilm(checkpoint_dir)
    model = model.double()
    lines = HELDOUT.read_text(encoding="utf-8").splitlines()[:12]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    generator = torch.Generator().manual_seed(0)
    warm = tuple(
        0.1 * torch.randn(t.shape[0], t.shape[-1], generator=generator, dtype=torch.float64)
        for t in model.elmo.initial_state(1)
    )
    model.elmo.set_warm_state(warm)
    start_state = warm if start == "warm" else tuple(torch.zeros_like(t) for t in warm)
    result = sentence_perplexity(model, tokenizer, [tmp_path / "lines.txt"], start=start, batch_size=16)
    (forward, backward), count = sentence_perplexities_by_hand(model, tokenizer, lines, start_state)
    assert result["targets"] == count
    assert result["forward"] == pytest.approx(forward, rel=1e-9)
    assert result["backward"] == pytest.approx(backward, rel=1e-9)
    assert abs(forward - backward) > 1e-3 * forward  # the two directions are told apart
    assert result["geometric_mean"] == pytest.approx((result["forward"] * result["backward"]) ** 0.5, rel=1e-12)


def test_sentences_from_zero_lose_to_the_stream(checkpoint_dir):
    """Each sentence from the zero state scores the same predictions as the batch-1 stream, measurably worse: the
    README's row for `--start zero` (printed to 3 decimals; float32 sums of 6,008 predictions)."""
    model, tokenizer = load_bilm(checkpoint_dir)
    zero = sentence_perplexity(model, tokenizer, [HELDOUT], start="zero", batch_size=50)
    assert zero["targets"] == 6008
    assert zero["geometric_mean"] > 1.05 * BILM_TF["batch_size_1"]["combined_ppl_as_test"]
    readme = {"geometric_mean": 119.253, "forward": 116.147, "backward": 122.443}
    for key, value in readme.items():
        assert zero[key] == pytest.approx(value, abs=5e-4 + 1e-5 * value), key


def test_stream_errors(checkpoint_dir, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("one line\nand another\n")
    model = str(checkpoint_dir)
    runs = {
        (str(short), "--stream", "--batch-size", "3"): "2 lines cannot fill one batch of 3 streams",
        (str(short), "--start", "warm"): "This model has no warm start state: estimate one with `hf-elmo warm-state",
        (str(short), "--stream", "--batch-size", "0"): "batch size must be >= 1, got 0",
    }
    for arguments, message in runs.items():
        assert cli_main(["perplexity", "--model", model, *arguments]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["perplexity", "--model", model, str(short), "--stream", "--start", "zero"])
    assert "not allowed with argument" in capsys.readouterr().err
    bilm, tokenizer = load_bilm(checkpoint_dir)
    with pytest.raises(ValueError, match="start must be one of \\('zero', 'warm'\\), got 'cold'"):
        sentence_perplexity(bilm, tokenizer, [short], start="cold")
    with pytest.raises(ValueError, match="batch size and steps per batch must be >= 1, got 1 and 0"):
        build_streams([["a"]], tokenizer, batch_size=1, num_steps=0)
