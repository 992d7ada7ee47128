"""Training a biLM with `hf-elmo train` and `ElmoTrainer`: the steps are bilm-tf's Adagrad steps, training beats the
unigram perplexity, resuming and several processes give the same weights, checkpoints are complete or absent,
non-finite values stop a run, Trainer's options reach it, stored windows train as full rows, the log.
"""

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoModel, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.commands.train import (
    ElmoDataArguments,
    ElmoTrainer,
    ElmoTrainingArguments,
    parse_options,
    train_bilm,
)
from hf_elmo.training.corpus import iter_sentences, model_split
from hf_elmo.training.run_setup import tokenizer_and_config

ROOT = Path(__file__).resolve().parents[2]
SHAKESPEARE = ROOT / "data/tinyshakespeare/input.txt"


@pytest.fixture(autouse=True)
def one_thread():
    # These runs are thousands of tiny operations; on a busy machine a second thread mostly waits for a core.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Slices of the bundled corpus: 6,000 lines to train on, the next 500 held out, 200 more for short runs."""
    folder = tmp_path_factory.mktemp("corpus")
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()
    (folder / "train.txt").write_text("\n".join(lines[:6000]) + "\n", encoding="utf-8")
    (folder / "valid.txt").write_text("\n".join(lines[6000:6500]) + "\n", encoding="utf-8")
    (folder / "small.txt").write_text("\n".join(lines[7000:7200]) + "\n", encoding="utf-8")
    config = ElmoConfig(
        char_embedding_dim=8,
        filters=[[1, 16], [2, 16], [3, 32]],
        n_highway=1,
        cell_dim=64,
        projection_dim=32,
        num_layers=1,
    )
    config.to_json_file(folder / "tiny.json")
    return folder


def options(corpus, output_dir, **overrides):
    values = dict(
        output_dir=output_dir,
        train_files=[corpus / "train.txt"],
        config=str(corpus / "tiny.json"),
        split="pretokenizer",
        window=22,  # the longest line of the corpus has 20 words
        min_count=2,
        per_device_train_batch_size=16,
        logging_steps=10,
        data_cache_dir=str(corpus / "cache"),
        disable_tqdm=True,
    )
    values.update(overrides)
    return values


def unigram_perplexity(tokenizer, train_file, held_out_file):
    """Per direction: a unigram model of the training targets (add-one smoothing over the vocabulary),
    evaluated on the held-out targets (forward: each sentence's words and </S>; backward: <S> and the words)."""
    vocab = {w: i for i, w in enumerate(tokenizer.word_vocabulary)}

    def targets(path, direction):
        for words in iter_sentences([path], "pretokenizer", tokenizer):
            ids = [vocab.get(w, vocab["<UNK>"]) for w in words]
            yield from (ids + [vocab["</S>"]]) if direction == "forward" else ([vocab["<S>"]] + ids)

    result = {}
    for direction in ("forward", "backward"):
        counts = Counter(targets(train_file, direction))
        total = sum(counts.values()) + len(vocab)
        held_out = list(targets(held_out_file, direction))
        result[direction] = math.exp(-sum(math.log((counts[t] + 1) / total) for t in held_out) / len(held_out))
    return result


def test_training_beats_unigram_perplexity(corpus, tmp_path, capsys):
    # The original recipe (Adagrad 0.2, sampled softmax) on a tiny model, for 300 steps.
    metrics = train_bilm(
        **options(
            corpus,
            tmp_path / "run",
            eval_files=[corpus / "valid.txt"],
            max_steps=300,
            eval_steps=1000,
            save_steps=300,
            num_softmax_samples=256,
        )
    )
    capsys.readouterr()
    assert (
        cli_main(
            [
                "perplexity",
                "--model",
                str(tmp_path / "run"),
                "--window",
                "22",
                "--split",
                "pretokenizer",
                str(corpus / "valid.txt"),
            ]
        )
        == 0
    )
    printed = re.findall(
        r"^(forward|backward|geometric mean)(?: perplexity)?\s+([\d.]+)$", capsys.readouterr().out, re.M
    )
    result = {direction: float(value) for direction, value in printed}

    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "run")
    baseline = unigram_perplexity(tokenizer, corpus / "train.txt", corpus / "valid.txt")
    assert result["forward"] < baseline["forward"] and result["backward"] < baseline["backward"], (result, baseline)
    # The held-out file is a single map batch (< 1,000 lines), so Trainer's evaluation saw the same windows.
    for direction in ("forward", "backward"):
        assert metrics[f"eval_{direction}_perplexity"] == pytest.approx(result[direction], abs=0.006)
    assert result["geometric mean"] == pytest.approx(math.sqrt(result["forward"] * result["backward"]), abs=0.01)
    # The saved biLM is an ordinary transformers folder: its encoder loads with AutoModel.
    assert type(AutoModel.from_pretrained(tmp_path / "run")) is ElmoModel
    assert (tmp_path / "run/checkpoint-300/model.safetensors").is_file()


def test_resumed_run_ends_with_the_same_weights(corpus, tmp_path, monkeypatch):
    # Dropout and the sampled softmax make every step depend on the random state, which must be restored too;
    # the run crosses epochs (about 11 steps each), so the reshuffled data order must be restored as well.
    run = options(
        corpus,
        tmp_path / "interrupted",
        max_steps=16,
        save_steps=5,
        dropout=0.1,
        num_softmax_samples=64,
        per_device_train_batch_size=8,
        train_files=[corpus / "small.txt"],
    )
    train_bilm(**{**run, "output_dir": tmp_path / "uninterrupted"})

    original_step = ElmoTrainer.training_step

    def crash_at_step_7(self, *args, **kwargs):
        if self.state.global_step == 7:
            raise KeyboardInterrupt("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(ElmoTrainer, "training_step", crash_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        train_bilm(**run)
    monkeypatch.undo()
    assert (tmp_path / "interrupted/checkpoint-5").exists() and not (tmp_path / "interrupted/checkpoint-10").exists()
    train_bilm(**run, resume=True)

    expected = load_file(tmp_path / "uninterrupted/model.safetensors")
    actual = load_file(tmp_path / "interrupted/model.safetensors")
    assert expected.keys() == actual.keys()
    assert max((expected[k] - actual[k]).abs().max().item() for k in expected) <= 1e-6


def test_two_processes_train_like_one_with_the_same_global_batch(corpus, tmp_path, monkeypatch):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < 2:
        # Two processes on one GPU would make Trainer pick NCCL with both ranks on the same device: all three runs
        # use the CPU (gloo) instead, the in-process ones through Trainer's device choice (use_cpu when no CUDA).
        env["CUDA_VISIBLE_DEVICES"] = ""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    common = [
        "train",
        "--train-files",
        str(corpus / "valid.txt"),
        "--config",
        str(corpus / "tiny.json"),
        "--split",
        "pretokenizer",
        "--window",
        "22",
        "--min-count",
        "2",
        "--max-steps",
        "4",
        "--logging-steps",
        "1",
        "--save-steps",
        "4",
        "--dropout",
        "0",
        "--num-softmax-samples",
        "0",
        "--disable-tqdm",
    ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "hf_elmo.commands",
    ]
    result = subprocess.run(
        command
        + common
        + [
            "--per-device-train-batch-size",
            "4",
            "--output-dir",
            str(tmp_path / "ddp"),
            "--data-cache-dir",
            str(tmp_path / "cache-ddp"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.count("; 2 processes training.") == 1, result.stdout[-2000:]  # rank 0 says it, once
    assert (
        cli_main(
            common
            + [
                "--per-device-train-batch-size",
                "8",
                "--output-dir",
                str(tmp_path / "single"),
                "--data-cache-dir",
                str(tmp_path / "cache-single"),
            ]
        )
        == 0
    )
    # Gradient accumulation is the same global batch once more: the loss is normalised by all its targets.
    assert (
        cli_main(
            common
            + [
                "--per-device-train-batch-size",
                "4",
                "--gradient-accumulation-steps",
                "2",
                "--output-dir",
                str(tmp_path / "accumulated"),
                "--data-cache-dir",
                str(tmp_path / "cache-single"),
            ]
        )
        == 0
    )

    def losses(run):
        state = json.loads((tmp_path / run / "checkpoint-4/trainer_state.json").read_text())
        return [entry["loss"] for entry in state["log_history"] if "loss" in entry]

    assert len(losses("single")) == 4
    single = load_file(tmp_path / "single/model.safetensors")
    for run in ("ddp", "accumulated"):
        np.testing.assert_allclose(losses(run), losses("single"), atol=1e-5, rtol=0, err_msg=run)
        weights = load_file(tmp_path / run / "model.safetensors")
        assert max((single[k] - weights[k]).abs().max().item() for k in single) <= 1e-5, run


def test_bad_input_stops_before_training(corpus, tmp_path, converted_dirs, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    no_unk = tmp_path / "vocab.txt"
    no_unk.write_text("<S>\n</S>\nthe\n", encoding="utf-8")
    base = ["train", "--config", str(corpus / "tiny.json"), "--data-cache-dir", str(tmp_path / "cache")]
    bilm_dir = tmp_path / "bilm"  # a biLM whose softmax knows 5 words
    tiny = ElmoConfig.from_json_file(corpus / "tiny.json")
    tiny.vocab_size = 5
    ElmoForBiLM(tiny).save_pretrained(bilm_dir)
    cases = [
        (["--train-files", str(empty)], f"Training file '{empty}' is empty"),
        (["--train-files", str(corpus / "valid.txt"), "--vocab", str(no_unk)], "line 3 must be '<UNK>'"),
        (
            [
                "--train-files",
                str(corpus / "valid.txt"),
                "--config",
                "small",
                "--init-from",
                str(converted_dirs["allennlp"]),
            ],
            "--config small does not match the --init-from weights .*cell_dim: --config has 1024, the weights have 64",
        ),
        (["--train-files", str(corpus / "valid.txt"), "--resume"], "holds no checkpoint"),
        (
            [
                "--train-files",
                str(corpus / "valid.txt"),
                "--init-from",
                str(bilm_dir),
                "--config",
                str(corpus / "tiny.json"),
            ],
            r"has a softmax of 5 words but the vocabulary \(built from the training files with min count 1\) has \d+",
        ),
    ]
    for index, (arguments, message) in enumerate(cases):
        output_dir = tmp_path / f"out{index}"
        assert cli_main(base + arguments + ["--output-dir", str(output_dir)]) == 2
        stderr = capsys.readouterr().err
        error = stderr.strip().splitlines()[-1]  # after the data preparation's progress bars, if any
        assert error.startswith("error: ") and "Traceback" not in stderr, stderr
        assert re.search(message, error), error
        assert not list(output_dir.glob("checkpoint-*"))


def test_tiny_preset_trains_on_the_bundled_corpus_with_the_default_options(tmp_path, capsys):
    # The corpus is raw text with a line longer than the default window: the default split and window must take it.
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()
    longest = max(len(ElmoTokenizer().split_words(line)) for line in lines)
    assert longest + 2 > ElmoDataArguments.__dataclass_fields__["window"].default
    output_dir = tmp_path / "run"
    arguments = [
        "train",
        "--config",
        "tiny",
        "--train-files",
        str(SHAKESPEARE),
        "--output-dir",
        str(output_dir),
        "--max-steps",
        "8",
        "--logging-steps",
        "1",
        "--data-cache-dir",
        str(tmp_path / "cache"),
        "--disable-tqdm",
    ]
    assert cli_main(arguments) == 0
    assert "; 1 process training." in capsys.readouterr().out
    state = json.loads((output_dir / "checkpoint-8/trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.1, losses
    assert ElmoConfig.from_pretrained(output_dir).cell_dim == ElmoConfig.from_preset("tiny").cell_dim == 256
    # `vocab` splits as `train` does by default: the README's vocab-then-train commands agree on the words.
    assert cli_main(["vocab", str(SHAKESPEARE), "--output", str(tmp_path / "vocab.txt")]) == 0
    assert (tmp_path / "vocab.txt").read_bytes() == (output_dir / "vocab.txt").read_bytes()


def test_streaming_run(corpus, tmp_path):
    metrics = train_bilm(
        **options(
            corpus,
            tmp_path / "streamed",
            train_files=[corpus / "small.txt"],
            streaming=True,
            max_steps=3,
            save_steps=3,
            eval_files=[corpus / "small.txt"],
            eval_steps=3,
        )
    )
    assert metrics["eval_perplexity"] > 1 and (tmp_path / "streamed/model.safetensors").is_file()
    with pytest.raises(ValueError, match="give max_steps"):
        train_bilm(**options(corpus, tmp_path / "no-steps", streaming=True))


def test_config_preset_with_converted_weights_keeps_their_forget_bias(corpus, tmp_path, converted_dirs):
    folder = converted_dirs["allennlp"]
    preset = ElmoConfig.from_pretrained(folder)
    assert preset.forget_bias == 1.0  # converted bilm-tf weights add TensorFlow's forget bias at run time
    preset.forget_bias = 0.0  # what a --config file or preset of the same architecture says
    preset.to_json_file(tmp_path / "preset.json")
    model, data, _ = parse_options(
        options(
            corpus,
            tmp_path / "out",
            config=str(tmp_path / "preset.json"),
            init_from=str(folder),
            train_files=[corpus / "valid.txt"],
        )
    )
    _, config = tokenizer_and_config(model, data)
    assert config.forget_bias == 1.0


def test_adapting_converted_weights_gets_a_fresh_softmax(corpus, tmp_path, converted_dirs, capsys):
    folder = converted_dirs["allennlp"]
    train_bilm(
        **options(
            corpus,
            tmp_path / "adapted",
            config=None,
            init_from=str(folder),
            train_files=[corpus / "valid.txt"],
            max_steps=2,
            save_steps=2,
            per_device_train_batch_size=4,
        )
    )
    assert "has no word softmax" in capsys.readouterr().out
    encoder, adapted = ElmoModel.from_pretrained(folder), ElmoModel.from_pretrained(tmp_path / "adapted")
    assert adapted.config.projection_dim == encoder.config.projection_dim
    changed = [k for k, v in encoder.state_dict().items() if not torch.equal(v, adapted.state_dict()[k])]
    assert changed, "two steps of training should move the biLM"
    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "adapted")
    assert len(tokenizer.word_vocabulary) == ElmoConfig.from_pretrained(tmp_path / "adapted").vocab_size
    # Its model card tells both steps, in order: the conversion, then this run (whose arguments file is there).
    card = (tmp_path / "adapted" / "README.md").read_text(encoding="utf-8")
    converted = "* Converted by `hf-elmo convert` from an original bilm-tf / AllenNLP model (`options.json`, "
    trained = (
        f"* biLM trained from the weights of the folder `{folder.name}` by `hf-elmo train` on `valid.txt`; the run's "
        "arguments are in `bilm_training_options.json` in its output folder."
    )
    assert converted in card and trained in card and card.index(converted) < card.index(trained)
    assert (tmp_path / "adapted" / "bilm_training_options.json").is_file()


def crash_at(monkeypatch, method, step, error=KeyboardInterrupt):
    """Makes `ElmoTrainer.<method>` raise `error` when the trainer reaches global step `step` (a signal's handler
    raises KeyboardInterrupt in the same way)."""
    original = getattr(ElmoTrainer, method)

    def crash(self, *args, **kwargs):
        if self.state.global_step == step:
            raise error("simulated")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ElmoTrainer, method, crash)


def short_run(corpus, output_dir, **overrides):
    values = dict(
        train_files=[corpus / "small.txt"],
        max_steps=6,
        save_steps=2,
        per_device_train_batch_size=8,
        num_softmax_samples=64,
        save_total_limit=3,
    )
    return options(corpus, output_dir, **{**values, **overrides})


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    train_bilm(**short_run(corpus, output_dir))
    return load_file(output_dir / "model.safetensors")


def assert_same_weights(expected, output_dir):
    actual = load_file(output_dir / "model.safetensors")
    assert expected.keys() == actual.keys()
    assert max((expected[k] - actual[k]).abs().max().item() for k in expected) <= 1e-6


def test_interrupted_checkpoint_never_appears_and_resume_takes_the_last_complete(
    corpus, tmp_path, monkeypatch, uninterrupted
):
    run = short_run(corpus, tmp_path / "run")
    crash_at(monkeypatch, "_save_rng_state", 4)  # checkpoint-4 has its weights and optimizer, not yet its random state
    with pytest.raises(KeyboardInterrupt):
        train_bilm(**run)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["bilm_training_options.json", "checkpoint-2"]
    assert {p.name for p in (tmp_path / "run/checkpoint-2").iterdir()} >= {
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        "vocab.txt",
    }
    train_bilm(**run, resume=True)
    assert_same_weights(uninterrupted, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]


def test_resume_skips_an_incomplete_checkpoint_and_says_so(corpus, tmp_path, capsys, uninterrupted):
    run = short_run(corpus, tmp_path / "run", max_steps=4)
    train_bilm(**run)
    # A checkpoint reads text as its run did (the default split is not perplexity's default).
    assert model_split(tmp_path / "run/checkpoint-4") == run["split"] == "pretokenizer"
    with pytest.raises(
        ValueError, match=r"^--max-steps 4: the run in \S+ has trained 4 steps already \(its checkpoint-4\)"
    ):
        train_bilm(**run, resume=True)
    (tmp_path / "run/checkpoint-4/optimizer.pt").unlink()  # e.g. a checkpoint written by an older version
    capsys.readouterr()
    train_bilm(**{**run, "max_steps": 6}, resume=True)
    assert "--resume: continuing from checkpoint-2; skipped incomplete checkpoint-4 (no optimizer.pt)." in (
        capsys.readouterr().out
    )
    assert_same_weights(uninterrupted, tmp_path / "run")
    for checkpoint in (tmp_path / "run").glob("checkpoint-*"):
        (checkpoint / "rng_state.pth").unlink()
    skipped = "; ".join(rf"checkpoint-{step} \(no rng_state\.pth\)" for step in (6, 4, 2))
    with pytest.raises(ValueError, match=rf"holds no complete checkpoint .*\(incomplete: {skipped}\)"):
        train_bilm(**{**run, "max_steps": 8}, resume=True)


def test_damaged_checkpoint_is_one_line(corpus, tmp_path, capsys):
    run = short_run(corpus, tmp_path / "run", max_steps=2)
    train_bilm(**run)
    (tmp_path / "run/checkpoint-2/optimizer.pt").write_bytes(b"not a pickle")
    arguments = [
        "train",
        "--train-files",
        str(corpus / "small.txt"),
        "--config",
        str(corpus / "tiny.json"),
        "--split",
        "pretokenizer",
        "--window",
        "22",
        "--min-count",
        "2",
        "--per-device-train-batch-size",
        "8",
        "--logging-steps",
        "10",
        "--data-cache-dir",
        str(corpus / "cache"),
        "--disable-tqdm",
        "--max-steps",
        "4",
        "--save-steps",
        "2",
        "--num-softmax-samples",
        "64",
        "--save-total-limit",
        "3",
        "--output-dir",
        str(tmp_path / "run"),
        "--resume",
    ]
    capsys.readouterr()
    assert cli_main(arguments) == 2
    error = capsys.readouterr().err.strip().split("\n")[-1]
    assert re.fullmatch(
        r"error: --resume: \S+checkpoint-2: cannot read the model weights, optimizer or scheduler "
        r"state \(.*\)\.",
        error,
    ), error


def test_resume_takes_the_options_recorded_in_the_run(corpus, tmp_path, monkeypatch, uninterrupted):
    run = short_run(corpus, tmp_path / "run")
    crash_at(monkeypatch, "training_step", 3)
    with pytest.raises(KeyboardInterrupt):
        train_bilm(**run)
    monkeypatch.undo()
    assert cli_main(["train", "--output-dir", str(tmp_path / "run"), "--resume"]) == 0
    assert_same_weights(uninterrupted, tmp_path / "run")


def test_a_non_finite_loss_stops_training_at_its_step_and_keeps_the_checkpoints_before(corpus, tmp_path, monkeypatch):
    from hf_elmo.pretrained_elmo import check_finite_weights

    original = ElmoTrainer.compute_loss

    def nan_at_step_5(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = original(self, model, inputs, True, num_items_in_batch)
        if model.training and self.state.global_step + 1 == 5:
            loss = loss * float("nan")
        return (loss, outputs) if return_outputs else loss

    monkeypatch.setattr(ElmoTrainer, "compute_loss", nan_at_step_5)
    # The loss is read when it is logged and before a save: here first at step 6, which must name step 5.
    run = short_run(corpus, tmp_path / "run", max_steps=8, save_steps=2, logging_steps=100)
    with pytest.raises(
        ValueError,
        match=r"^training stopped: the loss of step 5 is nan; nothing from that step on "
        r"was saved \(the last checkpoint is checkpoint-4\)$",
    ):
        train_bilm(**run)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "bilm_training_options.json",
        "checkpoint-2",
        "checkpoint-4",
    ]
    check_finite_weights(ElmoForBiLM.from_pretrained(tmp_path / "run/checkpoint-4"), "checkpoint-4")


def test_non_finite_weights_are_never_saved(corpus, tmp_path, monkeypatch):
    from hf_elmo.training.adagrad import Adagrad

    original = Adagrad.step

    def overflow_at_the_second_step(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        self.steps_taken = getattr(self, "steps_taken", 0) + 1
        if self.steps_taken == 2:  # after the update of step 2, before its checkpoint; no loss has read it yet
            for group in self.param_groups:
                for param in group["params"]:
                    param.data.view(-1)[0] = float("inf")
        return loss

    monkeypatch.setattr(Adagrad, "step", overflow_at_the_second_step)
    tiny = ElmoConfig.from_json_file(corpus / "tiny.json")
    tiny.vocab_size = 5
    first = next(name for name, _ in ElmoForBiLM(tiny).named_parameters())  # the first one checked
    with pytest.raises(
        ValueError,
        match=rf"^training stopped at step 2: the weights hold NaN or infinite values in "
        rf"'{re.escape(first)}'; nothing from that step on was saved \(no "
        rf"checkpoint was written before\)$",
    ):
        train_bilm(**short_run(corpus, tmp_path / "run", max_steps=4, save_steps=2))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_run_stopped_before_its_first_checkpoint_leaves_nothing(corpus, tmp_path, monkeypatch, error):
    run = short_run(corpus, tmp_path / "run")
    crash_at(monkeypatch, "training_step", 1, error)
    with pytest.raises(error):
        train_bilm(**run)
    monkeypatch.undo()
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="holds no checkpoint of an earlier run"):
        train_bilm(**run, resume=True)
    # What a kill -9 before the first checkpoint leaves does not stop the same command either.
    (tmp_path / "run").mkdir()
    (tmp_path / "run/bilm_training_options.json").write_text("{}")
    (tmp_path / "run/.staging").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoint of an earlier run"):
        train_bilm(**run, resume=True)
    train_bilm(**{**run, "max_steps": 2})
    assert (tmp_path / "run/model.safetensors").is_file() and not (tmp_path / "run/.staging").exists()


def values_checked_spy(monkeypatch) -> list:
    """Makes `ElmoForBiLM.forward` note, for each call, whether the model skips its checks of values."""
    seen, forward = [], ElmoForBiLM.forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("values_checked_on_host", False))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(ElmoForBiLM, "forward", spy)
    return seen


def test_stored_windows_made_on_the_device_train_as_full_batches_and_a_bad_table_stops_first(
    corpus, tmp_path, monkeypatch
):
    """`ElmoTrainer` reads the stored windows (`stored_only`) and makes the batches on the training device: the run
    is that of the full batches the collator makes on the host (weights, evaluation), and the model skips its checks
    of values, each a wait for a GPU, the word table's values being checked once before the first step."""
    import dataclasses

    from hf_elmo.training.collator import DataCollatorForBiLM
    from hf_elmo.training.word_table import WordTable

    seen = values_checked_spy(monkeypatch)
    with_eval = dict(eval_files=[corpus / "valid.txt"], eval_steps=3)
    stored = train_bilm(**short_run(corpus, tmp_path / "stored", **with_eval))
    assert len(seen) > 6 and all(seen)  # training steps and evaluation batches

    collate = DataCollatorForBiLM.__call__
    monkeypatch.setattr(
        DataCollatorForBiLM,
        "__call__",
        lambda self, examples: collate(dataclasses.replace(self, stored_only=False), examples),
    )
    seen.clear()
    full = train_bilm(**short_run(corpus, tmp_path / "full", **with_eval))
    assert len(seen) > 6 and not any(seen)
    assert_same_weights(load_file(tmp_path / "stored/model.safetensors"), tmp_path / "full")
    assert stored["eval_perplexity"] == full["eval_perplexity"]

    monkeypatch.setattr(DataCollatorForBiLM, "__call__", collate)
    build = WordTable.__init__

    def out_of_vocabulary(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.targets[len(self.targets) // 2] = 10**6

    monkeypatch.setattr(WordTable, "__init__", out_of_vocabulary)
    seen.clear()
    with pytest.raises(ValueError, match=r"The word table's targets are word ids up to 1,000,000, the model's softmax"):
        train_bilm(**short_run(corpus, tmp_path / "bad"))
    assert seen == []


def test_batches_checked_on_the_host_train_the_same_and_bad_values_still_stop(corpus, tmp_path, monkeypatch):
    """On a GPU each batch of full rows (`--streaming`, or a collator of one's own) is checked on the host (by the
    data loader) and the model skips its checks of values, each a wait for the GPU. Forced on here: the run must be
    the same, the model must see the skip, and a bad batch must still stop it, before the model runs."""
    from hf_elmo.training import trainer as trainer_bilm
    from hf_elmo.training.collator import DataCollatorForBiLM

    streaming = dict(streaming=True, eval_files=[corpus / "valid.txt"], eval_steps=3)
    plain = train_bilm(**short_run(corpus, tmp_path / "plain", **streaming))
    monkeypatch.setattr(trainer_bilm, "_on_accelerator", lambda args: True)
    seen = values_checked_spy(monkeypatch)
    checked = train_bilm(**short_run(corpus, tmp_path / "run", **streaming))
    assert len(seen) > 6 and all(seen)  # training steps and evaluation batches
    assert_same_weights(load_file(tmp_path / "plain/model.safetensors"), tmp_path / "run")
    assert checked["eval_perplexity"] == pytest.approx(plain["eval_perplexity"], rel=1e-6)

    collate = DataCollatorForBiLM.__call__

    def out_of_vocabulary(self, examples):
        batch = collate(self, examples)
        batch["labels"][0, 0, 0] = 10**6
        return batch

    monkeypatch.setattr(DataCollatorForBiLM, "__call__", out_of_vocabulary)
    seen.clear()
    expected = r"labels must be word ids in \[0, \d+\] or -100 \(no target\), found 1000000"
    with pytest.raises(ValueError, match=expected) as error:
        train_bilm(**short_run(corpus, tmp_path / "bad", streaming=True))
    assert seen == [] and any(
        entry.name == "__call__" and Path(entry.path).match("training/trainer.py") for entry in error.traceback
    )


def test_values_checked_on_host_skips_only_the_checks_of_values():
    model = ElmoModel(ElmoConfig(filters=[[1, 4]], n_highway=0, cell_dim=8, projection_dim=4, num_layers=1))
    ids = torch.full((1, 3, 50), 300)  # beyond the 262 character ids
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 261\]"):
        model.check_inputs(ids)
    assert model.check_inputs(ids, values_checked_on_host=True).tolist() == [[True, True, True]]
    with pytest.raises(ValueError, match=r"input_ids must have shape \(batch, words, 50\)"):
        model.check_inputs(ids[..., :49], values_checked_on_host=True)
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 261\]"):
        model.check_inputs(ids)


def test_clipping_inside_adagrads_step_trains_the_same(corpus, tmp_path, monkeypatch):
    """`hf-elmo train` clips in the optimizer, inside Adagrad's step (`Adagrad.clip_grad_norm_`, one pass over the
    gradients less): the same weights to the bit as clipping the gradients right before the step, as bilm-tf does
    (`g * max_norm / max(norm, max_norm)`), which is in effect at every step here; `Trainer` logs the norms, and
    the norm it asks for is the one the clip takes: no pass of PyTorch's `clip_grad_norm_` over the gradients."""
    from hf_elmo.training import trainer as trainer_bilm
    from hf_elmo.training.adagrad import Adagrad

    norms = []

    def clip_before_the_step(optimizer, max_norm):
        def clip(optimizer, args, kwargs):
            gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(gradients)
            norms.append(norm.item())
            torch._foreach_mul_(gradients, torch.clamp(max_norm / norm, max=1.0))

        optimizer.register_step_pre_hook(clip)

    run = dict(all_clip_norm_val=0.05, logging_steps=1, save_steps=6)
    deferred_calls = []
    deferred = Adagrad.clip_grad_norm_
    monkeypatch.setattr(
        Adagrad, "clip_grad_norm_", lambda self, *a, **k: (deferred_calls.append(a), deferred(self, *a, **k))[1]
    )
    separate_passes = []
    separate_pass = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda *a, **k: (separate_passes.append(a), separate_pass(*a, **k))[1]
    )
    train_bilm(**short_run(corpus, tmp_path / "deferred", **run))
    assert deferred_calls == [(0.05 / 22,)] * 6 and separate_passes == []
    monkeypatch.setattr(trainer_bilm, "clip_in_optimizer", clip_before_the_step)
    monkeypatch.setattr(
        trainer_bilm.ElmoTrainer, "gradient_norm", lambda self, *a, **k: self.accelerator_gradient_norm(*a, **k)
    )
    train_bilm(**short_run(corpus, tmp_path / "before", **run))
    assert len(deferred_calls) == 6 and len(norms) == 6 and all(norm > 0.05 / 22 for norm in norms)
    assert len(separate_passes) == 6  # Trainer's own, for its log

    def logged_norms(name):
        history = json.loads((tmp_path / name / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
        return [entry["grad_norm"] for entry in history if "grad_norm" in entry]

    assert logged_norms("deferred") == logged_norms("before") == pytest.approx(norms, rel=1e-6)
    expected, actual = (load_file(tmp_path / name / "model.safetensors") for name in ("before", "deferred"))
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)


def test_trainer_options_reach_trainer(corpus, tmp_path):
    """Any `TrainingArguments` option works on the command line, here the learning-rate schedule: linear decay from
    --learning-rate to 0 over the run, each step logging the rate it used."""
    arguments = [
        "train",
        "--train-files",
        str(corpus / "small.txt"),
        "--config",
        str(corpus / "tiny.json"),
        "--output-dir",
        str(tmp_path / "run"),
        "--data-cache-dir",
        str(corpus / "cache"),
        "--disable-tqdm",
        "--max-steps",
        "4",
        "--save-steps",
        "4",
        "--logging-steps",
        "1",
        "--learning-rate",
        "0.2",
        "--lr-scheduler-type",
        "linear",
        "--per-device-train-batch-size",
        "8",
        "--num-softmax-samples",
        "0",
    ]
    assert cli_main(arguments) == 0
    history = json.loads((tmp_path / "run/checkpoint-4/trainer_state.json").read_text())["log_history"]
    rates = [entry["learning_rate"] for entry in history if "learning_rate" in entry]
    assert rates == pytest.approx([0.2 * (4 - step) / 4 for step in range(4)], rel=1e-12)


def test_loader_defaults_follow_the_device(tmp_path):
    on_gpu = torch.cuda.is_available()
    arguments = ElmoTrainingArguments(output_dir=str(tmp_path / "out"))
    assert arguments.dataloader_num_workers == (2 if on_gpu else 0)
    assert ElmoTrainingArguments(output_dir=str(tmp_path / "out"), dataloader_num_workers=3).dataloader_num_workers == 3
    # Pinned memory and copies without waiting only where there is a GPU to copy to (else transformers warns).
    assert (arguments.dataloader_pin_memory, arguments.accelerator_config.non_blocking) == (on_gpu, on_gpu)
    with pytest.raises(ValueError, match="dataloader_num_workers must be >= 0"):
        ElmoTrainingArguments(output_dir="out", dataloader_num_workers=-1)


def training_flops_spy(monkeypatch) -> list[int]:
    """Makes `ElmoForBiLM.forward` note, for each training-mode call, the FLOPs its model counts for that batch."""
    counted = []
    forward = ElmoForBiLM.forward

    def spy(self, input_ids=None, *args, split_directions=False, **kwargs):
        if self.training:
            counted.append(self.floating_point_ops({"input_ids": input_ids}, split_directions=split_directions))
        return forward(self, input_ids, *args, split_directions=split_directions, **kwargs)

    monkeypatch.setattr(ElmoForBiLM, "forward", spy)
    return counted


def test_total_flos_is_the_models_own_count(corpus, tmp_path, monkeypatch):
    """`Trainer` would count 6 x parameters x `input_ids.numel()`, i.e. every character slot as a position."""
    counted = training_flops_spy(monkeypatch)
    train_bilm(**short_run(corpus, tmp_path / "run"))
    state = json.loads((tmp_path / "run/checkpoint-6/trainer_state.json").read_text())
    assert len(counted) == 6 and state["total_flos"] == sum(counted)


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6], ids=["every step clips", "no step clips"])
def test_steps_are_adagrad_on_window_times_loss_with_the_original_settings(
    corpus, tmp_path, monkeypatch, max_grad_norm
):
    """`hf-elmo train` keeps the mean loss and folds the window into the optimizer (accumulator / window^2, clip /
    window); in float64 its steps equal bilm-tf's on the gradient of window x loss, computed by hand on the same
    batches: `torch.optim.Adagrad` without epsilon (TensorFlow's adds none) and TensorFlow's `clip_by_global_norm`,
    `g * max_norm / max(norm, max_norm)`."""
    import copy

    from hf_elmo.commands import train as train_module

    built, batches = {}, []
    build = train_module.build_bilm
    monkeypatch.setattr(train_module, "build_bilm", lambda *a: built.setdefault("model", build(*a).double()))
    compute_loss = ElmoTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            batches.append({k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
            built.setdefault("initial", copy.deepcopy(model.state_dict()))
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(ElmoTrainer, "compute_loss", recording_compute_loss)
    config = ElmoConfig.from_json_file(corpus / "tiny.json")
    config.dropout = 0.0
    config.to_json_file(tmp_path / "config.json")
    window, learning_rate, accumulator = 22, 0.2, 1.0
    run = options(
        corpus,
        tmp_path / "run",
        train_files=[corpus / "small.txt"],
        config=str(tmp_path / "config.json"),
        window=window,
        per_device_train_batch_size=8,
        max_steps=3,
        logging_steps=1,
        save_steps=3,
        dropout=0.0,
        num_softmax_samples=0,
        learning_rate=learning_rate,
        adagrad_initial_accumulator=accumulator,
        all_clip_norm_val=max_grad_norm,
    )
    train_bilm(**run)
    assert len(batches) == 3
    trained = load_file(tmp_path / "run" / "model.safetensors")

    model = ElmoForBiLM(built["model"].config).double().train()
    model.load_state_dict(built["initial"])
    optimizer = torch.optim.Adagrad(model.parameters(), lr=learning_rate, initial_accumulator_value=accumulator, eps=0)
    norms = []
    for batch in batches:
        (window * model(**batch).loss).backward()
        norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
        for param in model.parameters():
            param.grad *= max_grad_norm / torch.maximum(norm, torch.tensor(max_grad_norm))
        optimizer.step()
        optimizer.zero_grad()
        norms.append(float(norm))
    assert all((norm > max_grad_norm) == (max_grad_norm < 1) for norm in norms), norms
    expected = model.state_dict()
    for name, value in trained.items():
        # float64 rounding, in sums over every position of gradients that partly cancel, is some 1e-13 of a step;
        # the mistakes this guards against (an unscaled clip or accumulator, an epsilon) are 1e-6 or more.
        moved = (expected[name] - built["initial"][name]).abs().max()
        assert value.dtype == torch.float64 and moved > 0, name
        assert (value - expected[name]).abs().max() <= 1e-8 * moved, name


def test_the_log_gives_the_memory_the_data_and_the_time_per_epoch(corpus, tmp_path, capsys):
    from hf_elmo.training.windows import load_bilm_dataset, window_arrays

    run = options(
        corpus,
        tmp_path / "run",
        train_files=[corpus / "small.txt"],
        num_train_epochs=1,
        logging_steps=2,
        save_steps=1000,
    )
    metrics = train_bilm(**run)
    log = capsys.readouterr().out
    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "run")
    config = ElmoConfig.from_pretrained(tmp_path / "run")
    rows = load_bilm_dataset([corpus / "small.txt"], tokenizer, 22, "pretokenizer")
    windows = [window_arrays(row)[0] for row in rows]
    steps = math.ceil(len(windows) / 16)
    assert metrics["steps"] == steps
    positions = sum(map(len, windows))
    assert f"Training data: {len(windows):,} windows, {positions:,} positions, {steps:,} steps per epoch." in log
    assert re.search(
        rf"^Steps 2-3: [\d.e-]+ s a step; an epoch of {steps:,} steps takes about .*, the remaining "
        rf"{steps - 3:,} steps of the run about ",
        log,
        re.M,
    ), log
    weights = sum(p.numel() for p in ElmoForBiLM(config).parameters())
    softmax = config.vocab_size * (config.projection_dim + 1)
    assert (
        f"Memory: the weights, their gradients and the adagrad state need {weights * 12 / 2**30:.3g} GiB before "
        f"activations ({softmax * 12 / 2**30:.3g} GiB of it for the softmax of {config.vocab_size:,} words x "
        f"{config.projection_dim + 1})"
    ) in log


def test_elmo_trainer_in_a_script_with_plain_training_arguments_and_a_compute_loss_of_its_own(corpus, tmp_path):
    """docs/training.md's Python path: `ElmoTrainer` with `TrainingArguments` as they come (Trainer's default drops
    dataset columns the model does not take, such as the stored windows' `positions`) and a subclass whose
    `compute_loss` calls the model on its inputs, as Trainer's documentation shows: it gets the model's inputs only,
    and trains as `ElmoTrainer` does (same weights)."""
    from transformers import TrainingArguments

    from hf_elmo.training.collator import DataCollatorForBiLM
    from hf_elmo.training.corpus import build_word_vocabulary
    from hf_elmo.training.word_table import WordTable, load_compact_bilm_dataset

    files = [corpus / "small.txt"]
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary(files, "pretokenizer", tokenizer, min_count=2))
    config = ElmoConfig.from_json_file(corpus / "tiny.json")
    config.vocab_size, config.num_softmax_samples, config.dropout = len(tokenizer.word_vocabulary), 0, 0.0
    table = WordTable.of_files(files, tokenizer, "pretokenizer")
    windows = load_compact_bilm_dataset(files, table, tokenizer, 22, "pretokenizer", corpus / "cache")
    torch.manual_seed(0)
    initial = ElmoForBiLM(config).state_dict()
    seen_keys = []

    class OwnLoss(ElmoTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen_keys.append(sorted(inputs))
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    weights = {}
    for trainer_class in (ElmoTrainer, OwnLoss):
        model = ElmoForBiLM(config)
        model.load_state_dict(initial)
        args = TrainingArguments(
            tmp_path / trainer_class.__name__, max_steps=3, per_device_train_batch_size=8, report_to=[],
            save_strategy="no", disable_tqdm=True, use_cpu=True,
        )  # fmt: skip
        trainer = trainer_class(
            model=model,
            args=args,
            data_collator=DataCollatorForBiLM(words=table),
            train_dataset=windows,
            word_tokenizer=tokenizer,
            clip_norm=0.0,
        )
        trainer.train()
        weights[trainer_class] = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    # The batch's values were checked on the host: the model is told so through its input of that name.
    assert seen_keys == [["attention_mask", "input_ids", "labels", "values_checked_on_host"]] * 3
    assert all(torch.equal(weights[ElmoTrainer][name], weights[OwnLoss][name]) for name in initial)
    assert not torch.equal(weights[ElmoTrainer]["softmax.weight"], initial["softmax.weight"])


def test_stored_windows_train_evaluate_and_predict_as_the_full_rows_of_load_bilm_dataset(corpus, tmp_path):
    """The independent truth of the batches `ElmoTrainer` makes on the device: the full rows of `load_bilm_dataset`
    collated on the host. Text with literal <S> and </S> words and a sentence cut into windows (neighbours before and
    after), two batches accumulated a step, windows padded to a multiple of 4, evaluation in batches of another size:
    the same weights, losses, perplexities, `predict`'s label_ids and positions counted as seen."""
    from transformers import TrainingArguments

    from hf_elmo.training.collator import DataCollatorForBiLM
    from hf_elmo.training.corpus import build_word_vocabulary
    from hf_elmo.training.windows import load_bilm_dataset
    from hf_elmo.training.word_table import WordTable, load_compact_bilm_dataset

    text = (corpus / "small.txt").read_text(encoding="utf-8")
    (tmp_path / "text.txt").write_text(f"{text}<S> a literal </S> .\n{'so ' * 30}\n", encoding="utf-8")
    files = [tmp_path / "text.txt"]
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary(files, "whitespace", tokenizer, min_count=2))
    config = ElmoConfig.from_json_file(corpus / "tiny.json")
    config.vocab_size, config.num_softmax_samples, config.dropout = len(tokenizer.word_vocabulary), 0, 0.0
    table = WordTable.of_files(files, tokenizer)
    runs = {
        "full": (load_bilm_dataset(files, tokenizer, 7, cache_dir=tmp_path / "full"), DataCollatorForBiLM),
        "stored": (
            load_compact_bilm_dataset(files, table, tokenizer, 7, cache_dir=tmp_path / "stored", processes=1),
            lambda **options: DataCollatorForBiLM(words=table, **options),
        ),
    }
    torch.manual_seed(0)
    initial = ElmoForBiLM(config).state_dict()
    results = {}
    for name, (windows, collator) in runs.items():
        model = ElmoForBiLM(config)
        model.load_state_dict(initial)
        args = TrainingArguments(
            tmp_path / name, max_steps=3, per_device_train_batch_size=8, gradient_accumulation_steps=2,
            per_device_eval_batch_size=5, learning_rate=0.1, include_num_input_tokens_seen="non_padding",
            remove_unused_columns=False, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
        )  # fmt: skip
        trainer = ElmoTrainer(
            model=model,
            args=args,
            data_collator=collator(pad_to_multiple_of=4),
            train_dataset=windows,
            word_tokenizer=tokenizer,
            clip_norm=1.0,
        )
        trainer.train()
        held_out = windows.select(range(len(windows) - 23, len(windows)))  # the literal words and the cut sentence
        predicted = trainer.predict(held_out)
        results[name] = model.state_dict(), trainer.evaluate(held_out), predicted, trainer.state.num_input_tokens_seen
    (weights, evaluated, predicted, seen), (stored_weights, stored_evaluated, stored_predicted, stored_seen) = (
        results["full"],
        results["stored"],
    )
    assert all(torch.equal(weights[name], stored_weights[name]) for name in initial)
    assert not torch.equal(weights["softmax.weight"], initial["softmax.weight"])
    for metric in ("eval_loss", "eval_forward_perplexity", "eval_backward_perplexity", "eval_perplexity"):
        assert stored_evaluated[metric] == evaluated[metric]
    assert predicted.label_ids.shape[0] == 23 and np.array_equal(stored_predicted.label_ids, predicted.label_ids)
    assert stored_predicted.metrics["test_perplexity"] == predicted.metrics["test_perplexity"]
    assert seen > 0 and stored_seen == seen


def test_tokens_seen_on_the_command_line_are_the_positions_trained_on(corpus, tmp_path):
    """`--include-num-input-tokens-seen non_padding` (which `TrainingArguments`' own parser refused, reading the
    option as a bool) counts each window's positions: over one epoch, each sentence's words and its two boundaries."""
    sentences = iter_sentences([corpus / "small.txt"], "pretokenizer", ElmoTokenizer())
    positions = sum(len(words) + 2 for words in sentences)
    run = tmp_path / "run"
    command = (
        f"train --config {corpus / 'tiny.json'} --train-files {corpus / 'small.txt'} --split pretokenizer "
        f"--num-train-epochs 1 --per-device-train-batch-size 8 --num-softmax-samples 64 --disable-tqdm "
        f"--data-cache-dir {corpus / 'cache'} --output-dir {run} --include-num-input-tokens-seen non_padding"
    )
    assert cli_main(command.split()) == 0
    state = json.loads(next(run.glob("checkpoint-*/trainer_state.json")).read_text())
    assert state["num_input_tokens_seen"] == positions
