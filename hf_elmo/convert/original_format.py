"""The original ELMo format (bilm-tf / AllenNLP `options.json` + `weights.hdf5`), read and written: the options
<-> `ElmoConfig` and the one two-way weight mapping (`weight_links`) that `hf-elmo convert`, `hf-elmo export`, the
bilm-tf checkpoint converter, `embed --options`, the compat layers and training use.

Mapping (see the spec of the reference implementations):
- `char_embed` `(n_characters - 1, e)`: as is; the zero row for id 0 is implicit in `ElmoCharacterEmbedding`.
- `CNN/W_cnn_i` `(1, w, e, n)` -> Conv1d weight `(n, e, w)`; TF's conv2d is a cross-correlation like Conv1d.
- `CNN_high_k`: TF computes `c * relu(x W_t + b_t) + (1 - c) * x` with `c = sigmoid(x W_c + b_c)`; our gate
  `g = 1 - c = sigmoid(-x W_c - b_c)`, so the weight is `[W_t^T; -W_c^T]` and the bias `[b_t; -b_c]`.
- `CNN_proj/W_proj` `(F, P)` -> Linear weight `(P, F)`; absent in bilm-tf files where `F == P`: identity.
- `RNN_d/.../CellL/LSTMCell/W_0` `(2P, 4D)`: transposed, columns `[0, P)` act on the input and `[P, 2P)` on the
  state; TF's gate blocks `[i, j, f, o]` become `[i, f, j, o]`. `B`: copied; TF adds a constant forget bias of 1.0
  that is not stored, so the config gets `forget_bias=1.0` (added at run time, which keeps export bit exact).
  `W_P_0` `(D, P)` -> `(P, D)`.
- `lstm.cell_clip` / `lstm.proj_clip` of 0 or null mean no clipping (AllenNLP's reading).
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..configuration_elmo import ElmoConfig
from ..io.files import ElmoInputError, checked_config, checked_filters, json_field, read_json_object
from ..modeling_elmo import ElmoModel

TF_FORGET_BIAS = 1.0
CELL_PATH = "RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def load_options(path: str | os.PathLike) -> dict:
    """Reads `options.json`."""
    return read_json_object(path, "options file")


def config_from_options(options: dict, source: str = "options.json") -> ElmoConfig:
    """The `ElmoConfig` described by an original `options.json` dictionary."""

    def number(path, kind=int, default=KeyError):
        value = json_field(options, path, source, default)
        if value is None or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool)):
            if value is not None and not math.isfinite(value):
                raise ElmoInputError(f"{source}: field '{path}' must be a finite number, got {value!r}")
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ElmoInputError(f"{source}: field '{path}' must be a {kind.__name__}, got {value!r}")

    activation = json_field(options, "char_cnn.activation", source)
    if activation not in ("relu", "tanh"):
        raise ElmoInputError(f"{source}: char_cnn.activation must be 'relu' or 'tanh', got {activation!r}")
    filters = checked_filters(json_field(options, "char_cnn.filters", source), "char_cnn.filters", source)
    max_chars = number("char_cnn.max_characters_per_token", default=50)
    # bilm-tf trains with 261 characters and infers with 262; the weight file is the same.
    n_characters = number("char_cnn.n_characters", default=262)
    if n_characters not in (261, 262):
        raise ElmoInputError(
            f"{source}: char_cnn.n_characters must be 261 or 262 (UTF-8 bytes and the special characters), "
            f"got {n_characters}"
        )
    skip = json_field(options, "lstm.use_skip_connections", source, default=False)
    if not isinstance(skip, bool):
        raise ElmoInputError(f"{source}: lstm.use_skip_connections must be true or false, got {skip!r}")
    return checked_config(
        ElmoConfig,
        source,
        char_embedding_dim=number("char_cnn.embedding.dim"),
        filters=filters,
        n_highway=number("char_cnn.n_highway"),
        activation=activation,
        n_characters=262,
        max_characters_per_token=max_chars,
        cell_dim=number("lstm.dim"),
        projection_dim=number("lstm.projection_dim"),
        num_layers=number("lstm.n_layers"),
        cell_clip=number("lstm.cell_clip", float, default=None) or None,
        proj_clip=number("lstm.proj_clip", float, default=None) or None,
        use_skip_connections=skip,
        forget_bias=TF_FORGET_BIAS,
    )


class _WeightReader:
    """Reads datasets from the HDF5 file, checking each against the shape the options imply."""

    def __init__(self, h5file, source: str):
        self.h5file = h5file
        self.source = source
        self.used = set()

    def read(self, name: str, shape: tuple, why: str) -> torch.Tensor:
        dataset = self.h5file.get(name)
        if dataset is None or not hasattr(dataset, "shape"):
            raise ElmoInputError(f"{self.source}: missing dataset '{name}' ({why})")
        if tuple(dataset.shape) != tuple(shape):
            raise ElmoInputError(
                f"{self.source}: dataset '{name}' has shape {tuple(dataset.shape)}, expected {tuple(shape)} ({why})"
            )
        if dataset.dtype.kind != "f":
            raise ElmoInputError(f"{self.source}: dataset '{name}' has dtype {dataset.dtype}, expected float")
        try:
            array = np.asarray(dataset[...], dtype=np.float32)
        except OSError as error:
            raise ElmoInputError(f"{self.source}: cannot read dataset '{name}' ({error})") from None
        if not np.isfinite(array).all():
            raise ElmoInputError(f"{self.source}: dataset '{name}' contains NaN or infinite values")
        self.used.add(name)
        return torch.from_numpy(array)


def _swap_tf_gate_blocks(tensor: torch.Tensor, cell_dim: int) -> torch.Tensor:
    """Rows in TF's `[i, j, f, o]` block order <-> `[i, f, j, o]` (the swap is its own inverse)."""
    i, j, f, o = tensor.split(cell_dim, dim=0)
    return torch.cat([i, f, j, o], dim=0)


@dataclass(frozen=True)
class WeightLink:
    """Some datasets of the original weight file <-> some `ElmoModel` parameters, converted both ways.

    `to_model(*datasets)` returns the parameters in `keys` order and `to_original(*parameters)` the datasets in
    `datasets` order; the two are exact inverses (only transposes, negations, reorders and additions of 0).
    """

    datasets: dict[str, tuple[int, ...]]  # name -> shape
    keys: tuple[str, ...]
    to_model: Callable[..., tuple[torch.Tensor, ...]]
    to_original: Callable[..., tuple[torch.Tensor, ...]]
    why: str  # the options the shapes follow from, for error messages
    when_absent: Callable[[], tuple[torch.Tensor, ...]] | None = None  # parameters if no dataset is in the file


def weight_links(config: ElmoConfig) -> list[WeightLink]:
    """The whole mapping between an original weight file and `ElmoModel`'s state dict (see the module docstring)."""
    e, n_filters, P, D = config.char_embedding_dim, config.num_filters, config.projection_dim, config.cell_dim
    identity = lambda *tensors: tensors  # noqa: E731
    links = [
        WeightLink(
            {"char_embed": (config.n_characters - 1, e)},
            ("char_encoder.char_embedding.weight",),
            identity,
            identity,
            f"n_characters - 1 = {config.n_characters - 1} rows, embedding.dim = {e}",
        )
    ]
    for i, (width, num) in enumerate(config.filters):
        links.append(
            WeightLink(
                {f"CNN/W_cnn_{i}": (1, width, e, num), f"CNN/b_cnn_{i}": (num,)},
                (f"char_encoder.convolutions.{i}.weight", f"char_encoder.convolutions.{i}.bias"),
                lambda w, b: (w[0].permute(2, 1, 0), b),
                lambda w, b: (w.permute(2, 1, 0)[None], b),
                f"char_cnn.filters[{i}] = [{width}, {num}], embedding.dim = {e}",
            )
        )

    def highway_to_model(w_transform, w_carry, b_transform, b_carry):
        return torch.cat([w_transform.T, -w_carry.T]), torch.cat([b_transform, -b_carry])

    def highway_to_original(weight, bias):
        (a, g), (a_bias, g_bias) = weight.chunk(2), bias.chunk(2)
        return a.T, -g.T, a_bias, -g_bias

    highway_shapes = {"W_transform": (n_filters, n_filters), "W_carry": (n_filters, n_filters)}
    highway_shapes.update(b_transform=(n_filters,), b_carry=(n_filters,))
    for k in range(config.n_highway):
        links.append(
            WeightLink(
                {f"CNN_high_{k}/{name}": shape for name, shape in highway_shapes.items()},
                (f"char_encoder.highways.{k}.weight", f"char_encoder.highways.{k}.bias"),
                highway_to_model,
                highway_to_original,
                f"char_cnn.n_highway = {config.n_highway}, {n_filters} filters",
            )
        )
    links.append(
        WeightLink(
            {"CNN_proj/W_proj": (n_filters, P), "CNN_proj/b_proj": (P,)},
            ("char_encoder.projection.weight", "char_encoder.projection.bias"),
            lambda w, b: (w.T, b),
            lambda w, b: (w.T, b),
            f"{n_filters} filters, projection_dim = {P}",
            # bilm-tf has no projection when F == P
            when_absent=(lambda: (torch.eye(P), torch.zeros(P))) if n_filters == P else None,
        )
    )

    # The model adds config.forget_bias at run time; TF adds TF_FORGET_BIAS. A converted model has both equal,
    # so the stored bias is copied exactly; another model's bias is shifted by the difference.
    forget_shift = torch.zeros(4 * D)
    forget_shift[2 * D : 3 * D] = TF_FORGET_BIAS - config.forget_bias
    shifts = bool(forget_shift.any())

    def lstm_to_model(kernel, bias, projection):
        kernel = kernel.T
        bias = bias + forget_shift if shifts else bias
        return (
            _swap_tf_gate_blocks(kernel[:, :P], D),
            _swap_tf_gate_blocks(kernel[:, P:], D),
            _swap_tf_gate_blocks(bias, D),
            projection.T,
        )

    def lstm_to_original(input_weight, state_weight, bias, projection):
        kernel = torch.cat([_swap_tf_gate_blocks(input_weight, D), _swap_tf_gate_blocks(state_weight, D)], dim=1).T
        bias = _swap_tf_gate_blocks(bias, D)
        return kernel, bias - forget_shift if shifts else bias, projection.T

    for direction, stack in enumerate(("forward_layers", "backward_layers")):
        for layer in range(config.num_layers):
            cell = CELL_PATH.format(direction=direction, layer=layer)
            prefix = f"encoder.{stack}.{layer}"
            links.append(
                WeightLink(
                    {f"{cell}/W_0": (2 * P, 4 * D), f"{cell}/B": (4 * D,), f"{cell}/W_P_0": (D, P)},
                    (
                        f"{prefix}.input_linearity.weight",
                        f"{prefix}.state_linearity.weight",
                        f"{prefix}.state_linearity.bias",
                        f"{prefix}.state_projection.weight",
                    ),
                    lstm_to_model,
                    lstm_to_original,
                    f"lstm.n_layers = {config.num_layers}, projection_dim = {P}, dim = {D}",
                )
            )
    return links


# Datasets a weight file may hold that ElmoModel has no use for: the LM's word softmax.
UNUSED_DATASETS = ("softmax/W", "softmax/b")


def not_described_error(source: str, kind: str, unused: list[str], config: ElmoConfig) -> ElmoInputError:
    """The error for weights (`kind`: dataset, variable) that the options leave unused."""
    more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
    return ElmoInputError(
        f"{source}: {kind} '{unused[0]}'{more} is not part of the model the options describe (lstm.n_layers = "
        f"{config.num_layers}, char_cnn.n_highway = {config.n_highway}, {len(config.filters)} filters): the "
        "options and the weights do not belong together"
    )


def state_dict_from_hdf5(h5file, config: ElmoConfig, source: str = "weights.hdf5") -> dict[str, torch.Tensor]:
    """`ElmoModel` state dict from an open original weight file, every dataset checked against `config`; a dataset
    the options leave unused (more layers, highways or convolutions than they describe) is an error too."""
    import h5py

    reader = _WeightReader(h5file, source)
    links = weight_links(config)
    expected = {name for link in links for name in link.datasets}
    in_file = []
    h5file.visititems(lambda name, item: in_file.append(name) if isinstance(item, h5py.Dataset) else None)
    unused = [name for name in in_file if name not in expected and name not in UNUSED_DATASETS]
    if unused:
        raise not_described_error(source, "dataset", unused, config)
    state = {}
    for link in links:
        if link.when_absent is not None and not any(name in h5file for name in link.datasets):
            tensors = link.when_absent()
        else:
            tensors = link.to_model(*(reader.read(name, shape, link.why) for name, shape in link.datasets.items()))
        state.update((key, tensor.contiguous()) for key, tensor in zip(link.keys, tensors))
    return state


def hdf5_datasets_from_state_dict(state: dict[str, torch.Tensor], config: ElmoConfig) -> dict[str, np.ndarray]:
    """The inverse of `state_dict_from_hdf5`: dataset name -> float32 array of the original layout."""
    datasets = {}
    for link in weight_links(config):
        tensors = link.to_original(*(state[key].detach().to("cpu", torch.float32) for key in link.keys))
        datasets.update((name, tensor.contiguous().numpy()) for name, tensor in zip(link.datasets, tensors))
    return datasets


def options_from_config(config: ElmoConfig) -> dict:
    """The inverse of `config_from_options`: an original `options.json` dictionary."""
    if config.char_vocabulary or config.input_word_dim:
        raise ElmoInputError(
            "the original options.json / weights.hdf5 format has UTF-8 byte characters only: this model reads a "
            "character vocabulary or word embeddings (an ELMoForManyLangs conversion) and cannot be exported"
        )
    return {
        "lstm": {
            "dim": config.cell_dim,
            "projection_dim": config.projection_dim,
            "n_layers": config.num_layers,
            "cell_clip": config.cell_clip,
            "proj_clip": config.proj_clip,
            "use_skip_connections": config.use_skip_connections,
        },
        "char_cnn": {
            "embedding": {"dim": config.char_embedding_dim},
            "filters": config.filters,
            "n_highway": config.n_highway,
            "n_characters": config.n_characters,
            "max_characters_per_token": config.max_characters_per_token,
            "activation": config.activation,
        },
    }


def load_original_elmo(options_path, weights_path) -> ElmoModel:
    """An `ElmoModel` (eval mode) holding the weights of an original `options.json` + `weights.hdf5` pair."""
    import h5py

    config = config_from_options(load_options(options_path), source=str(options_path))
    weights_path = Path(weights_path)
    if weights_path.is_dir():
        raise ElmoInputError(f"{weights_path}: is a folder, expected the weight file (weights.hdf5)")
    if not weights_path.is_file():
        raise ElmoInputError(f"{weights_path}: no such weight file")
    try:
        h5file = h5py.File(weights_path, "r")
    except OSError as error:
        raise ElmoInputError(f"{weights_path}: not an HDF5 file or corrupted ({error})") from None
    with h5file:
        state = state_dict_from_hdf5(h5file, config, source=str(weights_path))
    with torch.device("meta"):
        model = ElmoModel(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


__all__ = [
    "UNUSED_DATASETS",
    "WeightLink",
    "config_from_options",
    "hdf5_datasets_from_state_dict",
    "load_options",
    "load_original_elmo",
    "not_described_error",
    "options_from_config",
    "state_dict_from_hdf5",
    "weight_links",
]
