"""The command line itself: options declared once as dataclasses and read by `HfArgumentParser`, flags that take no
value, and `hf-elmo env`."""

import dataclasses
import importlib.metadata

import torch

import hf_elmo
from hf_elmo.commands.cli import COMMANDS, build_parser
from hf_elmo.commands.cli import main as cli_main
from hf_elmo.commands.env import cpu_flags
from hf_elmo.tokenization_elmo import ElmoTokenizer
from hf_elmo.training.corpus import build_word_vocabulary


def test_every_command_declares_its_options_as_a_dataclass():
    for name, module in COMMANDS.items():
        declared = module.COMMAND_OPTIONS
        # `train` reads its own dataclasses next to transformers' TrainingArguments, as transformers' examples do
        for options in declared if isinstance(declared, tuple) else (declared,):
            assert dataclasses.is_dataclass(options), name
        assert callable(module.run), name


def test_the_documented_spellings_are_accepted():
    parser = build_parser()
    dashed = parser.parse_args(["export", "--model", "M", "--output-dir", "out", "--with-state"])
    underscored = parser.parse_args(["export", "--model", "M", "--output_dir", "out", "--with_state"])
    assert (dashed.output_dir, dashed.with_state) == (underscored.output_dir, underscored.with_state) == ("out", True)


def test_a_flag_before_a_positional_argument_does_not_take_it_as_its_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat .\nthe dog sat .\n", encoding="utf-8")
    (tmp_path / "v.txt").write_text("<S>\n</S>\n<UNK>\nold\n", encoding="utf-8")  # an earlier vocabulary: --force
    assert cli_main(["vocab", "--force", "corpus.txt", "--output", "v.txt"]) == 0
    expected = build_word_vocabulary(["corpus.txt"], "pretokenizer", ElmoTokenizer())
    assert (tmp_path / "v.txt").read_text(encoding="utf-8").splitlines() == expected
    options = build_parser().parse_args(["embed", "--top", "--raw", "in.txt", "out.h5", "--model", "M"])
    assert (options.input, options.output, options.model) == ("in.txt", "out.h5", "M")
    assert (options.top, options.raw, options.all) == (True, True, False)


def test_options_given_on_the_command_line_are_known(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setitem(COMMANDS, "export", _recording(COMMANDS["export"], seen))
    assert cli_main(["export", "--model", "M", "--output-dir", "out", "--format", "original"]) == 0
    assert seen["given"] == {"model", "output_dir", "format"}
    assert (seen["format"], seen["force"], seen["with_state"]) == ("original", False, False)


def _recording(module, seen):
    class Recording:
        COMMAND_OPTIONS = module.COMMAND_OPTIONS

        @staticmethod
        def run(options):
            seen.update(vars(options))
            return 0

    return Recording


def test_cpu_flags_are_read_from_cpuinfo():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_tile\nbugs\t\t: spectre_v1\n"
    expected = {"avx2": True, "avx512f": True, "avx512_bf16": False, "amx_tile": True, "amx_bf16": False}
    assert cpu_flags(cpuinfo) == expected
    assert cpu_flags("Processor\t: AArch64\nFeatures\t: fp asimd\n") == {}


def test_env_prints_the_versions(capsys):
    assert cli_main(["env", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        f"hf_elmo       {hf_elmo.__version__}",
        f"torch         {torch.__version__}",
        f"transformers  {importlib.metadata.version('transformers')}",
    ]
    cuda = next(line for line in lines if line.startswith("cuda "))
    assert (cuda == "cuda          not available") == (not torch.cuda.is_available())


def test_the_commands_are_installed():
    from pathlib import Path

    import tomllib

    root = Path(hf_elmo.__file__).resolve().parent
    with open(root.parent / "pyproject.toml", "rb") as file:
        listed = tomllib.load(file)["tool"]["setuptools"]["packages"]
    packages = {".".join(init.parent.relative_to(root.parent).parts) for init in root.rglob("__init__.py")}
    assert sorted(listed) == sorted(packages)
