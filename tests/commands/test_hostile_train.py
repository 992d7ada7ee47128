"""`hf-elmo train` given careless or hostile input (corpora, shards, options, configurations, checkpoints to resume
from): refused with one line, nothing changed; a checkpoint interrupted while written, the earlier ones kept.
"""

import pytest
from hostile import (
    _SIGNALLED_RUN,
    CORPUS,
    STREAM_SHARDS,
    TRAIN,
    Case,
    alphabetical_vocabulary,
    check_memory_refusal,
    check_refused,
    copy,
    edit_json,
    edit_stream_position,
    line_beyond_the_shard,
    nan_accumulator,
    pickle_only_model,
    read_beyond_the_sentence,
    run_memory_cases,
    stream_run_on_shards,
    symlink,
    trained,
    truncate,
    windows_of_another_table,
    write,
)

CASES = {
    # --- data loss: outputs that are, hold or lie inside an input; --force over what the command did not write ---
    "train into the folder of its corpus": Case(
        "train --train-files corpus.txt --output-dir . --data-cache-dir cache",
        r"^error: \.: holds the input corpus\.txt; write the output elsewhere$",
    ),
    "train inside the model it starts from": Case(
        "train --train-files corpus.txt --init-from M --output-dir M/adapted --data-cache-dir cache",
        r"^error: M/adapted: is inside the input M;",
    ),
    # --- training: non-finite values, resuming, the output folder (hf-elmo train) ---
    # Step 1's loss is that of the initial weights; its update at a learning rate of 1e30 leaves none finite after.
    "train: --learning-rate 1e30 (Adagrad)": Case(
        f"{TRAIN} --learning-rate 1e30 --max-steps 3",
        r"^error: training stopped: the loss of step 2 is (nan|inf); nothing from that step on was saved \(no "
        r"checkpoint was written before\)$",
        [trained("earlier", "--max-steps 1")],
    ),
    "train: --learning-rate 1e30 (AdamW)": Case(
        f"{TRAIN} --optim adamw_torch --learning-rate 1e30 --max-steps 3",
        r"^error: training stopped: the loss of step 2 is (nan|inf); nothing from that step on was saved",
        [trained("earlier", "--max-steps 1")],
    ),
    "train --resume: an optimizer.pt with a NaN accumulator": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/optimizer\.pt: the optimizer state holds NaN or infinite values \('sum' "
        r"of 'elmo\.char_encoder\.char_embedding\.weight'\)$",
        [trained("run", "--max-steps 2 --save-steps 1"), nan_accumulator("run/checkpoint-2/optimizer.pt")],
    ),
    "train --resume: the optimizer.pt of an earlier checkpoint": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/optimizer\.pt: the optimizer state is at step 1, but trainer_state\.json "
        r"there is at step 2: the file belongs to another checkpoint$",
        [
            trained("run", "--max-steps 2 --save-steps 1"),
            copy("run/checkpoint-1/optimizer.pt", "run/checkpoint-2/optimizer.pt"),
        ],
    ),
    "train --resume: a truncated model.safetensors in the last checkpoint": Case(
        f"{TRAIN} --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/model\.safetensors: not a readable safetensors file \(.*\); checkpoint-1 "
        r"is intact: move checkpoint-2 out of run to continue from it\.$",
        [trained("run", "--max-steps 2 --save-steps 1"), truncate("run/checkpoint-2/model.safetensors", 100)],
    ),
    "train --resume --stream: a truncated stream state": Case(
        f"{TRAIN} --stream --per-device-train-batch-size 2 --window 8 --save-steps 1 --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: not a readable safetensors file \(.*\); "
        r"checkpoint-1 is intact",
        [
            trained("run", "--stream --per-device-train-batch-size 2 --window 8 --max-steps 2 --save-steps 1"),
            truncate("run/checkpoint-2/stream_state-0.safetensors", 10),
        ],
    ),
    "train --resume: an option given again with another value than the recorded one": Case(
        # the default, given: not replaced by the record
        "train --output-dir run --resume --per-device-train-batch-size 128",
        r"^error: --resume: the run in run has other options \(bilm_training_options\.json\): "
        r"--per-device-train-batch-size 4 there, "
        r"128 given; leave them out to continue with the recorded ones\.$",
        [trained("run", "--max-steps 2 --save-steps 1 --per-device-train-batch-size 4")],
    ),
    "train --output-dir a symbolic link": Case(
        f"{TRAIN} --output-dir link",
        r"^error: link: is a symbolic link; give the folder itself or a new name$",
        [write("elsewhere/notes.txt", "mine"), symlink("link", "elsewhere")],
    ),
    # --- training options: ELMo's next to Trainer's TrainingArguments (hf-elmo train) ---
    "train without --output-dir": Case(
        "train --train-files corpus.txt --config B --data-cache-dir cache",
        r"^error: output_dir \(--output_dir\) is needed: the folder of the run\.$",
    ),
    "train: Trainer's --resume-from-checkpoint instead of --resume": Case(
        f"{TRAIN} --resume-from-checkpoint run/checkpoint-1",
        r"^error: --resume_from_checkpoint: give --resume, which continues from the run's last checkpoint\.$",
    ),
    "train: --all-clip-norm-val -1": Case(
        f"{TRAIN} --all-clip-norm-val -1", r"^error: all_clip_norm_val must be >= 0, got -1\.0\.$"
    ),
    "train: --per-device-eval-batch-size 0": Case(
        f"{TRAIN} --per-device-eval-batch-size 0", r"^error: per_device_eval_batch_size must be >= 1, got 0\.$"
    ),
    # --- silent wrong answers: NaN, zero sizes, options that do not describe the weights ---
    "train: --num-train-epochs 0": Case(
        f"{TRAIN} --num-train-epochs 0", r"epochs must be > 0 .*got 0\.0: nothing would be trained"
    ),
    "train: --window 0": Case(f"{TRAIN} --window 0", r"window must be >= 3 positions .*got 0"),
    "train: --learning-rate nan": Case(f"{TRAIN} --learning-rate nan", r"learning_rate must be a finite number"),
    "train: --per-device-train-batch-size 0": Case(
        f"{TRAIN} --per-device-train-batch-size 0", r"per_device_train_batch_size must be >= 1, got 0"
    ),
    "train: --dropout 1": Case(f"{TRAIN} --dropout 1", r"dropout must be in \[0, 1\), got 1\.0"),
    "train: vocabulary not sorted by frequency, with the sampled softmax": Case(
        f"{TRAIN} --vocab v.txt --num-softmax-samples 2",
        r"The vocabulary \(from v\.txt\) is not ordered by frequency: .*\(--num-softmax-samples 0\)",
        [alphabetical_vocabulary],
        ("v.txt",),
    ),
    # --- stack traces and unclear messages ---
    "train --split pretokenizer: a 10 MB word": Case(
        f"{TRAIN} --split pretokenizer",
        r"^error: corpus\.txt, line 3: the text has more than 100,000 characters without whitespace",
        [write("corpus.txt", "the cat\nsat .\n" + "x" * 200_001 + "\n")],
    ),
    "train: invalid UTF-8 in the corpus": Case(
        f"{TRAIN}",
        r"Training file 'corpus\.txt': line 2 is not valid UTF-8 \(byte 5: invalid start byte\)",
        [write("corpus.txt", b"the cat\nthe \xff dog\n")],
    ),
    "train: --init-from a folder with only a pickle checkpoint": Case(
        "train --train-files corpus.txt --init-from P --output-dir run --disable-tqdm --data-cache-dir cache",
        r"P: ELMo loads weights only from safetensors",
        [pickle_only_model],
    ),
    "train: --config with a NaN": Case(
        "train --train-files corpus.txt --config M/config.json --output-dir run --data-cache-dir cache",
        r"^error: ElmoConfig\.cell_clip must be finite, got nan\.$",
        [edit_json("M/config.json", cell_clip=float("nan"))],
    ),
    # --- training defaults and presets (a sentence longer than the window is cut, not refused: see
    # tests/training/test_training_data.py) ---
    "train: --config naming neither a preset nor a file": Case(
        TRAIN.replace("--config B", "--config huge"),
        r"--config 'huge' is neither a preset \(tiny, small, medium, original, seqvec, seqvec-tiny\) nor an "
        r"existing file or folder\.$",
    ),
    # --- compact training data and its guard-rails ---
    "train: a pattern of shards that matches no file": Case(
        TRAIN.replace("corpus.txt", "shards/*.txt"),
        r"^error: Training files 'shards/\*\.txt': no file matches the pattern\.$",
    ),
    "train: a folder of shards that holds no file": Case(
        TRAIN.replace("corpus.txt", "shards"),
        r"^error: Training folder 'shards' holds no file\.$",
        [lambda root: (root / "shards" / ".hidden").mkdir(parents=True)],
    ),
    # --- lazy streams (train --stream over shards) ---
    "train --stream: an empty shard": Case(
        f"{STREAM_SHARDS} --max-steps 2",
        r"^error: Training file 'shards/b\.txt' is empty: it has no words\.$",
        [write("shards/a.txt", CORPUS), write("shards/b.txt", "\n \n")],
    ),
    "train --stream: a shard that is not UTF-8": Case(
        f"{STREAM_SHARDS} --max-steps 2",
        r"^error: Training file 'shards/b\.txt': line 2 is not valid UTF-8 \(byte 1: invalid start byte\)\.$",
        [write("shards/a.txt", CORPUS), write("shards/b.txt", b"the cat .\n\xff dog .\n")],
    ),
    "train --resume --stream: a shard gone since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: 'shards/b\.txt', a shard the run read \(stream_corpus\.json in run/checkpoint-2\), is no "
        r"longer among the training files: resume with the run's shards$",
        [*stream_run_on_shards(), lambda root: (root / "shards/b.txt").unlink()],
    ),
    "train --resume --stream: a shard changed since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: training file 'shards/b\.txt' changed since the run read it \(14 bytes then, 12 now; "
        r"stream_corpus\.json in run/checkpoint-2\): resume with the run's shards$",
        [*stream_run_on_shards(), write("shards/b.txt", "the dog sat\n")],
    ),
    "train --resume --stream: a shard of the same size changed since the run read it": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: training file 'shards/b\.txt' changed since the run read it \(14 bytes then, 14 now;",
        [*stream_run_on_shards(), write("shards/b.txt", "the cat sat .\n")],
    ),
    "train --resume --stream: a shard added since the run started": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: the training files now include 'shards/c\.txt', which the run did not read "
        r"\(stream_corpus\.json in run/checkpoint-2\): resume with the run's shards$",
        [*stream_run_on_shards(), write("shards/c.txt", CORPUS)],
    ),
    "train --resume --stream: a checkpoint of the earlier --stream, without the record of its shards": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2: no stream_corpus\.json: written by an earlier version of --stream, which "
        r"laid the streams out otherwise; start a new run",
        [*stream_run_on_shards(), lambda root: (root / "run/checkpoint-2/stream_corpus.json").unlink()],
    ),
    # --- the saved position of --stream's streams (resumed without reading the text before it) ---
    "train --resume --stream: a stream position of another number of rows": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: expected \(4, 4\) non-negative "
        r"integers \(the streams of 2 rows\), got \(3, 4\) int64$",
        [*stream_run_on_shards(), edit_stream_position(lambda position: position[:-1])],
    ),
    "train --resume --stream: a stream position naming a line the shards do not have": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: names a line that the training "
        r"files do not have$",
        [*stream_run_on_shards(), edit_stream_position(line_beyond_the_shard)],
    ),
    # --- review of the batches made on the device and of --stream's saved position ---
    # A count of positions read past the sentence made the layout read the corpus on, for ever where large.
    "train --resume --stream: a stream position read past a sentence's end": Case(
        "train --output-dir run --resume --max-steps 3",
        r"^error: --resume: run/checkpoint-2/stream_state-0\.safetensors: position: row 1 has read 1000000 positions "
        r"of a sentence that offers 1 to \d+ \(shards/[ab]\.txt, line \d\)$",
        [*stream_run_on_shards(), edit_stream_position(read_beyond_the_sentence)],
    ),
    # Trainer's label smoothing took the labels away from the model and looked for logits (a KeyError).
    "train: --label-smoothing-factor 0.1": Case(
        f"{TRAIN} --label-smoothing-factor 0.1",
        r"^error: label_smoothing_factor must be 0 for ElmoForBiLM, got 0\.1: the model computes its loss itself, "
        r"Trainer's label smoothing would read logits it does not return\.$",
    ),
    # --- training batches collated in data-loader workers ---
    "train: a batch refused while a loader worker collates it": Case(
        f"{TRAIN} --dataloader-num-workers 1",
        r"^error: Example 0: stored word indices must be in \[-1, \d+\], got \[-1, 1000000\]: the window was prepared "
        r"with another word table\.$",
        [trained("first"), windows_of_another_table("cache")],
    ),
    # --- train: --max-steps 0, which Trainer would run as one step ---
    "train: --max-steps 0": Case(
        f"{TRAIN} --max-steps 0",
        r"^error: max_steps must be > 0 \(the steps to train\) or -1 \(the default: num_train_epochs decides\), "
        r"got 0\.$",
    ),
    "train --stream: --max-steps 0": Case(
        f"{TRAIN} --stream --max-steps 0", r"^error: max_steps must be > 0 \(the steps to train\) or -1"
    ),
    # --- train: --stream with --streaming, two ways of reading lazily ---
    "train: --stream with --streaming": Case(
        f"{TRAIN} --stream --streaming --max-steps 2",
        r"^error: --streaming reads windows lazily; --stream reads its shards lazily anyway: give one of the two\.$",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_with_one_line_and_nothing_changed(name, workspace, capsys):
    check_refused(CASES[name], workspace, capsys)


MEMORY_CASES = {
    # name: (what to change in a copy of M / B / options.json, command, message)
    # --- compact training data and its guard-rails ---
    "train: weights, gradients and optimizer state beyond the memory": (
        ("B/config.json", {"projection_dim": 10**5, "cell_dim": 1000}),
        TRAIN,
        r"^error: the weights, their gradients and the adagrad state need 20\.1 GiB before activations \(0\.0\d+ GiB "
        r"of it for the softmax of \d+ words x 100001\), more than the [\d.]+ GiB of this process's address space "
        r"limit",
    ),
}


@pytest.fixture(scope="module")
def memory_results(tmp_path_factory, converted_dirs, bilm_dir):
    return run_memory_cases(MEMORY_CASES, tmp_path_factory, converted_dirs, bilm_dir)


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_sizes_are_checked_before_anything_is_allocated(name, memory_results):
    check_memory_refusal(MEMORY_CASES[name], memory_results[name])


def test_sigterm_while_a_checkpoint_is_written_keeps_the_earlier_ones(workspace):
    import signal
    import subprocess
    import sys

    command = (
        f"{TRAIN} --per-device-train-batch-size 1 --max-steps 6 --save-steps 2 --num-softmax-samples 0 "
        "--logging-steps 100 "
        "--window 12"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _SIGNALLED_RUN,
            "hf_elmo.commands.train",
            "ElmoTrainer",
            "_save_rng_state",
            "2",
            str(int(signal.SIGTERM)),
            command,
        ],
        cwd=workspace,
        capture_output=True,
        timeout=900,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 130 and "Traceback" not in stderr, stderr
    assert stderr.strip().split("\n")[-1] == "interrupted by SIGTERM: the output in progress was not written"
    assert sorted(p.name for p in (workspace / "run").iterdir()) == ["bilm_training_options.json", "checkpoint-2"]
