"""How ELMo models are read from and written to folders: the policy every ELMo model class shares.

`ElmoPreTrainedModel.from_pretrained` is `load_pretrained`:

* weights load only from safetensors unless `use_safetensors=False` is passed: a pickle checkpoint
  (`pytorch_model.bin`) is a program that runs while it is read; transformers restricts it with `weights_only`,
  but that unpickler has had escapes;
* a model with a classifier (`has_classifier`) refuses up front to load a saved classifier into a different number
  of labels (transformers only logs the shapes), unless `ignore_mismatched_sizes=True`;
* loaded parameters are copied to 64-byte aligned memory (see `align_parameters`).

`ElmoPreTrainedModel.save_pretrained` ends with `name_pipeline`: a model class with a `pipeline_class` (for its
`pipeline_task`) writes it into the folder's `config.json` as `custom_pipelines`, so that `pipeline(task,
model=folder, trust_remote_code=True)` uses it (its module, imported by the model's, is saved with the remote
code). `load_model_folder` is how the commands read a model folder.
"""

import glob
import json
import os
from pathlib import Path

from transformers import PreTrainedConfig
from transformers.utils import CONFIG_NAME
from transformers.utils import logging as hf_logging

from .file_io import ElmoInputError, write_atomically

_PICKLE_REFUSED = (
    "ELMo loads weights only from safetensors by default, because a pickle checkpoint (pytorch_model.bin) can run "
    "code hidden in it while loading. If you trust its origin, pass use_safetensors=False explicitly."
)
_HUB_KEYS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
_AUTO_CLASS_OF_TASK = {"token-classification": "AutoModelForTokenClassification"}


def load_pretrained(load, cls, pretrained_model_name_or_path, *model_args, use_safetensors=None, **kwargs):
    """`load(...)` (`PreTrainedModel.from_pretrained` of `cls`) with the policy of the module docstring."""
    if use_safetensors is None:
        _refuse_pickle_checkpoints(str(pretrained_model_name_or_path), kwargs.get("subfolder", ""))
    if cls.has_classifier and not kwargs.get("ignore_mismatched_sizes"):
        _check_saved_classifier(cls, pretrained_model_name_or_path, kwargs)
    try:
        safetensors_only = use_safetensors is not False
        loaded = load(pretrained_model_name_or_path, *model_args, use_safetensors=safetensors_only, **kwargs)
    except OSError as error:
        # a Hub repo without safetensors: transformers' hint ("do not set use_safetensors=True") misleads
        if use_safetensors is not None or "use_safetensors" not in str(error):
            raise
        raise OSError(f"{pretrained_model_name_or_path}: {_PICKLE_REFUSED}") from None
    align_parameters(loaded[0] if isinstance(loaded, tuple) else loaded)
    return loaded


def _refuse_pickle_checkpoints(path: str, subfolder: str):
    folder = os.path.join(path, subfolder)
    only_pickles = os.path.isdir(folder) and not glob.glob(os.path.join(folder, "*.safetensors*"))
    if (os.path.isfile(path) and not path.endswith(".safetensors")) or (
        only_pickles and glob.glob(os.path.join(folder, "*.bin"))
    ):
        raise OSError(f"{path}: {_PICKLE_REFUSED}")


def _check_saved_classifier(cls, pretrained_model_name_or_path, kwargs: dict):
    config = kwargs.get("config")
    if isinstance(config, PreTrainedConfig):  # the Auto classes pass the config they built from the kwargs
        requested = config.num_labels
    else:
        requested = len(kwargs["id2label"]) if kwargs.get("id2label") else kwargs.get("num_labels")
    if requested is None:
        return
    saved, _ = cls.config_class.get_config_dict(
        pretrained_model_name_or_path, **{key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
    )
    saved_labels = len(saved["id2label"]) if saved.get("id2label") else saved.get("num_labels", 2)
    heads = {"ElmoForSequenceClassification", "ElmoForTokenClassification"}
    if heads & set(saved.get("architectures") or []) and saved_labels != requested:
        raise ValueError(
            f"{pretrained_model_name_or_path} holds a classifier for {saved_labels} labels but {requested} "
            "labels were requested. Load it without num_labels/id2label to keep its classifier, or pass "
            f"ignore_mismatched_sizes=True to replace the classifier with a new one for {requested} labels."
        )


def align_parameters(model):
    """Copies parameters and buffers that are not 64-byte aligned.

    Weights read from safetensors are views into the mapped file at offsets that need not be aligned, and some CPU
    kernels (nn.LSTM's) round differently on such memory: copying them makes a reloaded model compute bit for bit
    what the saved one did.
    """
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.data_ptr() % 64:
            tensor.data = tensor.data.clone()


def name_pipeline(model, save_directory):
    """Writes `custom_pipelines` for the model's `pipeline_class` into the saved `config.json` (see the module
    docstring); the in-memory config is left as it is."""
    pipeline_class = getattr(model, "pipeline_class", None)
    config_file = Path(save_directory) / CONFIG_NAME
    if pipeline_class is None or not config_file.is_file():
        return
    values = json.loads(config_file.read_text(encoding="utf-8"))
    values["custom_pipelines"] = {
        model.pipeline_task: {
            "impl": f"{pipeline_class.__module__.rsplit('.', 1)[-1]}.{pipeline_class.__name__}",
            "pt": [_AUTO_CLASS_OF_TASK[model.pipeline_task]],
            "type": "text",
        }
    }
    write_atomically(config_file, json.dumps(values, indent=2, sort_keys=True) + "\n")


def load_model_folder(model_class, folder):
    """`model_class.from_pretrained(folder)` in eval mode for a command: a missing or damaged folder is a one-line
    `ElmoInputError`, and a checkpoint that lacks some of the model's weights is refused (transformers would fill
    them with random values)."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise ElmoInputError(
            f"{folder}: no config.json (expected a folder written by hf-elmo convert or save_pretrained)"
        )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per load is noise in a command's output
    try:
        model, info = model_class.from_pretrained(folder, output_loading_info=True)
    except Exception as error:  # transformers, safetensors and json each raise their own kinds
        message = " ".join(str(error).split()) or type(error).__name__
        raise ElmoInputError(f"{folder}: cannot load the model ({message})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    problems = info.get("missing_keys") or info.get("mismatched_keys")
    if problems:
        raise ElmoInputError(f"{folder}: the weights lack or mis-size {sorted(map(str, problems))[:5]}")
    return model.eval()


__all__ = ["align_parameters", "load_model_folder", "load_pretrained", "name_pipeline"]
