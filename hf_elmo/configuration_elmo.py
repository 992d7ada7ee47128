"""ELMo configuration."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# The released biLMs share the character CNN of the "original" model; they differ in the
# highway depth, the LSTM cell size and the projection size (bilm-tf README, "Pre-trained models").
_RELEASED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]

ELMO_PRESETS = {
    "small": {"n_highway": 1, "cell_dim": 1024, "projection_dim": 128},
    "medium": {"n_highway": 1, "cell_dim": 2048, "projection_dim": 256},
    "original": {"n_highway": 2, "cell_dim": 4096, "projection_dim": 512},
}

ACTIVATIONS = ("relu", "tanh")

# Every class a saved folder can be loaded as with `trust_remote_code=True` (file.Class, flattened by
# `save_pretrained`); transformers itself would only list the saved object's class.
AUTO_MAP = {
    "AutoConfig": "configuration_elmo.ElmoConfig",
    "AutoModel": "modeling_elmo.ElmoModel",
    "AutoModelForPreTraining": "modeling_elmo.ElmoForBiLM",
    "AutoTokenizer": ["tokenization_elmo.ElmoTokenizer", None],
}


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
        max_characters_per_token (`int`, defaults to 50): character slots per word.
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
        num_softmax_samples (`int`, defaults to 8192): negative words of the sampled softmax used in training
            (`ElmoForBiLM`); 0, or at least `vocab_size`, trains with the full softmax. Evaluation always uses
            the full softmax.

    Use `ElmoConfig.from_preset("small" | "medium" | "original")` for the released sizes.
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
    num_softmax_samples: int = 8192
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        self.filters = [list(f) for f in self.filters]
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "ElmoConfig":
        """A configuration of one of the released sizes (`small`, `medium`, `original`)."""
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

    def validate_architecture(self):
        """Raises `ValueError` naming the field for values no ELMo can be built from."""
        super().validate_architecture()
        for name in ("char_embedding_dim", "cell_dim", "projection_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ElmoConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.n_highway < 0:
            raise ValueError(f"ElmoConfig.n_highway must be >= 0, got {self.n_highway}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ElmoConfig.activation must be one of {ACTIVATIONS}, got {self.activation!r}.")
        if not self.filters:
            raise ValueError("ElmoConfig.filters must list at least one [width, number] pair.")
        for f in self.filters:
            if len(f) != 2 or not all(isinstance(v, int) and v >= 1 for v in f):
                raise ValueError(f"ElmoConfig.filters entries must be [width, number] of positive ints, got {f}.")
            if f[0] > self.max_characters_per_token:
                raise ValueError(
                    f"ElmoConfig.filters width {f[0]} exceeds max_characters_per_token={self.max_characters_per_token}."
                )
        if self.n_characters < 262:
            raise ValueError(f"ElmoConfig.n_characters must be >= 262 (UTF-8 bytes + specials), got {self.n_characters}.")
        if self.max_characters_per_token != 50:
            raise ValueError(
                f"ElmoConfig.max_characters_per_token must be 50 (fixed by the character mapper), "
                f"got {self.max_characters_per_token}."
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


__all__ = ["ElmoConfig", "ELMO_PRESETS"]
