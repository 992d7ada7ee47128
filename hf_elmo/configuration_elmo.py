"""ELMo configuration."""

import math
from typing import NamedTuple

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import PreTrainedConfig

from .character_rows import MAX_CHARACTERS_PER_TOKEN
from .compute_paths import ElmoPaths
from .folder_files import read_json_object

# The released biLMs share the character CNN of the "original" model; they differ in the
# highway depth, the LSTM cell size and the projection size (bilm-tf README, "Pre-trained models").
_RELEASED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]

ELMO_PRESETS = {
    # Not a released size: "small" scaled down (256 filters, a 256-cell LSTM) so that a corpus such as the bundled
    # Shakespeare trains in minutes on a CPU; the demo's model.
    "tiny": {
        "filters": [[1, 32], [2, 32], [3, 64], [4, 64], [5, 64]],
        "n_highway": 1,
        "cell_dim": 256,
        "projection_dim": 64,
    },
    "small": {"n_highway": 1, "cell_dim": 1024, "projection_dim": 128},
    "medium": {"n_highway": 1, "cell_dim": 2048, "projection_dim": 256},
    "original": {"n_highway": 2, "cell_dim": 4096, "projection_dim": 512},
    # SeqVec (Heinzinger et al. 2019), a protein biLM with one residue per word, has the original sizes; its tiny
    # counterpart keeps the structure (7 filters of widths 1 to 7, 2 highway layers) for tests and small families.
    "seqvec": {"n_highway": 2, "cell_dim": 4096, "projection_dim": 512},
    "seqvec-tiny": {
        "filters": [[1, 8], [2, 8], [3, 8], [4, 16], [5, 16], [6, 16], [7, 32]],
        "n_highway": 2,
        "cell_dim": 64,
        "projection_dim": 16,
    },
}

ACTIVATIONS = ("relu", "tanh")


class ModelClass(NamedTuple):
    """How an ELMo model class is reached: the Auto class that builds it, its pipeline task (the model card's
    `pipeline_tag`), and whether its saved weights are sized by `num_labels` (checked before loading)."""

    auto_class: str
    pipeline_task: str
    sized_by_labels: bool = False


MODEL_CLASSES = {
    "ElmoModel": ModelClass("AutoModel", "feature-extraction"),
    "ElmoForBiLM": ModelClass("AutoModelForPreTraining", "feature-extraction"),
    "ElmoForSequenceClassification": ModelClass("AutoModelForSequenceClassification", "text-classification", True),
    "ElmoForTokenClassification": ModelClass("AutoModelForTokenClassification", "token-classification", True),
    "ElmoForQuestionAnswering": ModelClass("AutoModelForQuestionAnswering", "question-answering"),
}
"""The model classes of `modeling_elmo.py`: `AUTO_MAP`, the registrations in `hf_elmo/__init__.py`, the pipelines
named in a saved `config.json` and the model card's tag all follow this table."""
TASK_HEADS = tuple(name for name in MODEL_CLASSES if name not in ("ElmoModel", "ElmoForBiLM"))
"""The classes of `MODEL_CLASSES` that put a task on top of the biLM (what the original format and a biLM's
`model.onnx` leave out)."""


def model_class_entry(model_class: type) -> ModelClass:
    """The `MODEL_CLASSES` entry of an ELMo model class, or of the ELMo class a subclass derives from."""
    return next(MODEL_CLASSES[base.__name__] for base in model_class.__mro__ if base.__name__ in MODEL_CLASSES)


# Every class a saved folder can be loaded as with `trust_remote_code=True` (file.Class, flattened by
# `save_pretrained`); transformers itself would only list the saved object's class.
AUTO_MAP = {
    "AutoConfig": "configuration_elmo.ElmoConfig",
    "AutoTokenizer": ["tokenization_elmo.ElmoTokenizer", None],
    **{entry.auto_class: f"modeling_elmo.{name}" for name, entry in MODEL_CLASSES.items()},
}

# Stated limits on what a configuration may describe, so that a hostile or mistyped config.json cannot exhaust memory
# or time while the model is built: the released "original" biLM with its softmax has 5e8 parameters and 2 layers.
MAX_PARAMETERS = 2**31
"""Parameters (8 GiB in float32) an `ElmoConfig` may describe."""
MAX_LAYERS = 1000
"""Layers of each kind (LSTM layers, highway layers, convolutions, task-encoder layers) an `ElmoConfig` may describe."""
MAX_LABELS = 100_000
"""Labels (`num_labels`) an `ElmoConfig` may describe; each gets an entry in `id2label` as soon as it is set."""
ARCHITECTURE_FIELDS = (
    "char_embedding_dim",
    "filters",
    "n_highway",
    "activation",
    "n_characters",
    "max_characters_per_token",
    "cell_dim",
    "projection_dim",
    "num_layers",
    "cell_clip",
    "proj_clip",
    "use_skip_connections",
)
"""The fields that define the network: weights fit a config only if it agrees with theirs on all of them."""
WEIGHT_FORMAT_FIELDS = ("forget_bias", "char_vocabulary", "input_word_vocab_size", "input_word_dim", "warm_state")
"""The fields that say how a checkpoint's weights are to be read (converted weights' run-time forget bias, an
ELMoForManyLangs model's character vocabulary and word embeddings, a warm start state)."""

COMPUTE_DTYPES = ("float32", "float16", "bfloat16", "float64")
"""The dtypes a config may name (`dtype`, `torch_dtype`): those the model computes in."""
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
ELMO_PLACEMENTS = ("input", "output")
POOLINGS = ("mean", "max", "mean_max")


@strict
class ElmoConfig(PreTrainedConfig):
    r"""
    Configuration of an ELMo bidirectional language model (Peters et al., 2018).

    Args:
        char_embedding_dim (`int`, defaults to 16): size of each character embedding.
        filters (`list[list[int]]`): `[width, number]` of each character convolution; the CNN output
            has `sum(number)` features.
        n_highway (`int`, defaults to 2): highway layers after the CNN (always ReLU).
        activation (`str`, defaults to `"relu"`): `"relu"` or `"tanh"`, applied after max-pooling the
            convolutions.
        n_characters (`int`, defaults to 262): character ids, id 0 being the all-zero padding.
        max_characters_per_token (`int`, defaults to 50): character slots per word (the tokenizer's
            `max_characters_per_token`); 50 for every released model, bilm-tf's own tests train with 10.
        cell_dim (`int`, defaults to 4096): LSTM memory-cell size `D`.
        projection_dim (`int`, defaults to 512): size `P` of the token embedding and of each
            direction's projected LSTM state; every output layer is `2P` wide.
        num_layers (`int`, defaults to 2): LSTM layers per direction; the model outputs `num_layers + 1`
            layers.
        cell_clip (`float`, *optional*, defaults to 3.0): clip of the memory cell; `None` disables it.
        proj_clip (`float`, *optional*, defaults to 3.0): clip of the projected state; `None` disables it.
        use_skip_connections (`bool`, defaults to `True`): residual connection around LSTM layers >= 1.
        dropout (`float`, defaults to 0.1): dropout on each LSTM layer's input and on the top layer, in
            training only.
        vocab_size (`int`, defaults to 0): size of the word vocabulary of the LM softmax (0: no softmax).
        forget_bias (`float`, defaults to 0.0): constant added to the forget-gate pre-activation at run time, as
            TensorFlow's `LSTMCell(forget_bias=1.0)` does. Converted bilm-tf weights keep their stored bias and use
            1.0, so that exporting them gives back the original file bit for bit (folding the 1.0 into a float32
            bias would round it). A config.json without the field means 0.0: folders converted before it existed
            hold TensorFlow's 1.0 folded into their stored bias.
        char_vocabulary (`bool`, defaults to `False`): character ids come from the tokenizer's vocabulary of
            Unicode characters (ELMoForManyLangs models) instead of UTF-8 bytes; `n_characters` is then the
            vocabulary size + 1 and may be below 262.
        input_word_vocab_size (`int`, defaults to 0): rows of the word-embedding table read beside the characters
            (ELMoForManyLangs models); 0: characters only.
        input_word_dim (`int`, defaults to 0): size of those word embeddings, concatenated before the CNN features
            and projected with them.
        warm_state (`bool`, defaults to `False`): the model holds a warm start state (`ElmoModel.set_warm_state`,
            estimated by `hf-elmo warm-state`), the LSTM state every row starts from whenever no `state=` is passed;
            `False`: rows start from zeros.
        paths (`dict`, *optional*): which computation runs each part (`paths.ElmoPaths`; every field "auto" by
            default, e.g. `{"lstm": "reference"}`), same results up to float rounding. Read at each call;
            `ElmoPaths.reference()` is the plain math the fast paths are tested against.

    Task heads (`ElmoForSequenceClassification`, `ElmoForTokenClassification`, `ElmoForQuestionAnswering`; the biLM
    ignores these):
        freeze_elmo (`bool`, defaults to `True`): keep the biLM fixed (no gradients, eval mode); `False` fine-tunes it.
        elmo_dropout (`float`, defaults to 0.5): dropout on each ELMo representation.
        scalar_mix_layers (`list[int]`, *optional*): biLM layers each ScalarMix mixes (0 = character CNN);
            all `num_layers + 1` when omitted. `[num_layers]` is "top layer only".
        scalar_mix_weights (`list[float]`, *optional*): initial unnormalised weights `w`, one per mixed layer;
            zeros (equal weights) when omitted.
        scalar_mix_gamma (`float`, defaults to 1.0): initial scale `gamma`.
        scalar_mix_trainable (`bool`, defaults to `True`): `False` keeps `w` and `gamma` at their initial values.
        scalar_mix_layer_norm (`bool`, defaults to `False`): normalise each layer over the batch before mixing.
        scalar_mix_l2 (`float`, defaults to 0.0): the paper's lambda, `lambda * sum(w ** 2)` of every ScalarMix
            added to the loss.
        elmo_placement (`list[str]`, defaults to `["input"]`): where ELMo enters the task model: `"input"` (next
            to the word vectors, before the task encoder) and/or `"output"` (next to the encoder output), each
            with its own ScalarMix. `"output"` needs a task encoder.
        task_encoder_hidden_size (`int`, defaults to 0): hidden size per direction of a BiLSTM between ELMo and
            the classifier; 0: no task encoder.
        task_encoder_num_layers (`int`, defaults to 1): layers of that BiLSTM.
        word_vectors_size (`int`, defaults to 0): rows of user-supplied context-independent word vectors
            (e.g. GloVe) concatenated with ELMo at the input; 0: none. Fill them with `set_word_vectors`.
        word_vectors_dim (`int`, defaults to 0): their size.
        word_vectors_lowercase (`bool`, defaults to `False`): look words up lowercased (ASCII letters only),
            for uncased vectors.
        word_vectors_trainable (`bool`, defaults to `False`): update the word vectors during training.
        classifier_pooling (`str`, defaults to `"mean"`): sequence classification pooling over the words
            (boundaries excluded): `"mean"`, `"max"` or `"mean_max"` (both, concatenated).
        sentence_pairs (`bool`, defaults to `False`): `ElmoForSequenceClassification` classifies sentence pairs
            (`pair_input_ids`, e.g. SNLI) with ESIM's soft alignment and pooled comparison instead of pooling one
            sentence (`classifier_pooling` is then not used).
        num_softmax_samples (`int`, defaults to 8192): negative words of the sampled softmax used in training
            (`ElmoForBiLM`); 0, or at least `vocab_size`, trains with the full softmax. Evaluation always uses
            the full softmax.

    Use `ElmoConfig.from_preset("small" | "medium" | "original")` for the released sizes, `"tiny"` for a model that
    trains in minutes on a CPU. A configuration is refused (`ValueError`) if a float field is not finite, or if it
    describes more than `MAX_PARAMETERS` (2**31) parameters, more than `MAX_LAYERS` (1,000) layers of one kind, more
    than `MAX_CHARACTERS_PER_TOKEN` (1,000) slots per word or a `num_labels` outside 1 to `MAX_LABELS` (100,000).
    """

    model_type = "elmo"
    attribute_map = {"num_hidden_layers": "num_layers"}

    char_embedding_dim: int = 16
    filters: list[list[int]] | tuple = tuple(tuple(f) for f in _RELEASED_FILTERS)
    n_highway: int = 2
    activation: str = "relu"
    n_characters: int = 262
    max_characters_per_token: int = 50
    cell_dim: int = 4096
    projection_dim: int = 512
    num_layers: int = 2
    cell_clip: float | int | None = 3.0
    proj_clip: float | int | None = 3.0
    use_skip_connections: bool = True
    dropout: float | int = 0.1
    vocab_size: int = 0
    forget_bias: float | int = 0.0
    char_vocabulary: bool = False
    input_word_vocab_size: int = 0
    input_word_dim: int = 0
    warm_state: bool = False
    paths: dict | ElmoPaths | None = None
    num_softmax_samples: int = 8192
    tie_word_embeddings: bool = False

    freeze_elmo: bool = True
    elmo_dropout: float | int = 0.5
    scalar_mix_layers: list[int] | None = None
    scalar_mix_weights: list[float] | None = None
    scalar_mix_gamma: float | int = 1.0
    scalar_mix_trainable: bool = True
    scalar_mix_layer_norm: bool = False
    scalar_mix_l2: float | int = 0.0
    elmo_placement: list[str] | tuple = ("input",)
    task_encoder_hidden_size: int = 0
    task_encoder_num_layers: int = 1
    word_vectors_size: int = 0
    word_vectors_dim: int = 0
    word_vectors_lowercase: bool = False
    word_vectors_trainable: bool = False
    classifier_pooling: str = "mean"
    sentence_pairs: bool = False

    def __setattr__(self, name, value):
        if name == "paths" and isinstance(value, ElmoPaths):
            value = value.to_dict()  # config.json holds a dict
        super().__setattr__(name, value)

    def __post_init__(self, **kwargs):
        for name, value in (("dtype", self.dtype), ("torch_dtype", kwargs.get("torch_dtype"))):
            spelled = None if value is None else str(value).removeprefix("torch.")
            if spelled not in (None, "auto", *COMPUTE_DTYPES):
                raise ValueError(
                    f"ElmoConfig.{name} must name a torch dtype such as 'float32', got {spelled!r}; the model computes "
                    f"in {', '.join(COMPUTE_DTYPES)}."
                )
        labels = self.id2label
        if labels is not None and (not isinstance(labels, dict) or len(labels) > MAX_LABELS):
            got = f"{len(labels):,} labels" if isinstance(labels, dict) else repr(labels)[:100]
            raise ValueError(f"ElmoConfig.id2label must map at most {MAX_LABELS:,} label ids to names, got {got}.")
        self.filters = [list(f) for f in self.filters]
        self.paths = ElmoPaths.from_value(self.paths).to_dict()  # a dict in config.json
        self.elmo_placement = list(self.elmo_placement)
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        custom_pipelines = kwargs.get("custom_pipelines")
        if __name__ == "hf_elmo.configuration_elmo" and isinstance(custom_pipelines, dict):
            # The installed package builds ELMo's pipelines under these tasks' own names (see hf_elmo/__init__.py):
            # the saved entries are for the folder's remote code, where they would ask for trust_remote_code.
            served = ("token-classification", "question-answering")
            kwargs["custom_pipelines"] = {k: v for k, v in custom_pipelines.items() if k not in served}
            if not kwargs["custom_pipelines"]:
                del kwargs["custom_pipelines"]
        super().__post_init__(**kwargs)

    @property
    def num_labels(self) -> int | None:
        return PreTrainedConfig.num_labels.fget(self)

    @num_labels.setter
    def num_labels(self, num_labels: int):
        # Checked before transformers lays out `id2label`, one entry per label.
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or not 1 <= num_labels <= MAX_LABELS:
            raise ValueError(f"ElmoConfig.num_labels must be an int from 1 to {MAX_LABELS:,}, got {num_labels!r}.")
        PreTrainedConfig.num_labels.fset(self, num_labels)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "ElmoConfig":
        """`PreTrainedConfig.from_dict`, refusing the configuration of another kind of model (transformers only warns,
        then builds an ELMo of default sizes that fails deep inside torch)."""
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(
                f"The configuration has model_type {model_type!r}, not {cls.model_type!r}: it is not an ELMo model."
            )
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """`PreTrainedConfig.from_pretrained`, its errors naming the folder and config.json (`AutoConfig` and
        sentence-transformers reach `from_dict`'s checks through it, with nothing else to say where they were)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except ValueError as error:
            folder = str(pretrained_model_name_or_path)
            if str(error).startswith((f"{folder}: ", f"{folder}/")):  # the JSON reader's errors name the file
                raise
            raise ValueError(f"{pretrained_model_name_or_path}: config.json: {error}") from None

    @classmethod
    def _dict_from_json_file(cls, json_file):
        # transformers would fail on a JSON value that is not an object with a TypeError or AttributeError
        return cls._decode_special_floats(read_json_object(json_file, "configuration fields"))

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "ElmoConfig":
        """A configuration of one of the released sizes (`small`, `medium`, `original`) or of `tiny`."""
        if name not in ELMO_PRESETS:
            raise ValueError(f"Unknown ELMo preset {name!r}; expected one of {sorted(ELMO_PRESETS)}.")
        return cls(**{**ELMO_PRESETS[name], **kwargs})

    @property
    def num_filters(self) -> int:
        """Total number of CNN features `F`."""
        return sum(n for _, n in self.filters)

    @property
    def hidden_size(self) -> int:
        """Width `2P` of every output layer."""
        return 2 * self.projection_dim

    def parameter_counts(self) -> dict[str, int]:
        """Number of parameters of each part the configuration describes (computed, nothing is allocated)."""
        e, n_filters, P, D = self.char_embedding_dim, self.num_filters, self.projection_dim, self.cell_dim
        H, words = self.task_encoder_hidden_size, self.word_vectors_size
        task_input = (self.hidden_size if "input" in self.elmo_placement else 0) + self.word_vectors_dim
        # nn.LSTM, both directions: 4H x (input + H) weights and two 4H biases per layer; later layers read 2H
        task_encoder = 8 * H * (task_input + H + 2) + 8 * H * (3 * H + 2) * (self.task_encoder_num_layers - 1)
        return {
            "n_characters x char_embedding_dim": (self.n_characters - 1) * e,
            "filters": sum(width * e * num + num for width, num in self.filters),
            "n_highway x filters": self.n_highway * (2 * n_filters * n_filters + 2 * n_filters),
            "input_word_vocab_size x input_word_dim": self.input_word_vocab_size * self.input_word_dim,
            "filters x projection_dim": (self.input_word_dim + n_filters + 1) * P,
            "num_layers x cell_dim x projection_dim": 2 * self.num_layers * (8 * D * P + 4 * D + D * P),
            "vocab_size x projection_dim": self.vocab_size * (P + 1),
            "word_vectors_size x word_vectors_dim": (words + 1) * self.word_vectors_dim + 2 * words,
            "task_encoder_hidden_size": task_encoder,
        }

    def training_step_flops(self, rows: int, length: int, softmax_words: int, split_directions=False) -> int:
        """FLOPs (two per multiply-add) of a biLM training step on `(rows, length)` words, three times the forward's
        matrix products, every position counted: the character encoder over every character slot; per direction its
        LSTM layers and its softmax over `softmax_words`, with `split_directions` on half the rows."""
        slots, filters, P, D = self.max_characters_per_token, self.num_filters, self.projection_dim, self.cell_dim
        e = self.char_embedding_dim
        convolutions = sum(2 * width * e * count * (slots - width + 1) for width, count in self.filters)
        encoder = convolutions + self.n_highway * 2 * filters * 2 * filters + 2 * (self.input_word_dim + filters) * P
        per_direction = self.num_layers * 2 * (2 * P * 4 * D + D * P) + 2 * P * softmax_words
        direction_rows = rows // 2 if split_directions else rows
        return 3 * length * (rows * encoder + 2 * direction_rows * per_direction)

    def validate_architecture(self):
        """Raises `ValueError` naming the field for values no ELMo can be built from."""
        super().validate_architecture()
        for name in self.__dataclass_fields__:
            value = getattr(self, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise ValueError(f"ElmoConfig.{name} must be finite, got {value}.")
        for name in ("char_embedding_dim", "cell_dim", "projection_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ElmoConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.n_highway < 0:
            raise ValueError(f"ElmoConfig.n_highway must be >= 0, got {self.n_highway}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ElmoConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}.")
        ElmoPaths.from_value(self.paths)
        if self.max_characters_per_token < 3:
            raise ValueError(
                "ElmoConfig.max_characters_per_token must be >= 3 (begin of word, a character, end of word), got "
                f"{self.max_characters_per_token}."
            )
        if self.max_characters_per_token > MAX_CHARACTERS_PER_TOKEN:
            raise ValueError(
                f"ElmoConfig.max_characters_per_token is {self.max_characters_per_token:,}, more than the limit of "
                f"{MAX_CHARACTERS_PER_TOKEN:,} slots per word."
            )
        if not self.filters:
            raise ValueError("ElmoConfig.filters must list at least one [width, number] pair.")
        for f in self.filters:
            if len(f) != 2 or not all(isinstance(v, int) and v >= 1 for v in f):
                raise ValueError(f"ElmoConfig.filters entries must be [width, number] of positive ints, got {f}.")
            if f[0] > self.max_characters_per_token:
                raise ValueError(
                    f"ElmoConfig.filters width {f[0]} exceeds max_characters_per_token={self.max_characters_per_token}."
                )
        if self.char_vocabulary and self.n_characters < 2:
            raise ValueError(
                f"ElmoConfig.n_characters must be >= 2 (padding + one character), got {self.n_characters}."
            )
        if not self.char_vocabulary and self.n_characters < 262:
            raise ValueError(
                f"ElmoConfig.n_characters must be >= 262 (UTF-8 bytes + specials), got {self.n_characters}."
            )
        if self.char_vocabulary and self.max_characters_per_token != 50:
            raise ValueError(
                "ElmoConfig.max_characters_per_token must be 50 with a character vocabulary (ELMoForManyLangs), got "
                f"{self.max_characters_per_token}."
            )
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ElmoConfig.{name} must be > 0 or None (no clipping), got {value}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ElmoConfig.dropout must be in [0, 1), got {self.dropout}.")
        if self.vocab_size < 0:
            raise ValueError(f"ElmoConfig.vocab_size must be >= 0, got {self.vocab_size}.")
        if self.num_softmax_samples < 0:
            raise ValueError(f"ElmoConfig.num_softmax_samples must be >= 0, got {self.num_softmax_samples}.")
        if self.input_word_vocab_size < 0 or self.input_word_dim < 0:
            raise ValueError(
                f"ElmoConfig.input_word_vocab_size and input_word_dim must be >= 0, got "
                f"{self.input_word_vocab_size} and {self.input_word_dim}."
            )
        if (self.input_word_vocab_size > 0) != (self.input_word_dim > 0):
            raise ValueError(
                f"ElmoConfig.input_word_vocab_size ({self.input_word_vocab_size}) and input_word_dim "
                f"({self.input_word_dim}) must both be 0 (no word embeddings) or both be > 0."
            )
        layers = {
            "num_layers": self.num_layers,
            "n_highway": self.n_highway,
            "filters": len(self.filters),
            "task_encoder_num_layers": self.task_encoder_num_layers,
        }
        for name, count in layers.items():
            if count > MAX_LAYERS:
                raise ValueError(
                    f"ElmoConfig.{name} describes {count:,} layers, more than the limit of {MAX_LAYERS:,}."
                )
        counts = self.parameter_counts()
        if sum(counts.values()) > MAX_PARAMETERS:
            largest = max(counts, key=counts.get)
            raise ValueError(
                f"ElmoConfig describes {sum(counts.values()):.3g} parameters, more than the limit of 2**31 "
                f"({largest}: {counts[largest]:.3g}); check those sizes."
            )

    def validate_task_heads(self):
        """Raises `ValueError` naming the field for head options no task model can be built from."""
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(
                f"ElmoConfig.problem_type must be one of {PROBLEM_TYPES} or None, got {self.problem_type!r}."
            )
        if not 0.0 <= self.elmo_dropout < 1.0:
            raise ValueError(f"ElmoConfig.elmo_dropout must be in [0, 1), got {self.elmo_dropout}.")
        if self.scalar_mix_layers is not None:
            if not self.scalar_mix_layers or len(set(self.scalar_mix_layers)) != len(self.scalar_mix_layers):
                raise ValueError(
                    f"ElmoConfig.scalar_mix_layers must list distinct layers, got {self.scalar_mix_layers}."
                )
            if not all(0 <= layer <= self.num_layers for layer in self.scalar_mix_layers):
                raise ValueError(
                    f"ElmoConfig.scalar_mix_layers must be in [0, {self.num_layers}] (0 = character CNN), "
                    f"got {self.scalar_mix_layers}."
                )
        mixed = len(self.scalar_mix_layers) if self.scalar_mix_layers is not None else self.num_layers + 1
        if self.scalar_mix_weights is not None and len(self.scalar_mix_weights) != mixed:
            raise ValueError(
                f"ElmoConfig.scalar_mix_weights needs one value per mixed layer ({mixed}), "
                f"got {self.scalar_mix_weights}."
            )
        if self.scalar_mix_l2 < 0:
            raise ValueError(f"ElmoConfig.scalar_mix_l2 must be >= 0, got {self.scalar_mix_l2}.")
        placement = self.elmo_placement
        if not placement or len(set(placement)) != len(placement) or not set(placement) <= set(ELMO_PLACEMENTS):
            raise ValueError(
                f"ElmoConfig.elmo_placement must be distinct entries of {ELMO_PLACEMENTS}, got {placement}."
            )
        if self.task_encoder_hidden_size < 0 or self.task_encoder_num_layers < 1:
            raise ValueError(
                "ElmoConfig.task_encoder_hidden_size must be >= 0 and task_encoder_num_layers >= 1, got "
                f"{self.task_encoder_hidden_size} and {self.task_encoder_num_layers}."
            )
        if "output" in placement and not self.task_encoder_hidden_size:
            raise ValueError("ElmoConfig.elmo_placement 'output' needs a task encoder (task_encoder_hidden_size > 0).")
        if "input" not in placement and not self.word_vectors_size:
            raise ValueError(
                "ElmoConfig.elmo_placement without 'input' leaves the task encoder no input: add 'input' or word "
                "vectors (word_vectors_size, word_vectors_dim)."
            )
        sizes = (self.word_vectors_size, self.word_vectors_dim)
        if min(sizes) < 0 or (sizes[0] > 0) != (sizes[1] > 0):
            raise ValueError(
                "ElmoConfig.word_vectors_size and word_vectors_dim must both be positive (word vectors) or both 0, "
                f"got {self.word_vectors_size} and {self.word_vectors_dim}."
            )
        if self.word_vectors_size and self.char_vocabulary:
            raise ValueError(
                "ElmoConfig.word_vectors_size: word vectors are found from the UTF-8 byte rows of the words, but this "
                "model reads a character vocabulary (a conversion from ELMoForManyLangs); use word_vectors_size=0."
            )
        if self.classifier_pooling not in POOLINGS:
            raise ValueError(
                f"ElmoConfig.classifier_pooling must be one of {POOLINGS}, got {self.classifier_pooling!r}."
            )


def _one_line_value_errors(cls):
    """huggingface_hub's strict dataclass reports a field of the wrong type, and wraps a validator's `ValueError`, in
    errors of its own over several lines: both become the one-line `ValueError` naming the field that the rest of the
    package raises."""
    strict_validate, strict_setattr = cls.validate, cls.__setattr__

    def validate(self):
        try:
            strict_validate(self)
        except StrictDataclassClassValidationError as error:
            raise ValueError(" ".join(str(error.__cause__).split())) from None

    def __setattr__(self, name, value):
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError:
            expected = cls.__dataclass_fields__[name].type
            expected = expected.__name__ if type(expected) is type else str(expected)
            raise ValueError(f"{cls.__name__}.{name} must be {expected}, got {value!r:.100}.") from None

    validate.__is_defined_by_strict_decorator__ = True  # strict subclasses may replace it, as they would its own
    cls.validate, cls.__setattr__ = validate, __setattr__
    return cls


_one_line_value_errors(ElmoConfig)


__all__ = [
    "ARCHITECTURE_FIELDS",
    "ELMO_PRESETS",
    "MODEL_CLASSES",
    "ElmoConfig",
    "WEIGHT_FORMAT_FIELDS",
    "model_class_entry",
]
