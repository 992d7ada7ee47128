"""ELMo (Peters et al., 2018) for Hugging Face transformers.

Importing the package registers the ELMo classes with the Auto classes and the pipeline tasks, and marks them for
remote code so `save_pretrained` writes folders loadable with `trust_remote_code=True` without this package. Each
registration happens when transformers loads what it registers with, and the names below are imported at first use
(`registrations`): the import itself loads neither transformers' models and pipelines nor this package's.
"""

import importlib

from .registrations import install

# Each public name and the module that defines it.
_PUBLIC = {
    "ELMO_PRESETS": "configuration_elmo",
    "ElmoConfig": "configuration_elmo",
    "ElmoPaths": "compute_paths",
    "ElmoBiLMOutput": "modeling_elmo",
    "ElmoForBiLM": "modeling_elmo",
    "ElmoForQuestionAnswering": "modeling_elmo",
    "ElmoForSequenceClassification": "modeling_elmo",
    "ElmoForTokenClassification": "modeling_elmo",
    "ElmoModel": "modeling_elmo",
    "ElmoModelOutput": "modeling_elmo",
    "ElmoPreTrainedModel": "modeling_elmo",
    "ElmoQuestionAnsweringPipeline": "pipelines_elmo",
    "ElmoTokenClassificationPipeline": "pipelines_elmo",
    "ElmoTokenizer": "tokenization_elmo",
    "ScalarMix": "scalar_mix",
    "keep_freed_memory": "training.freed_memory",
}


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_PUBLIC])


install()

__version__ = "0.2.0.dev0"

__all__ = sorted(_PUBLIC)
