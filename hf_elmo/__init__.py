"""ELMo (Peters et al., 2018) for Hugging Face transformers.

Importing the package registers the ELMo classes with the Auto classes, and marks them for remote
code so `save_pretrained` writes folders loadable with `trust_remote_code=True` without this package.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_elmo import ELMO_PRESETS, ElmoConfig
from .freed_memory import keep_freed_memory
from .modeling_elmo import ElmoBiLMOutput, ElmoForBiLM, ElmoModel, ElmoModelOutput, ElmoPreTrainedModel
from .modeling_elmo_heads import ElmoForQuestionAnswering, ElmoForSequenceClassification, ElmoForTokenClassification
from .paths import ElmoPaths
from .pipelines_elmo import (
    ElmoQuestionAnsweringPipeline,
    ElmoTokenClassificationPipeline,
    TokenClassificationPipelineForAnyModel,
)
from .scalar_mix import ScalarMix
from .tokenization_elmo import ElmoTokenizer

AutoConfig.register(ElmoConfig.model_type, ElmoConfig, exist_ok=True)
AutoModel.register(ElmoConfig, ElmoModel, exist_ok=True)
AutoModelForPreTraining.register(ElmoConfig, ElmoForBiLM, exist_ok=True)
AutoModelForSequenceClassification.register(ElmoConfig, ElmoForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(ElmoConfig, ElmoForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(ElmoConfig, ElmoForQuestionAnswering, exist_ok=True)
AutoTokenizer.register(ElmoConfig, tokenizer_class=ElmoTokenizer, exist_ok=True)

ElmoConfig.register_for_auto_class()
ElmoModel.register_for_auto_class("AutoModel")
ElmoForBiLM.register_for_auto_class("AutoModelForPreTraining")
ElmoForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
ElmoForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
ElmoForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
ElmoTokenizer.register_for_auto_class("AutoTokenizer")

# The built-in "token-classification" and "question-answering" pipelines cannot read 3-D character ids: the
# token-classification task builds ELMo's for ELMo models and the built-in one for any other (it picks its class
# before it loads the model).
PIPELINE_REGISTRY.supported_tasks["token-classification"]["impl"] = TokenClassificationPipelineForAnyModel
PIPELINE_REGISTRY.register_pipeline(
    "elmo-token-classification",
    pipeline_class=ElmoTokenClassificationPipeline,
    pt_model=AutoModelForTokenClassification,
    type="text",
)
PIPELINE_REGISTRY.register_pipeline(
    "elmo-question-answering",
    pipeline_class=ElmoQuestionAnsweringPipeline,
    pt_model=AutoModelForQuestionAnswering,
    type="text",
)

__version__ = "0.1.0"

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
