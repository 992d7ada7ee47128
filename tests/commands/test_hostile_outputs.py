"""What the commands' refusals must not break: every command's outputs get the permissions of any new file, and
`--force` replaces an earlier output of the same command.
"""

import os
import stat

from hostile import CONVERT, EMBED, snapshot

from hf_elmo.commands.cli import main as cli_main


def test_outputs_get_the_permissions_of_any_new_file(workspace):
    umask = os.umask(0o022)
    try:
        assert cli_main(f"{CONVERT} --output-dir converted".split()) == 0
        assert cli_main("export --model M --output-dir exported".split()) == 0
        assert cli_main(f"{EMBED} --model M".split()) == 0
        assert cli_main("vocab corpus.txt --output v.txt".split()) == 0
    finally:
        os.umask(umask)
    for path, mode in [
        ("converted", 0o755),
        ("exported", 0o755),
        ("out.h5", 0o644),
        ("v.txt", 0o644),
        ("converted/config.json", 0o644),
        ("exported/weights.hdf5", 0o644),
    ]:
        assert stat.S_IMODE((workspace / path).stat().st_mode) == mode, path


def test_force_replaces_an_earlier_output_of_each_command(workspace, capsys):
    for command in (
        f"{CONVERT} --output-dir out",
        "export --model M --output-dir exported",
        f"{EMBED} --model M",
        "vocab corpus.txt --output v.txt",
    ):
        assert cli_main(command.split()) == 0
        before = snapshot(workspace)
        assert cli_main(command.split()) == 2 and "(use --force to replace it)" in capsys.readouterr().err
        assert cli_main([*command.split(), "--force"]) == 0
        assert snapshot(workspace).keys() == before.keys()  # replaced, nothing left beside it


def test_weights_get_the_permissions_of_any_new_file(workspace):
    umask = os.umask(0o027)
    try:
        assert cli_main(f"{CONVERT} --output-dir converted".split()) == 0
        assert cli_main("warm-state --model M --in-place corpus.txt --device cpu".split()) == 0  # replaces M's weights
    finally:
        os.umask(umask)
    for path in ("converted/model.safetensors", "converted/config.json", "M/model.safetensors"):
        assert stat.S_IMODE((workspace / path).stat().st_mode) == 0o640, path
