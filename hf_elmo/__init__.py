"""ELMo (Peters et al., 2018) for Hugging Face transformers.

Importing the package registers the ELMo classes with the Auto classes, and marks them for remote
code so `save_pretrained` writes folders loadable with `trust_remote_code=True` without this package.
"""

from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoTokenizer

from .configuration_elmo import ELMO_PRESETS, ElmoConfig
from .modeling_elmo import ElmoBiLMOutput, ElmoForBiLM, ElmoModel, ElmoModelOutput, ElmoPreTrainedModel
from .tokenization_elmo import ElmoTokenizer

AutoConfig.register(ElmoConfig.model_type, ElmoConfig, exist_ok=True)
AutoModel.register(ElmoConfig, ElmoModel, exist_ok=True)
AutoModelForPreTraining.register(ElmoConfig, ElmoForBiLM, exist_ok=True)
AutoTokenizer.register(ElmoConfig, tokenizer_class=ElmoTokenizer, exist_ok=True)

ElmoConfig.register_for_auto_class()
ElmoModel.register_for_auto_class("AutoModel")
ElmoForBiLM.register_for_auto_class("AutoModelForPreTraining")
ElmoTokenizer.register_for_auto_class("AutoTokenizer")

__version__ = "0.1.0"

__all__ = [
    "ELMO_PRESETS",
    "ElmoBiLMOutput",
    "ElmoConfig",
    "ElmoForBiLM",
    "ElmoModel",
    "ElmoModelOutput",
    "ElmoPreTrainedModel",
    "ElmoTokenizer",
]
