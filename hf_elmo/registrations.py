"""What `import hf_elmo` registers with transformers, each part when transformers loads what it registers with, so
that importing the package loads neither transformers' models and pipelines nor this package's:

* `AutoConfig` (`"elmo"` -> `ElmoConfig`) once `transformers.models.auto.configuration_auto` is loaded;
* `AutoTokenizer` (`ElmoConfig` -> `ElmoTokenizer`) once `tokenization_auto` is;
* each Auto class of `MODEL_CLASSES` once `modeling_auto` is: a stand-in (`ModelClassStandIn`) until
  `hf_elmo.modeling_elmo` is imported, the model class from then on;
* the pipeline tasks (`token-classification` for any model, `question-answering` for ELMo models, `elmo-*`) once
  `transformers.pipelines` is;
* `register_for_auto_class` of each class (the `auto_map` that `save_pretrained` writes) once its module is imported.

Each registration (`_PENDING`) runs once every module it needs is executed: at `install` for those already imported,
else through `AfterImport`, a finder on `sys.meta_path` that checks again right after each of those modules' code.
"""

import functools
import importlib
import importlib.abc
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs `actions[name]()` once right after module `name` is executed (by whichever finder finds it)."""

    def __init__(self, actions: dict):
        self.actions = actions

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.actions:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        action, exec_module = self.actions.pop(fullname), spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            action()

        spec.loader.exec_module = exec_then_register  # the loader instance is this module's alone
        return spec


def _elmo_config():
    return importlib.import_module(f"{__package__}.configuration_elmo").ElmoConfig


def _model_module():
    return importlib.import_module(f"{__package__}.modeling_elmo")


class ModelClassStandIn(type):
    """What an Auto class holds for an ELMo model class until `hf_elmo.modeling_elmo` is imported: any use of it
    (`from_pretrained`, `from_config`, a call, `isinstance`) imports that module and acts on the model class."""

    def __getattr__(cls, name):
        return getattr(cls.model_class(), name)

    def __call__(cls, *args, **kwargs):
        return cls.model_class()(*args, **kwargs)

    def __instancecheck__(cls, instance):
        return isinstance(instance, cls.model_class())

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, cls.model_class())

    def model_class(cls):
        return getattr(_model_module(), cls.__name__)


def _register_config():
    from transformers import AutoConfig

    AutoConfig.register("elmo", _elmo_config(), exist_ok=True)


def _register_tokenizer():
    from transformers import AutoTokenizer

    from .tokenization_elmo import ElmoTokenizer

    AutoTokenizer.register(_elmo_config(), tokenizer_class=ElmoTokenizer, exist_ok=True)


def _register_models():
    """The model classes where `hf_elmo.modeling_elmo` is imported, else their stand-ins."""
    import transformers

    from .configuration_elmo import MODEL_CLASSES

    config, module = _elmo_config(), sys.modules.get(f"{__package__}.modeling_elmo")
    loaded = module is not None and all(hasattr(module, name) for name in MODEL_CLASSES)
    for name, entry in MODEL_CLASSES.items():
        if loaded:
            model_class = getattr(module, name)
        else:
            model_class = ModelClassStandIn(
                name, (), {"config_class": config, "__module__": f"{__package__}.modeling_elmo"}
            )
        getattr(transformers, entry.auto_class).register(config, model_class, exist_ok=True)


def _register_pipelines():
    import transformers
    from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

    from .configuration_elmo import MODEL_CLASSES
    from .pipelines_elmo import (
        QuestionAnsweringPipelineForElmoModels,
        QuestionAnsweringTaskEntry,
        TokenClassificationPipelineForAnyModel,
    )

    # The built-in "token-classification" pipeline cannot read 3-D character ids: the task builds ELMo's for ELMo
    # models and the built-in one for any other (it picks its class before it loads the model).
    PIPELINE_REGISTRY.supported_tasks["token-classification"]["impl"] = TokenClassificationPipelineForAnyModel

    # transformers 5 removed "question-answering" (`pipeline()` raises a KeyError for the names in REMOVED_TASKS): the
    # task comes back for ELMo models only; any other model, or none, gets the KeyError that transformers raises.
    try:
        transformers.pipelines._resolve_deprecated_task("question-answering")
    except KeyError as removed:
        QuestionAnsweringPipelineForElmoModels.removed_task_message = removed.args[0]
        REMOVED_TASKS.pop("question-answering", None)
        PIPELINE_REGISTRY.supported_tasks["question-answering"] = QuestionAnsweringTaskEntry(
            impl=QuestionAnsweringPipelineForElmoModels, pt=(transformers.AutoModelForQuestionAnswering,), type="text"
        )

    module = _model_module()
    for name, entry in MODEL_CLASSES.items():
        model_class = getattr(module, name)
        if hasattr(model_class, "pipeline_class"):
            PIPELINE_REGISTRY.register_pipeline(
                f"elmo-{entry.pipeline_task}",
                pipeline_class=model_class.pipeline_class,
                pt_model=getattr(transformers, entry.auto_class),
                type="text",
            )


def _register_for_auto_class(module: str, name: str, *auto_class: str):
    return lambda: getattr(importlib.import_module(f"{__package__}.{module}"), name).register_for_auto_class(
        *auto_class
    )


def _models_imported():
    from .configuration_elmo import MODEL_CLASSES

    module = _model_module()
    for name, entry in MODEL_CLASSES.items():
        getattr(module, name).register_for_auto_class(entry.auto_class)


_OWN = f"{__package__}."
# Each registration: the modules it needs, each with whether it imports the module where it is not imported yet
# (only this package's; transformers' must have been loaded by whoever uses them), and what it does.
_PENDING = {
    "config": (
        {"transformers.models.auto.configuration_auto": False, f"{_OWN}configuration_elmo": True},
        _register_config,
    ),
    "config auto_map": (
        {f"{_OWN}configuration_elmo": False},
        _register_for_auto_class("configuration_elmo", "ElmoConfig"),
    ),
    "tokenizer": (
        {"transformers.models.auto.tokenization_auto": False, f"{_OWN}tokenization_elmo": True},
        _register_tokenizer,
    ),
    "tokenizer auto_map": (
        {f"{_OWN}tokenization_elmo": False},
        _register_for_auto_class("tokenization_elmo", "ElmoTokenizer", "AutoTokenizer"),
    ),
    "models": ({"transformers.models.auto.modeling_auto": False}, _register_models),
    "models auto_map": ({f"{_OWN}modeling_elmo": False}, _models_imported),
    "model classes": (
        {"transformers.models.auto.modeling_auto": False, f"{_OWN}modeling_elmo": False},
        _register_models,  # in place of the stand-ins
    ),
    "pipelines": (
        {"transformers.pipelines": False, f"{_OWN}pipelines_elmo": True, f"{_OWN}modeling_elmo": True},
        _register_pipelines,
    ),
}


def _ready(needs: dict, just_executed: str | None) -> bool:
    for name, import_it in needs.items():
        module = sys.modules.get(name)
        if name == just_executed:
            continue
        if module is None and import_it:
            continue
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False  # not loaded, or being loaded: its own completion checks again
    return True


def _register_what_is_ready(just_executed: str | None = None):
    for key, (needs, register) in list(_PENDING.items()):
        if key in _PENDING and _ready(needs, just_executed):
            del _PENDING[key]
            register()


def install():
    """Registers what can be registered now, and the rest when the modules it needs have been executed."""
    watched = {name for needs, _ in _PENDING.values() for name in needs}
    sys.meta_path.insert(0, AfterImport({name: functools.partial(_register_what_is_ready, name) for name in watched}))
    _register_what_is_ready()
