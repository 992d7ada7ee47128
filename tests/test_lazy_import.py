"""`import hf_elmo` loads neither transformers' models and pipelines nor the package's own heavy parts, and everything
it registers is there when used: the Auto classes (config, tokenizer, every model class), the pipeline tasks, the
`auto_map` of saved folders. `hf-elmo --help` imports no command; `hf-elmo train --help` lists ELMo's options before
the Trainer's. Each check runs in a fresh interpreter (what is imported is the point)."""

import json
import re
import subprocess
import sys
import textwrap

from hf_elmo.commands.cli import build_parser

# Loaded on first use only.
HEAVY = (
    "torch",
    "transformers.modeling_utils",
    "transformers.pipelines",
    "transformers.trainer",
    "sentence_transformers",
    "onnx",
    "onnxscript",
    "datasets",
    "h5py",
    "hf_elmo.modeling_elmo",
    "hf_elmo.tokenization_elmo",
    "hf_elmo.cpu_kernels",
)


def run_python(code: str) -> dict:
    """Runs `code` in a fresh interpreter; returns what it printed as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_hf_elmo_loads_nothing_heavy():
    loaded = run_python(f"""
        import json, sys
        import hf_elmo
        print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))
    """)
    assert loaded == []


def test_what_import_hf_elmo_registers_is_there_when_used(tmp_path):
    seen = run_python(f"""
        import json, sys
        import hf_elmo
        from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification, AutoTokenizer
        before = [name for name in ("hf_elmo.modeling_elmo", "transformers.pipelines") if name in sys.modules]
        config = hf_elmo.ElmoConfig.from_preset("tiny", num_labels=3)
        tagger = AutoModelForTokenClassification.from_config(config)
        tagger.save_pretrained({str(tmp_path)!r})
        hf_elmo.ElmoTokenizer().save_pretrained({str(tmp_path)!r})
        saved = json.load(open({str(tmp_path / "config.json")!r}))["auto_map"]
        loaded = [type(AutoConfig.from_pretrained({str(tmp_path)!r})).__name__,
                  type(AutoTokenizer.from_pretrained({str(tmp_path)!r})).__name__,
                  type(AutoModel.from_pretrained({str(tmp_path)!r})).__name__]
        from transformers import pipeline
        from transformers.pipelines import PIPELINE_REGISTRY
        tasks = sorted(t for t in PIPELINE_REGISTRY.get_supported_tasks() if "elmo" in t or t == "question-answering")
        tagged = pipeline("token-classification", model={str(tmp_path)!r})("The cat sat .")
        print(json.dumps({{"before": before, "tagger": type(tagger).__name__, "same_class":
            type(tagger) is hf_elmo.ElmoForTokenClassification, "auto_map": saved, "loaded": loaded, "tasks": tasks,
            "tagged": [item["word"] for item in tagged]}}))
    """)
    assert seen["before"] == [], "the Auto classes hold stand-ins until a model class is used"
    assert seen["tagger"] == "ElmoForTokenClassification" and seen["same_class"]
    assert seen["auto_map"]["AutoModelForTokenClassification"] == "modeling_elmo.ElmoForTokenClassification"
    assert seen["auto_map"]["AutoConfig"] == "configuration_elmo.ElmoConfig"
    assert seen["loaded"] == ["ElmoConfig", "ElmoTokenizer", "ElmoModel"]
    assert seen["tasks"] == ["elmo-question-answering", "elmo-token-classification", "question-answering"]
    assert seen["tagged"] == ["The", "cat", "sat", "."]


def test_the_commands_list_imports_neither_torch_nor_transformers():
    loaded = run_python("""
        import contextlib, io, json, sys
        from hf_elmo.commands.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as shown, contextlib.suppress(SystemExit):
            main(["--help"])
        assert "warm-state" in shown.getvalue() and "pre-train a biLM" in shown.getvalue()
        print(json.dumps([name for name in sys.modules if name.split(".")[0] in ("torch", "transformers", "numpy")]))
    """)
    assert loaded == []


def test_train_help_lists_elmos_options_before_the_trainers():
    shown = build_parser(["train"])._subparsers._group_actions[0].choices["train"].format_help()
    own, _, trainer = shown.partition("TrainingArguments of transformers (general training options):")
    assert trainer, shown[-2000:]

    def lists(text, option):
        return re.search(rf"\n  {option}[ ,\n]", text) is not None

    for option in ("--config", "--train_files", "--stream", "--resume", "--all_clip_norm_val", "--max_minutes"):
        assert lists(own, option) and not lists(trainer, option), option
    for option in ("--output_dir", "--learning_rate", "--max_steps", "--per_device_train_batch_size", "--optim"):
        assert lists(trainer, option) and not lists(own, option), option
