"""`hf-elmo train --stream`: continuous streams per batch row with the LSTM state carried from batch to batch."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_training import SHAKESPEARE, one_thread  # noqa: F401  (an autouse fixture)

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.cli import main as cli_main
from hf_elmo.commands.train import StreamTrainer, train_bilm
from hf_elmo.data_bilm import build_word_vocabulary, iter_sentences
from hf_elmo.streams_bilm import DataCollatorForBiLMStreams, StreamWindowDataset


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-corpus")
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()
    (folder / "small.txt").write_text("\n".join(lines[7000:7200]) + "\n", encoding="utf-8")
    ElmoConfig(
        char_embedding_dim=8, filters=[[1, 16], [2, 16]], n_highway=1, cell_dim=32, projection_dim=16, num_layers=2
    ).to_json_file(folder / "tiny.json")
    return folder


def options(corpus, output_dir, **overrides):
    values = dict(
        output_dir=output_dir,
        train_files=[corpus / "small.txt"],
        config=str(corpus / "tiny.json"),
        stream=True,
        split="pretokenizer",
        window=10,
        min_count=2,
        per_device_train_batch_size=4,
        logging_steps=1,
        disable_tqdm=True,
        max_steps=6,
        save_steps=3,
    )
    values.update(overrides)
    return values


def test_streams_read_every_sentence_in_order_per_row():
    sentences = [["a", "b"], ["c"], ["d", "e", "f"], ["g"], ["h", "i"]]
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(["<S>", "</S>", "<UNK>", *"abcdefghi"])
    dataset = StreamWindowDataset(sentences, tokenizer, rows=2, window=3, seed=0, epochs=2)
    # 5 sentences offer 3 + 2 + 4 + 2 + 3 = 14 positions per direction: 7 per row, 2 steps of 3 per epoch.
    assert dataset.steps_per_epoch == 2 and len(dataset) == 2 * 2 * 2
    words = dataset.encoded[0]

    def rows_of(words_list):
        return dataset.char_ids[[words.index(w) for w in words_list]]

    for epoch in range(2):
        order = np.random.default_rng([0, epoch]).permutation(5)
        forward = [t for k in order for t in ["<S>", *sentences[k]]]
        forward_targets = [t for k in order for t in [*sentences[k], "</S>"]]
        backward = [t for k in order for t in ["</S>", *sentences[k][::-1]]]
        backward_targets = [t for k in order for t in [*sentences[k][::-1], "<S>"]]
        for step in range(2):
            for row in range(2):
                item = dataset[(epoch * 2 + step) * 2 + row]
                part = slice(7 * row + 3 * step, 7 * row + 3 * step + 3)  # each row its own half of the stream
                assert item["forward_ids"].tolist() == rows_of(forward[part]).tolist()
                assert item["forward_labels"].tolist() == tokenizer.word_targets(forward_targets[part]).tolist()
                # The backward LSTM walks right to left: its stream comes reversed in time.
                assert item["backward_ids"].tolist() == rows_of(backward[part])[::-1].tolist()
                expected = tokenizer.word_targets(backward_targets[part])[::-1]
                assert item["backward_labels"].tolist() == expected.tolist()
    batch = DataCollatorForBiLMStreams()([dataset[0], dataset[1]])
    assert batch["input_ids"].shape == (4, 3, 50) and batch["attention_mask"].all()
    assert (batch["labels"][:2, :, 1] == -100).all() and (batch["labels"][2:, :, 0] == -100).all()


def test_training_carries_the_state_from_batch_to_batch(corpus, tmp_path):
    """With next to nothing learnt (learning rate 1e-9) each logged loss is the model's loss on that batch, from the
    state the previous batch ended in."""
    # A biLM with large random weights: its state says a lot about what it read (a fresh one is nearly constant).
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([corpus / "small.txt"], "pretokenizer", tokenizer, 2))
    config = ElmoConfig.from_json_file(corpus / "tiny.json")
    config.vocab_size = len(tokenizer.word_vocabulary)
    start = ElmoForBiLM(config)
    with torch.no_grad():
        for parameter in start.parameters():
            parameter.normal_(std=0.5)
    start.save_pretrained(tmp_path / "start")
    tokenizer.save_pretrained(tmp_path / "start")
    metrics = train_bilm(
        **options(
            corpus,
            tmp_path / "run",
            learning_rate=1e-9,
            dropout=0.0,
            num_softmax_samples=0,
            max_steps=3,
            save_steps=3,
            seed=3,
            init_from=str(tmp_path / "start"),
            config=None,
        )
    )
    assert metrics["train_loss"] > 0
    logged = [
        e["loss"]
        for e in json.loads((tmp_path / "run/checkpoint-3/trainer_state.json").read_text())["log_history"]
        if "loss" in e
    ]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where Trainer ran: a GPU rounds otherwise than a CPU
    model = ElmoForBiLM.from_pretrained(tmp_path / "run/checkpoint-3").to(device).eval()
    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "run")
    sentences = list(iter_sentences([corpus / "small.txt"], "pretokenizer", tokenizer))
    dataset = StreamWindowDataset(sentences, tokenizer, rows=4, window=10, seed=3, steps=3)
    collate, state, carried = DataCollatorForBiLMStreams(), None, []
    with torch.no_grad():
        for step in range(3):
            batch = {k: v.to(device) for k, v in collate([dataset[4 * step + row] for row in range(4)]).items()}
            out = model(**batch, state=state, use_cache=True, split_directions=True)
            state = out.state
            carried.append(out.loss.item())
        from_zeros = model(**batch, use_cache=True, split_directions=True).state
    np.testing.assert_allclose(logged, carried, rtol=2e-4)
    saved = load_file(tmp_path / "run/checkpoint-3/stream_state-0.safetensors")
    torch.testing.assert_close(saved["hidden"], state[0].cpu())
    torch.testing.assert_close(saved["memory"], state[1].cpu())
    assert (saved["memory"] - from_zeros[1].cpu()).abs().max() > 0.1  # a batch started from zeros ends elsewhere
    assert abs(carried[2] - model(**batch, split_directions=True).loss.item()) > 1e-2
    # The saved model starts from a warm state estimated from the training text.
    assert ElmoForBiLM.from_pretrained(tmp_path / "run").config.warm_state


def test_resumed_stream_run_ends_with_the_same_weights(corpus, tmp_path, monkeypatch):
    run = options(corpus, tmp_path / "interrupted", dropout=0.1, num_softmax_samples=32, max_steps=8, save_steps=3)
    train_bilm(**{**run, "output_dir": tmp_path / "uninterrupted"})
    original_step = StreamTrainer.training_step

    def crash_at_step_4(self, *args, **kwargs):
        if self.state.global_step == 4:
            raise KeyboardInterrupt("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(StreamTrainer, "training_step", crash_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train_bilm(**run)
    monkeypatch.undo()
    checkpoint = tmp_path / "interrupted/checkpoint-3"
    assert (checkpoint / "stream_state-0.safetensors").is_file()
    # Resuming needs the stream state of every process of the run.
    shutil.copy(checkpoint / "stream_state-0.safetensors", checkpoint / "stream_state-1.safetensors")
    with pytest.raises(ValueError, match="holds the stream states of 2 processes, this run has 1"):
        train_bilm(**run, resume=True)
    (checkpoint / "stream_state-1.safetensors").unlink()
    train_bilm(**run, resume=True)
    expected = load_file(tmp_path / "uninterrupted/model.safetensors")
    actual = load_file(tmp_path / "interrupted/model.safetensors")
    assert expected.keys() == actual.keys()
    assert max((expected[k] - actual[k]).abs().max().item() for k in expected) <= 1e-6


def test_two_processes_stream_like_one_with_all_rows(corpus, tmp_path, monkeypatch):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < 2:
        # As in test_training: two processes on one GPU would share it under NCCL; all runs use the CPU (gloo).
        env["CUDA_VISIBLE_DEVICES"] = ""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    common = [
        "train",
        "--stream",
        "--train-files",
        str(corpus / "small.txt"),
        "--config",
        str(corpus / "tiny.json"),
        "--split",
        "pretokenizer",
        "--window",
        "10",
        "--min-count",
        "2",
        "--max-steps",
        "3",
        "--logging-steps",
        "1",
        "--save-steps",
        "3",
        "--dropout",
        "0",
        "--num-softmax-samples",
        "0",
        "--disable-tqdm",
    ]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "hf_elmo.cli"]
    result = subprocess.run(
        command + common + ["--per-device-train-batch-size", "2", "--output-dir", str(tmp_path / "ddp")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert cli_main(common + ["--per-device-train-batch-size", "4", "--output-dir", str(tmp_path / "single")]) == 0

    def losses(run):
        state = json.loads((tmp_path / run / "checkpoint-3/trainer_state.json").read_text())
        return [entry["loss"] for entry in state["log_history"] if "loss" in entry]

    assert len(losses("single")) == 3
    np.testing.assert_allclose(losses("ddp"), losses("single"), atol=1e-5, rtol=0)
    # Process p carries rows 2p and 2p + 1 of the four.
    single = load_file(tmp_path / "single/checkpoint-3/stream_state-0.safetensors")
    for rank in range(2):
        part = load_file(tmp_path / f"ddp/checkpoint-3/stream_state-{rank}.safetensors")
        rows = [2 * rank, 2 * rank + 1, 4 + 2 * rank, 5 + 2 * rank]  # forward rows, then backward rows
        torch.testing.assert_close(part["hidden"], single["hidden"][:, rows], atol=1e-5, rtol=0)
    single_weights = load_file(tmp_path / "single/model.safetensors")
    ddp_weights = load_file(tmp_path / "ddp/model.safetensors")
    assert max((single_weights[k] - ddp_weights[k]).abs().max().item() for k in single_weights) <= 1e-5


def test_stream_errors(corpus, tmp_path, capsys):
    base = [
        "train",
        "--stream",
        "--train-files",
        str(corpus / "small.txt"),
        "--config",
        str(corpus / "tiny.json"),
        "--output-dir",
        str(tmp_path / "out"),
        "--disable-tqdm",
    ]
    runs = {
        ("--streaming", "--max-steps", "2"): "--stream (continuous streams per batch row) reads the training text",
        ("--per-device-train-batch-size", "4096", "--window", "20"): "too few for 4096 streams of windows of 20",
    }
    for arguments, message in runs.items():
        assert cli_main([*base, *arguments]) == 2
        assert message in capsys.readouterr().err


def test_total_flos_count_each_direction_on_its_own_rows(corpus, tmp_path, monkeypatch):
    from test_training import training_flops_spy

    counted = training_flops_spy(monkeypatch)
    train_bilm(**options(corpus, tmp_path / "run"))
    state = json.loads((tmp_path / "run/checkpoint-6/trainer_state.json").read_text())
    assert len(counted) == 6 and state["total_flos"] == sum(counted)
