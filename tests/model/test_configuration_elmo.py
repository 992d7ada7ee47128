"""`ElmoConfig`: the presets' parameter counts, unknown presets and invalid values refused on construction, the
save/load round trip.
"""

import pytest
import torch
from transformers import AutoConfig

from hf_elmo import ElmoConfig, ElmoModel

# Published parameter counts of the released biLMs, softmax excluded (261 character rows).
PUBLISHED = {"small": 13_593_296, "medium": 28_027_728, "original": 93_600_848}


@pytest.mark.parametrize("preset", PUBLISHED)
def test_preset_parameter_count(preset):
    config = ElmoConfig.from_preset(preset)
    with torch.device("meta"):
        model = ElmoModel(config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == PUBLISHED[preset]
    assert config.hidden_size == 2 * config.projection_dim and config.num_hidden_layers == 2


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown ELMo preset 'huge'"):
        ElmoConfig.from_preset("huge")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"activation": "gelu"}, "activation must be one of"),
        ({"filters": [[1]]}, r"filters entries must be \[width, number\]"),
        ({"filters": []}, "at least one"),
        ({"filters": [[60, 4]]}, "exceeds max_characters_per_token"),
        ({"cell_clip": -1.0}, "cell_clip must be > 0 or None"),
        ({"proj_clip": 0}, "proj_clip must be > 0 or None"),
        ({"projection_dim": 0}, "projection_dim must be >= 1"),
        ({"num_layers": 0}, "num_layers must be >= 1"),
        ({"n_highway": -1}, "n_highway must be >= 0"),
        ({"n_characters": 100}, "n_characters must be >= 262"),
        ({"max_characters_per_token": 2}, "max_characters_per_token must be >= 3"),
        ({"dropout": 1.5}, r"dropout must be in \[0, 1\)"),
        ({"projection_dim": "512"}, "projection_dim"),
    ],
)
def test_invalid_values_raise_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ElmoConfig(**kwargs)


def test_save_load_round_trip(tmp_path):
    config = ElmoConfig.from_preset("small", cell_clip=None, use_skip_connections=False)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "ElmoConfig"
    drop = lambda d: {k: v for k, v in d.items() if k != "_name_or_path"}  # noqa: E731
    assert drop(loaded.to_dict()) == drop(config.to_dict())
    assert loaded.filters == [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
