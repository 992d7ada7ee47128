"""What a saved model carries: the code `save_pretrained` copies into a folder holds the model and nothing of the
command line or the Hub, the folder loads and saves with `trust_remote_code=True` where hf_elmo cannot be imported,
and the table of model classes is the one `hf_elmo/__init__.py` registers."""

import ast
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import as_a_folder_copy_runs, run_without_hf_elmo
from transformers import PreTrainedModel

import hf_elmo
from hf_elmo import ElmoConfig, ElmoForTokenClassification, ElmoModel, ElmoTokenizer
from hf_elmo.configuration_elmo import AUTO_MAP, MODEL_CLASSES

PACKAGE = Path(hf_elmo.__file__).parent
DOCS = Path(__file__).parents[2] / "docs" / "architecture.md"
TINY = dict(char_embedding_dim=4, filters=[[1, 4], [2, 4]], n_highway=1, cell_dim=8, projection_dim=4, num_layers=1)
# Command-line and Hub code: a module importing one of these is no part of a model.
COMMAND_LINE_MODULES = {"argparse", "signal"}
HUB_UPLOAD_NAMES = {"HfApi", "create_repo", "upload_file", "upload_folder", "ModelCard", "hf_api"}


def command_line_or_hub_imports(source: str) -> set[str]:
    """The imports of `source` (at any depth, inside functions too) that belong to the command line or the Hub."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] in COMMAND_LINE_MODULES}
            found |= {alias.name for alias in node.names if alias.name.startswith("huggingface_hub.hf_api")}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in COMMAND_LINE_MODULES:
                found.add(node.module)
            elif node.module.startswith("huggingface_hub"):
                found |= {f"{node.module}.{a.name}" for a in node.names if a.name in HUB_UPLOAD_NAMES}
    return found


def test_the_rule_recognises_command_line_and_hub_modules():
    for name in ("commands/cli.py", "io/files.py", "features/hub.py"):
        assert command_line_or_hub_imports((PACKAGE / name).read_text(encoding="utf-8")), name


def documented_files() -> set[str]:
    """The files the section "What a saved model carries" of docs/architecture.md lists."""
    section = DOCS.read_text(encoding="utf-8").split("## What a saved model carries", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([\w.]+\.py)`", row)}


@pytest.mark.parametrize("model_class", [ElmoModel, ElmoForTokenClassification])
def test_a_saved_model_carries_only_model_code(model_class, tmp_path):
    torch.manual_seed(0)
    model_class(ElmoConfig(**TINY, num_labels=3)).save_pretrained(tmp_path)
    copied = {path.name: path.read_text(encoding="utf-8") for path in tmp_path.glob("*.py")}
    assert "modeling_elmo.py" in copied
    offending = {name: found for name, source in copied.items() if (found := command_line_or_hub_imports(source))}
    assert not offending
    assert set(copied) == documented_files()


def test_a_saved_head_loads_and_saves_without_the_package(tmp_path):
    torch.manual_seed(0)
    model = ElmoForTokenClassification(ElmoConfig(**TINY, num_labels=3)).eval()
    model.save_pretrained(tmp_path / "tagger")
    assert (tmp_path / "tagger" / "README.md").is_file()  # the card, written by the installed package
    words = [["The", "cat", "sat", "."], ["Hi"]]
    batch = ElmoTokenizer()(words, is_split_into_words=True, padding=True, return_tensors="pt")
    np.save(tmp_path / "input_ids.npy", batch["input_ids"].numpy())
    np.save(tmp_path / "attention_mask.npy", batch["attention_mask"].numpy())
    script = """
        import numpy, os, torch
        from transformers import AutoModel, AutoModelForTokenClassification
        tagger = AutoModelForTokenClassification.from_pretrained("tagger", trust_remote_code=True).eval()
        assert type(tagger).__module__.startswith("transformers_modules"), type(tagger).__module__
        with torch.no_grad():
            batch = {name: torch.from_numpy(numpy.load(name + ".npy")) for name in ("input_ids", "attention_mask")}
            numpy.save("logits.npy", tagger(**batch).logits.numpy())
        assert "compiled" not in repr(tagger.elmo.paths), tagger.elmo.paths
        tagger.save_pretrained("again")
        assert not os.path.exists("again/README.md"), "a card without the package"
        bilm = AutoModel.from_pretrained("again", trust_remote_code=True)
        assert type(bilm).__name__ == "ElmoModel", type(bilm)
    """
    run_without_hf_elmo(textwrap.dedent(script), tmp_path)
    with torch.no_grad(), as_a_folder_copy_runs(model):
        expected = model(**batch).logits.numpy()
    assert np.array_equal(np.load(tmp_path / "logits.npy"), expected)


def test_the_package_registers_the_table_of_model_classes():
    exported = {
        name
        for name in hf_elmo.__all__
        if isinstance(getattr(hf_elmo, name), type) and issubclass(getattr(hf_elmo, name), PreTrainedModel)
    }
    assert exported - {"ElmoPreTrainedModel"} == set(MODEL_CLASSES)
    for name, entry in MODEL_CLASSES.items():
        model_class = getattr(hf_elmo, name)
        auto_class = getattr(transformers, entry.auto_class)
        assert auto_class._model_mapping[ElmoConfig] is model_class, name
        assert model_class._auto_class == entry.auto_class and AUTO_MAP[entry.auto_class] == f"modeling_elmo.{name}"
    assert set(AUTO_MAP) == {"AutoConfig", "AutoTokenizer", *(entry.auto_class for entry in MODEL_CLASSES.values())}
