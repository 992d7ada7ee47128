"""transformers' own common tests (`ModelTesterMixin`, `ConfigTester`, `TokenizerTesterMixin`) for the ELMo classes,
run by hand: pip's sdist of transformers ships its `tests/test_*_common.py` but not the modules they import, so
they cannot run in CI. Not collected by the suite (its name does not start with `test_`). docs/testing.md lists
the results and the tests that cannot apply to a character-level LSTM.

    version=$(.venv/bin/python -c "import transformers; print(transformers.__version__)")
    .venv/bin/pip download "transformers==$version" --no-binary :all: --no-deps -d /tmp/tf && cd /tmp/tf
    tar xzf transformers-$version.tar.gz && cd transformers-$version && touch tests/__init__.py
    mkdir -p tests/exporters tests/generation tests/utils tests/fixtures
    touch tests/exporters/__init__.py tests/generation/__init__.py tests/utils/__init__.py
    echo "class ExportTesterMixin: pass" > tests/exporters/test_export.py   # not in the sdist
    echo "class GenerationTesterMixin: pass" > tests/generation/test_utils.py   # ELMo does not generate
    echo 'config_common_kwargs = {"return_dict": False, "output_hidden_states": True, "output_attentions": True,
      "dtype": "float16", "chunk_size_feed_forward": 5, "architectures": ["BertModel"], "id2label": {0: "label"},
      "label2id": {"label": "0"}, "problem_type": "regression"}' > tests/utils/test_configuration_utils.py
    head -c 3000 $PROJECT/data/tinyshakespeare/input.txt > tests/fixtures/sample_text.txt
    cp $PROJECT/tests/transformers_common_suite.py tests/test_elmo_common.py
    $PROJECT/.venv/bin/pip install parameterized
    $PROJECT/.venv/bin/python -m pytest -q -n 0 tests/test_elmo_common.py -rA --tb=line -W ignore

(`$PROJECT` the project's checkout; `config_common_kwargs` is a value other than the default for each common field
of `PreTrainedConfig`, which the repository's own file gives.)
"""

import unittest

import torch

from hf_elmo import (
    ElmoConfig,
    ElmoForBiLM,
    ElmoForQuestionAnswering,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoTokenizer,
)

from .test_configuration_common import ConfigTester
from .test_modeling_common import ModelTesterMixin
from .test_tokenization_common import TokenizerTesterMixin

WORDS = [["The", "cat", "sat", "on", "the", "mat"], ["A", "dog", "ran"], ["Hi"], ["Über", "naïve", "words", "."]]


class ElmoModelTester:
    batch_size = 4
    seq_length = 8
    num_hidden_layers = 2
    num_attention_heads = 1
    hidden_size = 12
    is_training = True

    def __init__(self, parent):
        self.parent = parent

    def get_config(self):
        return ElmoConfig(
            char_embedding_dim=4,
            filters=[[1, 4], [2, 6]],
            n_highway=1,
            cell_dim=12,
            projection_dim=6,
            num_layers=2,
            num_labels=3,
            vocab_size=20,
            freeze_elmo=False,
        )

    def prepare_config_and_inputs_for_common(self):
        encoded = ElmoTokenizer()(WORDS, is_split_into_words=True, padding=True, return_tensors="pt")
        return self.get_config(), {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


class ElmoModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (
        ElmoModel,
        ElmoForBiLM,
        ElmoForSequenceClassification,
        ElmoForTokenClassification,
        ElmoForQuestionAnswering,
    )
    has_attentions = False
    test_resize_embeddings = False
    test_torch_exportable = False

    def setUp(self):
        self.model_tester = ElmoModelTester(self)
        self.config_tester = ConfigTester(self, config_class=ElmoConfig, has_text_modality=False, common_properties=[])

    def test_config(self):
        self.config_tester.run_common_tests()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels=False)
        if return_labels:
            mask = inputs["attention_mask"]
            B, T = mask.shape
            if model_class is ElmoForSequenceClassification:
                inputs["labels"] = torch.tensor([0, 1, 2, 1])
            elif model_class is ElmoForTokenClassification:
                labels = torch.randint(0, 3, (B, T), generator=torch.Generator().manual_seed(0)).masked_fill(
                    mask == 0, -100
                )
                labels[:, 0] = -100
                labels[torch.arange(B), mask.sum(1) - 1] = -100
                inputs["labels"] = labels
            elif model_class is ElmoForBiLM:
                inputs["labels"] = torch.randint(
                    3, 20, (B, T, 2), generator=torch.Generator().manual_seed(0)
                ).masked_fill(mask[..., None] == 0, -100)
            elif model_class is ElmoForQuestionAnswering:
                q = ElmoTokenizer()(
                    [["Who", "sat", "?"]] * B, is_split_into_words=True, padding=True, return_tensors="pt"
                )
                inputs = {
                    "input_ids": q["input_ids"],
                    "attention_mask": q["attention_mask"],
                    "pair_input_ids": inputs["input_ids"],
                    "pair_attention_mask": inputs["attention_mask"],
                    "start_positions": torch.tensor([1, 1, 1, 1]),
                    "end_positions": torch.tensor([2, 2, 1, 2]),
                }
        elif model_class is ElmoForQuestionAnswering:
            q = ElmoTokenizer()([["Who", "sat", "?"]] * 4, is_split_into_words=True, padding=True, return_tensors="pt")
            inputs = {
                "input_ids": q["input_ids"],
                "attention_mask": q["attention_mask"],
                "pair_input_ids": inputs["input_ids"],
                "pair_attention_mask": inputs["attention_mask"],
            }
        return inputs


class ElmoTokenizationTest(TokenizerTesterMixin, unittest.TestCase):
    tokenizer_class = ElmoTokenizer
    test_seq2seq = False
    from_pretrained_id = []

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        ElmoTokenizer().save_pretrained(cls.tmpdirname)
        cls.from_pretrained_id = [cls.tmpdirname]
        cls.tokenizers_list = [(ElmoTokenizer, cls.tmpdirname, {})]
