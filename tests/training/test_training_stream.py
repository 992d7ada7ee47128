"""`hf-elmo train --stream`: continuous streams per batch row with the LSTM state carried from batch to batch."""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_training import SHAKESPEARE, one_thread  # noqa: F401  (an autouse fixture)

from hf_elmo import ElmoConfig, ElmoForBiLM, ElmoTokenizer
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.commands.train import StreamTrainer, train_bilm
from hf_elmo.io.files import ElmoInputError
from hf_elmo.training.corpus import build_word_vocabulary, iter_sentences
from hf_elmo.training.perplexity import compute_perplexity, load_bilm
from hf_elmo.training.streams import DataCollatorForBiLMStreams, StreamWindowDataset, build_streams, stream_input_ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-corpus")
    lines = SHAKESPEARE.read_text(encoding="utf-8").splitlines()
    (folder / "small.txt").write_text("\n".join(lines[7000:7200]) + "\n", encoding="utf-8")
    (folder / "shards").mkdir()
    for name, part in (("a", slice(7000, 7060)), ("b", slice(7060, 7140)), ("c", slice(7140, 7200))):
        (folder / "shards" / f"{name}.txt").write_text("\n".join(lines[part]) + "\n", encoding="utf-8")
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


def expected_batch(streams, char_ids, step, window):
    """The batch of `step` of `build_streams`'s in-memory layout, as `DataCollatorForBiLMStreams` makes them."""
    rows, part = streams.batch_size, slice(step * window, (step + 1) * window)
    labels = torch.full((2 * rows, window, 2), -100, dtype=torch.int64)
    labels[:rows, :, 0] = torch.from_numpy(streams.forward_targets[:, part])
    labels[rows:, :, 1] = torch.from_numpy(streams.backward_targets[:, part][:, ::-1].copy())
    return stream_input_ids(streams, char_ids, part.start, part.stop), labels


def assert_batches_are_the_layout(dataset, sentences, tokenizer, first_step=0):
    """Every complete batch `build_streams` makes of `sentences` is the dataset's, from `first_step` on."""
    streams = build_streams(sentences, tokenizer, dataset.rows, dataset.window)
    char_ids = tokenizer.characters.rows(streams.words)
    steps = streams.length // dataset.window
    assert steps > first_step + 2
    collate = DataCollatorForBiLMStreams()
    for step in range(first_step, steps):
        start = (step * dataset.processes + dataset.rank) * dataset.rows
        batch = collate([dataset[start + row] for row in range(dataset.rows)])
        input_ids, labels = expected_batch(streams, char_ids, step, dataset.window)
        assert torch.equal(batch["input_ids"], input_ids) and torch.equal(batch["labels"], labels), step
    return steps


def stream_tokenizer(corpus):
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary([corpus / "small.txt"], "pretokenizer", tokenizer, 2))
    return tokenizer


def test_unshuffled_streams_are_the_in_memory_layout_of_bilm_tf(corpus):
    """On one file (or its shards in order), without shuffling, the batches read shard by shard are those of the
    in-memory layout (`build_streams`, bilm-tf's `_get_batch`), byte for byte."""
    tokenizer = stream_tokenizer(corpus)
    sentences = list(iter_sentences([corpus / "small.txt"], "pretokenizer", tokenizer))
    for files in ([corpus / "small.txt"], [corpus / "shards"], str(corpus / "shards" / "*.txt")):
        dataset = StreamWindowDataset(files, tokenizer, 3, 7, seed=0, split="pretokenizer", epochs=1, shuffle=False)
        assert_batches_are_the_layout(dataset, sentences, tokenizer)
        # An epoch: the text's positions in steps of 3 rows x 7.
        assert dataset.steps_per_epoch == dataset.steps == sum(len(s) + 1 for s in sentences) // 21


def test_shuffled_streams_read_one_shard_after_another_and_go_on_into_the_next_epoch(corpus):
    tokenizer = stream_tokenizer(corpus)
    shards = [list(iter_sentences([path], "pretokenizer", tokenizer)) for path in sorted((corpus / "shards").iterdir())]
    dataset = StreamWindowDataset(corpus / "shards", tokenizer, 3, 7, seed=5, split="pretokenizer", steps=10**6)
    epochs = [list(dataset.epoch_sentences(epoch)) for epoch in range(2)]
    orders = []
    for read in epochs:
        # One shard after another, each one whole and shuffled.
        order, rest = [], read
        while rest:
            shard = next(k for k, sentences in enumerate(shards) if sorted(rest[: len(sentences)]) == sorted(sentences))
            assert rest[: len(shards[shard])] != shards[shard]
            order.append(shard)
            rest = rest[len(shards[shard]) :]
        assert sorted(order) == [0, 1, 2]
        orders.append(order)
    assert epochs[0] != epochs[1]
    # The rows read on from one epoch into the next, as from one sentence to the next.
    assert_batches_are_the_layout(dataset, epochs[0] + epochs[1], tokenizer)
    again = StreamWindowDataset(corpus / "shards", tokenizer, 3, 7, seed=5, split="pretokenizer", steps=10**6)
    assert list(again.epoch_sentences(1)) == epochs[1]
    other_seed = StreamWindowDataset(corpus / "shards", tokenizer, 3, 7, seed=6, split="pretokenizer", steps=10**6)
    assert list(other_seed.epoch_sentences(0)) != epochs[0]


@pytest.mark.parametrize("files", ["shards", "small.txt"])
def test_each_process_reads_its_own_part_of_the_corpus(corpus, files):
    """Ranks 0 and 1 of two processes: shards 0 and 2 and shard 1 of three, or every other line of one file; the
    parts are disjoint and cover the corpus, and each process's rows are the layout of its own part."""
    tokenizer = stream_tokenizer(corpus)
    paths = sorted((corpus / "shards").iterdir()) if files == "shards" else [corpus / "small.txt"]
    every = [list(iter_sentences([path], "pretokenizer", tokenizer)) for path in paths]
    ranks = [
        StreamWindowDataset(corpus / files, tokenizer, 2, 7, 1, "pretokenizer", steps=500, rank=r, processes=2)
        for r in range(2)
    ]
    for shuffle in (True, False):
        parts = []
        for dataset in ranks:
            dataset.shuffle = shuffle
            parts.append([" ".join(words) for words in dataset.epoch_sentences(0)])
        all_lines = Counter(" ".join(words) for sentences in every for words in sentences)
        assert Counter(parts[0]) + Counter(parts[1]) == all_lines
        if files == "shards":
            assert Counter(parts[0]) == Counter(" ".join(w) for w in every[0] + every[2])
        else:
            assert abs(len(parts[0]) - len(parts[1])) <= 1
    for rank, dataset in enumerate(ranks):  # unshuffled
        own = [words for k, sentences in enumerate(every) for words in sentences if files != "shards" or k % 2 == rank]
        if files != "shards":
            own = own[rank::2]
        assert_batches_are_the_layout(dataset, own, tokenizer)
        with pytest.raises(IndexError, match=f"belongs to the rows of process {1 - rank}, this is process {rank}"):
            dataset[(1 - rank) * 2]
    assert len(ranks[0]) == 500 * 2 * 2


def test_a_step_asked_for_first_is_the_step_of_a_pass_from_the_start(corpus):
    """A resumed run's first batch: the dataset lays the streams out again up to it."""
    tokenizer = stream_tokenizer(corpus)
    make = partial(StreamWindowDataset, corpus / "shards", tokenizer, 3, 7, 2, "pretokenizer", steps=400)
    in_order = make()
    batches = [[in_order[3 * step + row] for row in range(3)] for step in range(300)]
    for step in (299, 150, 0, 151):
        resumed = make()
        for row in range(3):
            item = resumed[3 * step + row]
            assert all(np.array_equal(item[k], batches[step][row][k]) for k in item)


@pytest.mark.parametrize(
    "files, processes, rank",
    [("shards", 1, 0), ("shards", 2, 1), ("small.txt", 2, 1)],
    ids=["shards", "own-shards", "own-lines"],
)
def test_a_step_after_a_saved_position_is_the_step_of_a_pass_from_the_start(
    corpus, monkeypatch, files, processes, rank
):
    """A resumed run's first batches: laid out from the position the batch of the checkpoint's step carries, reading
    only the lines it names and those after it, they are those of a pass from the start, within an epoch and across
    the next ones, shuffled, for a process reading its own shards or its own lines of one file."""
    from hf_elmo.training import streams as streams_bilm

    tokenizer = stream_tokenizer(corpus)
    make = partial(
        StreamWindowDataset,
        corpus / files,
        tokenizer,
        3,
        7,
        2,
        "pretokenizer",
        steps=400,
        rank=rank,
        processes=processes,
    )
    first = rank * 3

    def step_items(dataset, step):
        return [dataset[(step * processes) * 3 + first + row] for row in range(3)]

    in_order = make()
    batches = [step_items(in_order, step) for step in range(300)]
    assert in_order.steps_per_epoch is None and len({b[0]["stream_position"][1, 0] for b in batches}) >= 3  # epochs
    split_line, lines_split = streams_bilm.split_line, []
    monkeypatch.setattr(streams_bilm, "split_line", lambda *args: lines_split.append(1) or split_line(*args))
    for saved in range(0, 295, 3):  # every third step, within epochs and across them
        position = batches[saved][0]["stream_position"]
        assert position[0, 0] == saved
        resumed = make()
        resumed.resume_at(position.copy())
        lines_split.clear()
        for step in range(saved + 1, saved + 6):
            for item, expected in zip(step_items(resumed, step), batches[step], strict=True):
                assert item.keys() == expected.keys()
                assert all(np.array_equal(item[k], expected[k]) for k in item), (saved, step)
        # The rows' sentences and the new ones of 5 steps, not the text up to the saved step.
        assert len(lines_split) <= 3 + 5 * 3 * 7
    with pytest.raises(ElmoInputError, match=r"position: expected \(5, 4\) non-negative integers"):
        make().resume_at(position[:-1], "position")
    far = position.copy()
    far[2, 2] = 10**6
    with pytest.raises(ElmoInputError, match="position: names a line that the training files do not have"):
        make().resume_at(far, "position")


@pytest.mark.parametrize("seed", range(8))
def test_streams_resumed_from_any_step_of_random_small_corpora_are_a_pass_from_the_start(tmp_path, seed):
    """Tiny random corpora, where sentences start and end at every place of a step and a row's sentence may lie
    epochs and shards behind the last one taken: one to three shards with blank lines, up to three processes (more
    than shards: lines dealt by a running count), either split, shuffled or not, one to three rows of one to four
    positions. From the position of every step, the next steps are those of a pass from the start."""
    rng = np.random.default_rng(seed)
    for number in range(int(rng.integers(1, 4))):
        lines = [" ".join(rng.choice(["a", "b", "cc", "d,", "e"], int(rng.integers(0, 7)))) for _ in range(4)]
        (tmp_path / f"{number}.txt").write_text("\n".join(["a", *lines]) + "\n", encoding="utf-8")
    split = ["whitespace", "pretokenizer"][seed % 2]
    tokenizer = ElmoTokenizer()
    tokenizer.set_word_vocabulary(build_word_vocabulary(sorted(tmp_path.glob("*.txt")), split, tokenizer, 1))
    processes = int(rng.integers(1, 4))
    rank, rows, window = int(rng.integers(0, processes)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
    make = partial(
        StreamWindowDataset,
        tmp_path,
        tokenizer,
        rows,
        window,
        seed,
        split,
        steps=60,
        rank=rank,
        processes=processes,
        shuffle=bool(seed % 3),
    )

    def step_items(dataset, step):
        return [dataset[(step * processes + rank) * rows + row] for row in range(rows)]

    in_order = make()
    batches = [step_items(in_order, step) for step in range(60)]
    assert batches[-1][0]["stream_position"][1, 0] >= 1  # on into the next epochs
    for saved in range(59):
        resumed = make()
        resumed.resume_at(batches[saved][0]["stream_position"].copy())
        for step in range(saved + 1, min(saved + 4, 60)):
            for item, expected in zip(step_items(resumed, step), batches[step], strict=True):
                assert all(np.array_equal(item[k], expected[k]) for k in expected), (saved, step)


def test_the_table_of_word_rows_starting_over_changes_no_batch(corpus):
    """Each process keeps the rows and targets of the words it has read, up to `words_kept` of them: a table that
    fills up starts over, and the batches stay the layout's, read in order or not."""
    tokenizer = stream_tokenizer(corpus)
    sentences = list(iter_sentences([corpus / "small.txt"], "pretokenizer", tokenizer))
    dataset = StreamWindowDataset([corpus / "small.txt"], tokenizer, 3, 7, 0, "pretokenizer", epochs=1, shuffle=False)
    dataset.words_kept = 60  # far fewer than the text's distinct words: the table starts over again and again
    steps = assert_batches_are_the_layout(dataset, sentences, tokenizer)
    assert len(dataset._word_rows.slots) <= dataset.words_kept < len({w for s in sentences for w in s})
    in_order = [[dataset[3 * step + row] for row in range(3)] for step in range(steps)]
    for step in (steps - 1, 5, 6, 2, steps - 2):  # steps skipped, then the layout started over
        for row in range(3):
            assert all(np.array_equal(dataset[3 * step + row][k], in_order[step][row][k]) for k in in_order[step][row])


def test_character_ids_beyond_16_bits_reach_the_batches_unchanged(corpus):
    """A character vocabulary (ELMoForManyLangs) may number its characters past 32,767: the batches carry the ids the
    tokenizer gives."""
    text = (corpus / "small.txt").read_text(encoding="utf-8")
    chars = {token: k for k, token in enumerate(["<bow>", "<eow>", "<pad>", "<oov>", "<bos>", "<eos>"], start=1)}
    chars.update({char: 40_000 + k for k, char in enumerate(sorted(set(text)))})
    tokenizer = ElmoTokenizer(char_vocab=chars)
    tokenizer.set_word_vocabulary(stream_tokenizer(corpus).word_vocabulary)
    sentences = list(iter_sentences([corpus / "small.txt"], "pretokenizer", tokenizer))
    dataset = StreamWindowDataset([corpus / "small.txt"], tokenizer, 3, 7, 0, "pretokenizer", epochs=1, shuffle=False)
    assert_batches_are_the_layout(dataset, sentences, tokenizer)
    assert tokenizer.characters.rows(sentences[0]).max() >= 40_000


def random_start(corpus, folder):
    """A biLM with large random weights, saved with its tokenizer: its state says a lot about what it read (a fresh
    one is nearly constant)."""
    tokenizer = stream_tokenizer(corpus)
    config = ElmoConfig.from_json_file(corpus / "tiny.json")
    config.vocab_size = len(tokenizer.word_vocabulary)
    start = ElmoForBiLM(config)
    with torch.no_grad():
        for parameter in start.parameters():
            parameter.normal_(std=0.5)
    start.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def replay(model, dataset, steps, device):
    """The losses of the dataset's first `steps` batches and the state after them, the state carried along."""
    collate, state, losses = DataCollatorForBiLMStreams(), None, []
    first = dataset.rank * dataset.rows
    with torch.no_grad():
        for step in range(steps):
            start = first + step * dataset.rows * dataset.processes
            examples = [dataset[start + row] for row in range(dataset.rows)]
            batch = {k: v.to(device) for k, v in collate(examples).items()}
            out = model(**batch, state=state, use_cache=True, split_directions=True)
            state = out.state
            losses.append(out.loss.item())
    return losses, state, batch


def logged_losses(checkpoint):
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def test_training_carries_the_state_from_batch_to_batch(corpus, tmp_path):
    """With next to nothing learnt (learning rate 1e-9) each logged loss is the model's loss on that batch, from the
    state the previous batch ended in."""
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
            init_from=random_start(corpus, tmp_path / "start"),
            config=None,
        )
    )
    assert metrics["train_loss"] > 0
    logged = logged_losses(tmp_path / "run/checkpoint-3")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where Trainer ran: a GPU rounds otherwise than a CPU
    model = ElmoForBiLM.from_pretrained(tmp_path / "run/checkpoint-3").to(device).eval()
    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "run")
    dataset = StreamWindowDataset([corpus / "small.txt"], tokenizer, 4, 10, seed=3, split="pretokenizer", steps=3)
    carried, state, batch = replay(model, dataset, 3, device)
    with torch.no_grad():
        from_zeros = model(**batch, use_cache=True, split_directions=True).state
    np.testing.assert_allclose(logged, carried, rtol=2e-4)
    saved = load_file(tmp_path / "run/checkpoint-3/stream_state-0.safetensors")
    torch.testing.assert_close(saved["hidden"], state[0].cpu())
    torch.testing.assert_close(saved["memory"], state[1].cpu())
    assert (saved["memory"] - from_zeros[1].cpu()).abs().max() > 0.1  # a batch started from zeros ends elsewhere
    assert abs(carried[2] - model(**batch, split_directions=True).loss.item()) > 1e-2
    # The saved model starts from a warm state estimated from the training text.
    assert ElmoForBiLM.from_pretrained(tmp_path / "run").config.warm_state


def record_batches(monkeypatch) -> list:
    """The batches `StreamTrainer` trains on, from now on."""
    batches, training_step = [], StreamTrainer.training_step

    def recording_step(self, model, inputs, *args, **kwargs):
        batches.append({k: inputs[k].cpu().clone() for k in ("input_ids", "labels")})
        return training_step(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(StreamTrainer, "training_step", recording_step)
    return batches


def test_stream_run_reports_the_held_out_perplexity_of_its_weights(corpus, tmp_path):
    """`--eval-files` with `--stream`: the held-out windows go through the streams' collator (Trainer has one for
    both), and the perplexity reported is the one `hf-elmo perplexity` computes from the weights of that step."""
    held_out = [corpus / "shards" / "b.txt"]
    metrics = train_bilm(**options(corpus, tmp_path / "run", eval_files=held_out, eval_steps=3))
    model, tokenizer = load_bilm(str(tmp_path / "run/checkpoint-6"))  # the last step's weights, without a warm state
    expected = compute_perplexity(model, tokenizer, held_out, 10, "pretokenizer", 3)
    assert metrics["eval_forward_perplexity"] == pytest.approx(expected["forward"], rel=1e-6)
    assert metrics["eval_backward_perplexity"] == pytest.approx(expected["backward"], rel=1e-6)


def test_the_log_counts_an_epoch_in_optimizer_steps(corpus, tmp_path, capsys):
    """With gradient accumulation a step of the run takes several batches of the streams: the epoch the log sizes
    is the one `Trainer` runs."""
    run = options(corpus, tmp_path / "run", max_steps=-1, num_train_epochs=1, gradient_accumulation_steps=2)
    steps = train_bilm(**{**run, "logging_steps": 2, "save_steps": 1000})["steps"]
    log = capsys.readouterr().out
    assert steps > 3 and f"in pieces of 10 positions, {steps:,} steps per epoch; 1 process training." in log
    assert f"an epoch of {steps:,} steps takes about" in log


def crash_at_step(run: dict, monkeypatch, step: int):
    """Runs `run` up to a simulated crash as step `step` starts."""
    original_step = StreamTrainer.training_step

    def crashing_step(self, *args, **kwargs):
        if self.state.global_step == step:
            raise KeyboardInterrupt("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(StreamTrainer, "training_step", crashing_step)
    with pytest.raises(KeyboardInterrupt):
        train_bilm(**run)
    monkeypatch.undo()


def assert_saved_position(checkpoint: Path, corpus: Path, batches: int):
    """The position `checkpoint` saved is where the streams of a run over the shards (4 rows of 10) are after
    `batches` batches."""
    tokenizer = ElmoTokenizer.from_pretrained(checkpoint)
    dataset = StreamWindowDataset(corpus / "shards", tokenizer, 4, 10, 42, "pretokenizer", steps=8)
    saved = load_file(checkpoint / "stream_state-0.safetensors")["position"]
    assert torch.equal(saved, torch.from_numpy(dataset[(batches - 1) * 4]["stream_position"]))


@pytest.mark.parametrize("saved_position", [True, False], ids=["from-the-position", "checkpoint-without-position"])
def test_resumed_stream_run_ends_with_the_same_weights(corpus, tmp_path, monkeypatch, saved_position):
    """A run over shards interrupted after its checkpoint at step 3 and resumed (with data loader workers) trains on
    the batches of an uninterrupted run from step 4 on, and ends with its weights: the streams laid out from the
    position the checkpoint saved, or from the start for a checkpoint written before positions were saved."""
    run = options(corpus, tmp_path / "interrupted", dropout=0.1, num_softmax_samples=32, max_steps=8, save_steps=3)
    run["train_files"] = [corpus / "shards"]
    uninterrupted = record_batches(monkeypatch)
    train_bilm(**{**run, "output_dir": tmp_path / "uninterrupted"})
    monkeypatch.undo()
    crash_at_step(run, monkeypatch, 4)
    checkpoint = tmp_path / "interrupted/checkpoint-3"
    # Where the streams are after step 3, from which the resumed run lays them out (not from the start).
    assert_saved_position(checkpoint, corpus, batches=3)
    # Resuming needs the stream state of every process of the run.
    shutil.copy(checkpoint / "stream_state-0.safetensors", checkpoint / "stream_state-1.safetensors")
    with pytest.raises(ValueError, match="holds the stream states of 2 processes, this run has 1"):
        train_bilm(**run, resume=True)
    (checkpoint / "stream_state-1.safetensors").unlink()
    if not saved_position:
        state = load_file(checkpoint / "stream_state-0.safetensors")
        save_file({k: v for k, v in state.items() if k != "position"}, checkpoint / "stream_state-0.safetensors")
    resumed = record_batches(monkeypatch)
    # Each data loader worker lays the streams out for itself, up to the steps it is asked for.
    train_bilm(**run, resume=True, dataloader_num_workers=2)
    assert len(uninterrupted) == 8 and len(resumed) == 5
    for expected, batch in zip(uninterrupted[3:], resumed):
        assert all(torch.equal(expected[k], batch[k]) for k in batch)
    assert not torch.equal(uninterrupted[3]["input_ids"], uninterrupted[4]["input_ids"])
    expected = load_file(tmp_path / "uninterrupted/model.safetensors")
    actual = load_file(tmp_path / "interrupted/model.safetensors")
    assert expected.keys() == actual.keys()
    assert max((expected[k] - actual[k]).abs().max().item() for k in expected) <= 1e-6


def test_with_gradient_accumulation_the_position_is_the_last_batch_of_the_step(corpus, tmp_path, monkeypatch):
    """Two batches a step: the checkpoint of step 2 saves the position after the 4th batch (the step's last), and the
    run resumed from it ends with the weights of the uninterrupted run."""
    run = options(corpus, tmp_path / "interrupted", max_steps=4, save_steps=2, gradient_accumulation_steps=2)
    run["train_files"] = [corpus / "shards"]
    train_bilm(**{**run, "output_dir": tmp_path / "uninterrupted"})
    crash_at_step(run, monkeypatch, 3)
    checkpoint = tmp_path / "interrupted/checkpoint-2"
    assert_saved_position(checkpoint, corpus, batches=4)
    train_bilm(**run, resume=True)
    expected = load_file(tmp_path / "uninterrupted/model.safetensors")
    actual = load_file(tmp_path / "interrupted/model.safetensors")
    assert max((expected[k] - actual[k]).abs().max().item() for k in expected) <= 1e-6


def test_two_processes_each_carry_the_streams_of_their_own_shards(corpus, tmp_path, monkeypatch):
    """Under torchrun each process reads its own shards (of three: a and c, and b), its rows laid out as
    `StreamWindowDataset` lays out that process's part; with next to nothing learnt the saved state of each process
    is that of its rows, and the logged loss the mean of the processes' losses."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < 2:
        # As in test_training: two processes on one GPU would share it under NCCL; all runs use the CPU (gloo).
        env["CUDA_VISIBLE_DEVICES"] = ""
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    arguments = (
        f"train --stream --train-files {corpus / 'shards'} --init-from {random_start(corpus, tmp_path / 'start')} "
        "--split pretokenizer --window 10 --max-steps 3 --logging-steps 1 --save-steps 3 --dropout 0 "
        "--num-softmax-samples 0 --learning-rate 1e-9 --seed 3 --per-device-train-batch-size 2 --disable-tqdm "
        f"--output-dir {tmp_path / 'ddp'}"
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "hf_elmo.commands",
    ]
    result = subprocess.run(command + arguments.split(), env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ElmoForBiLM.from_pretrained(tmp_path / "ddp/checkpoint-3").to(device).eval()
    tokenizer = ElmoTokenizer.from_pretrained(tmp_path / "ddp")
    losses = []
    for rank in range(2):
        dataset = StreamWindowDataset(
            corpus / "shards", tokenizer, 2, 10, seed=3, split="pretokenizer", steps=3, rank=rank, processes=2
        )
        rank_losses, state, _ = replay(model, dataset, 3, device)
        losses.append(rank_losses)
        saved = load_file(tmp_path / f"ddp/checkpoint-3/stream_state-{rank}.safetensors")
        torch.testing.assert_close(saved["hidden"], state[0].cpu())
        torch.testing.assert_close(saved["memory"], state[1].cpu())
    np.testing.assert_allclose(logged_losses(tmp_path / "ddp/checkpoint-3"), np.mean(losses, axis=0), rtol=2e-4)
    assert abs(losses[0][2] - losses[1][2]) > 1e-2  # the processes read different text


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
