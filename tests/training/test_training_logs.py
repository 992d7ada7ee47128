"""What `hf-elmo train` tells while it runs: the time a step takes in every mode (`--stream` with `--max-steps`
included, where the epoch's size is unknown), and the checkpoint `--resume` continues from."""

import re

from test_training import one_thread  # noqa: F401  (an autouse fixture)
from test_training_stream import corpus, options  # noqa: F401  (a fixture)

from hf_elmo.commands.train import train_bilm


def test_a_stream_run_of_max_steps_logs_its_time_a_step_and_a_resume_its_checkpoint(corpus, tmp_path, capsys):  # noqa: F811
    run = options(corpus, tmp_path / "run", max_steps=3, logging_steps=2, save_steps=3)
    train_bilm(**run)
    log = capsys.readouterr().out
    assert re.search(r"^Steps 2-3: [\d.e+-]+ s a step; the remaining 0 steps of the run about ", log, re.M), log
    assert "--resume" not in log

    train_bilm(**{**run, "max_steps": 6}, resume=True)
    log = capsys.readouterr().out
    assert re.search(r"^--resume: continuing from checkpoint-3\.$", log, re.M), log
    assert re.search(r"^Steps 5-6: [\d.e+-]+ s a step; the remaining 0 steps of the run about ", log, re.M), log
