"""ELMo (Peters et al., 2018) for Hugging Face transformers.

Importing the package registers the ELMo classes with the Auto classes, and marks them for remote
code so `save_pretrained` writes folders loadable with `trust_remote_code=True` without this package.
"""

import transformers
from transformers import AutoConfig, AutoTokenizer
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

from .compute_paths import ElmoPaths
from .configuration_elmo import ELMO_PRESETS, MODEL_CLASSES, ElmoConfig
from .modeling_elmo import (
    ElmoBiLMOutput,
    ElmoForBiLM,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoModelOutput,
    ElmoPreTrainedModel,
)
from .pipelines_elmo import (
    ElmoQuestionAnsweringPipeline,
    ElmoTokenClassificationPipeline,
    QuestionAnsweringPipelineForElmoModels,
    QuestionAnsweringTaskEntry,
    TokenClassificationPipelineForAnyModel,
)
from .scalar_mix import ScalarMix
from .tokenization_elmo import ElmoTokenizer
from .training.freed_memory import keep_freed_memory

AutoConfig.register(ElmoConfig.model_type, ElmoConfig, exist_ok=True)
AutoTokenizer.register(ElmoConfig, tokenizer_class=ElmoTokenizer, exist_ok=True)
ElmoConfig.register_for_auto_class()
ElmoTokenizer.register_for_auto_class("AutoTokenizer")

# The built-in "token-classification" pipeline cannot read 3-D character ids: the task builds ELMo's for ELMo models and
# the built-in one for any other (it picks its class before it loads the model).
PIPELINE_REGISTRY.supported_tasks["token-classification"]["impl"] = TokenClassificationPipelineForAnyModel

# transformers 5 removed "question-answering" (`pipeline()` raises a KeyError for the names in REMOVED_TASKS): the task
# comes back for ELMo models only; any other model, or none, gets the KeyError that transformers raises.
try:
    transformers.pipelines._resolve_deprecated_task("question-answering")
except KeyError as removed:
    QuestionAnsweringPipelineForElmoModels.removed_task_message = removed.args[0]
    REMOVED_TASKS.pop("question-answering", None)
    PIPELINE_REGISTRY.supported_tasks["question-answering"] = QuestionAnsweringTaskEntry(
        impl=QuestionAnsweringPipelineForElmoModels, pt=(transformers.AutoModelForQuestionAnswering,), type="text"
    )

for _name, _entry in MODEL_CLASSES.items():
    _model_class, _auto_class = globals()[_name], getattr(transformers, _entry.auto_class)
    _auto_class.register(ElmoConfig, _model_class, exist_ok=True)
    _model_class.register_for_auto_class(_entry.auto_class)
    if hasattr(_model_class, "pipeline_class"):
        PIPELINE_REGISTRY.register_pipeline(
            f"elmo-{_entry.pipeline_task}",
            pipeline_class=_model_class.pipeline_class,
            pt_model=_auto_class,
            type="text",
        )
del _name, _entry, _model_class, _auto_class

__version__ = "0.2.0.dev0"

__all__ = [
    "ELMO_PRESETS",
    "ElmoBiLMOutput",
    "ElmoConfig",
    "ElmoForBiLM",
    "ElmoForQuestionAnswering",
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoModel",
    "ElmoModelOutput",
    "ElmoPaths",
    "ElmoPreTrainedModel",
    "ElmoQuestionAnsweringPipeline",
    "ElmoTokenClassificationPipeline",
    "ElmoTokenizer",
    "ScalarMix",
    "keep_freed_memory",
]
