"""Convert an original ELMo (bilm-tf / AllenNLP `options.json` + `weights.hdf5`) to a Hugging Face folder.

The output folder holds `config.json`, `model.safetensors`, the tokenizer files and the remote code, and
loads with `AutoModel.from_pretrained` / `AutoTokenizer.from_pretrained`.

Mapping (see the spec of the reference implementations):
- `char_embed` `(n_characters - 1, e)`: as is; the zero row for id 0 is implicit in `ElmoCharacterEmbedding`.
- `CNN/W_cnn_i` `(1, w, e, n)` -> Conv1d weight `(n, e, w)`; TF's conv2d is a cross-correlation like Conv1d.
- `CNN_high_k`: TF computes `c * relu(x W_t + b_t) + (1 - c) * x` with `c = sigmoid(x W_c + b_c)`; our gate
  `g = 1 - c = sigmoid(-x W_c - b_c)`, so the weight is `[W_t^T; -W_c^T]` and the bias `[b_t; -b_c]`.
- `CNN_proj/W_proj` `(F, P)` -> Linear weight `(P, F)`; absent in bilm-tf files where `F == P`: identity.
- `RNN_d/.../CellL/LSTMCell/W_0` `(2P, 4D)`: transposed, columns `[0, P)` act on the input and `[P, 2P)` on the
  state; TF's gate blocks `[i, j, f, o]` become `[i, f, j, o]`. `B`: TF adds a constant forget bias of 1.0 that
  is not stored, so it is added here. `W_P_0` `(D, P)` -> `(P, D)`.
- `lstm.cell_clip` / `lstm.proj_clip` of 0 or null mean no clipping (AllenNLP's reading).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from .configuration_elmo import ElmoConfig
from .modeling_elmo import ElmoModel
from .tokenization_elmo import ElmoTokenizer

TF_FORGET_BIAS = 1.0
CELL_PATH = "RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


class ElmoConversionError(ValueError):
    """A problem with the files to convert; the message is one line naming the file and the field."""


def _field(options: dict, path: str, source: str, default=KeyError):
    value = options
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            if default is not KeyError:
                return default
            raise ElmoConversionError(f"{source}: missing field '{path}'")
        value = value[key]
    return value


def load_options(path: str | os.PathLike) -> dict:
    """Reads `options.json`, with one-line errors for a missing file or bad JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ElmoConversionError(f"{path}: no such options file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ElmoConversionError(f"{path}: cannot read options file ({error})") from None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise ElmoConversionError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    if not isinstance(options, dict):
        raise ElmoConversionError(f"{path}: expected a JSON object with 'lstm' and 'char_cnn', got {type(options).__name__}")
    return options


def config_from_options(options: dict, source: str = "options.json") -> ElmoConfig:
    """The `ElmoConfig` described by an original `options.json` dictionary."""

    def number(path, kind=int, default=KeyError):
        value = _field(options, path, source, default)
        if value is None or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool)):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ElmoConversionError(f"{source}: field '{path}' must be a {kind.__name__}, got {value!r}")

    activation = _field(options, "char_cnn.activation", source)
    if activation not in ("relu", "tanh"):
        raise ElmoConversionError(f"{source}: char_cnn.activation must be 'relu' or 'tanh', got {activation!r}")
    filters = _field(options, "char_cnn.filters", source)
    if (
        not isinstance(filters, list)
        or not filters
        or not all(isinstance(f, list) and len(f) == 2 and all(isinstance(v, int) and v > 0 for v in f) for f in filters)
    ):
        raise ElmoConversionError(f"{source}: char_cnn.filters must be a list of [width, number] pairs, got {filters!r}")
    max_chars = number("char_cnn.max_characters_per_token", default=50)
    if max_chars != 50:
        raise ElmoConversionError(f"{source}: char_cnn.max_characters_per_token must be 50, got {max_chars}")
    # bilm-tf trains with 261 characters and infers with 262; the weight file is the same.
    n_characters = max(number("char_cnn.n_characters", default=262), 262)
    skip = _field(options, "lstm.use_skip_connections", source, default=False)
    if not isinstance(skip, bool):
        raise ElmoConversionError(f"{source}: lstm.use_skip_connections must be true or false, got {skip!r}")
    try:
        return ElmoConfig(
            char_embedding_dim=number("char_cnn.embedding.dim"),
            filters=filters,
            n_highway=number("char_cnn.n_highway"),
            activation=activation,
            n_characters=n_characters,
            cell_dim=number("lstm.dim"),
            projection_dim=number("lstm.projection_dim"),
            num_layers=number("lstm.n_layers"),
            cell_clip=number("lstm.cell_clip", float, default=None) or None,
            proj_clip=number("lstm.proj_clip", float, default=None) or None,
            use_skip_connections=skip,
        )
    except Exception as error:  # a validator's message, made one line
        message = str(error).strip().splitlines()[-1].strip()
        raise ElmoConversionError(f"{source}: {message}") from None


class _WeightReader:
    """Reads datasets from the HDF5 file, checking each against the shape the options imply."""

    def __init__(self, h5file, source: str):
        self.h5file = h5file
        self.source = source
        self.used = set()

    def read(self, name: str, shape: tuple, why: str) -> torch.Tensor:
        dataset = self.h5file.get(name)
        if dataset is None or not hasattr(dataset, "shape"):
            raise ElmoConversionError(f"{self.source}: missing dataset '{name}' ({why})")
        if tuple(dataset.shape) != tuple(shape):
            raise ElmoConversionError(
                f"{self.source}: dataset '{name}' has shape {tuple(dataset.shape)}, expected {tuple(shape)} ({why})"
            )
        if dataset.dtype.kind != "f":
            raise ElmoConversionError(f"{self.source}: dataset '{name}' has dtype {dataset.dtype}, expected float")
        try:
            array = np.asarray(dataset[...], dtype=np.float32)
        except OSError as error:
            raise ElmoConversionError(f"{self.source}: cannot read dataset '{name}' ({error})") from None
        if not np.isfinite(array).all():
            raise ElmoConversionError(f"{self.source}: dataset '{name}' contains NaN or infinite values")
        self.used.add(name)
        return torch.from_numpy(array)


def _swap_tf_gate_blocks(tensor: torch.Tensor, cell_dim: int) -> torch.Tensor:
    """Rows in TF's `[i, j, f, o]` block order -> `[i, f, j, o]`."""
    i, j, f, o = tensor.split(cell_dim, dim=0)
    return torch.cat([i, f, j, o], dim=0)


def state_dict_from_hdf5(h5file, config: ElmoConfig, source: str = "weights.hdf5") -> dict[str, torch.Tensor]:
    """`ElmoModel` state dict from an open original weight file, every dataset checked against `config`."""
    reader = _WeightReader(h5file, source)
    e, n_filters, P, D = config.char_embedding_dim, config.num_filters, config.projection_dim, config.cell_dim
    state = {}
    state["char_encoder.char_embedding.weight"] = reader.read(
        "char_embed", (config.n_characters - 1, e), f"n_characters - 1 = {config.n_characters - 1} rows, embedding.dim = {e}"
    )
    for i, (width, num) in enumerate(config.filters):
        why = f"char_cnn.filters[{i}] = [{width}, {num}], embedding.dim = {e}"
        weight = reader.read(f"CNN/W_cnn_{i}", (1, width, e, num), why)
        state[f"char_encoder.convolutions.{i}.weight"] = weight[0].permute(2, 1, 0).contiguous()
        state[f"char_encoder.convolutions.{i}.bias"] = reader.read(f"CNN/b_cnn_{i}", (num,), why)
    for k in range(config.n_highway):
        why = f"char_cnn.n_highway = {config.n_highway}, {n_filters} filters"
        w_transform = reader.read(f"CNN_high_{k}/W_transform", (n_filters, n_filters), why)
        w_carry = reader.read(f"CNN_high_{k}/W_carry", (n_filters, n_filters), why)
        b_transform = reader.read(f"CNN_high_{k}/b_transform", (n_filters,), why)
        b_carry = reader.read(f"CNN_high_{k}/b_carry", (n_filters,), why)
        state[f"char_encoder.highways.{k}.weight"] = torch.cat([w_transform.T, -w_carry.T]).contiguous()
        state[f"char_encoder.highways.{k}.bias"] = torch.cat([b_transform, -b_carry])
    why = f"{n_filters} filters, projection_dim = {P}"
    if "CNN_proj/W_proj" not in h5file and n_filters == P:  # bilm-tf skips the projection when F == P
        state["char_encoder.projection.weight"] = torch.eye(P)
        state["char_encoder.projection.bias"] = torch.zeros(P)
    else:
        state["char_encoder.projection.weight"] = reader.read("CNN_proj/W_proj", (n_filters, P), why).T.contiguous()
        state["char_encoder.projection.bias"] = reader.read("CNN_proj/b_proj", (P,), why)
    for direction, stack in enumerate(("forward_layers", "backward_layers")):
        for layer in range(config.num_layers):
            cell = CELL_PATH.format(direction=direction, layer=layer)
            why = f"lstm.n_layers = {config.num_layers}, projection_dim = {P}, dim = {D}"
            kernel = reader.read(f"{cell}/W_0", (2 * P, 4 * D), why).T
            bias = reader.read(f"{cell}/B", (4 * D,), why).clone()
            bias[2 * D : 3 * D] += TF_FORGET_BIAS
            prefix = f"encoder.{stack}.{layer}"
            state[f"{prefix}.input_linearity.weight"] = _swap_tf_gate_blocks(kernel[:, :P], D).contiguous()
            state[f"{prefix}.state_linearity.weight"] = _swap_tf_gate_blocks(kernel[:, P:], D).contiguous()
            state[f"{prefix}.state_linearity.bias"] = _swap_tf_gate_blocks(bias, D)
            state[f"{prefix}.state_projection.weight"] = reader.read(f"{cell}/W_P_0", (D, P), why).T.contiguous()
    return state


def load_original_elmo(options_path, weights_path) -> ElmoModel:
    """An `ElmoModel` (eval mode) holding the weights of an original `options.json` + `weights.hdf5` pair."""
    import h5py

    config = config_from_options(load_options(options_path), source=str(options_path))
    weights_path = Path(weights_path)
    if not weights_path.is_file():
        raise ElmoConversionError(f"{weights_path}: no such weight file")
    try:
        h5file = h5py.File(weights_path, "r")
    except OSError as error:
        raise ElmoConversionError(f"{weights_path}: not an HDF5 file or corrupted ({error})") from None
    with h5file:
        state = state_dict_from_hdf5(h5file, config, source=str(weights_path))
    with torch.device("meta"):
        model = ElmoModel(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _is_non_empty_dir(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def save_atomically(output_dir, write, force: bool = False) -> Path:
    """Calls `write(tmp_dir)` on a fresh folder beside `output_dir`, then renames it to `output_dir`.

    A failure leaves `output_dir` as it was; an existing non-empty `output_dir` is refused unless `force`.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ElmoConversionError(f"{output_dir}: exists and is not a folder")
    if _is_non_empty_dir(output_dir) and not force:
        raise ElmoConversionError(f"{output_dir}: folder is not empty (use --force to replace it)")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    try:
        write(tmp_dir)
        if output_dir.exists():
            old = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
            output_dir.rename(old)
            tmp_dir.rename(output_dir)
            shutil.rmtree(old)
        else:
            tmp_dir.rename(output_dir)
    finally:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return output_dir


def convert(options_path, weights_path, output_dir, force: bool = False) -> Path:
    """Converts and writes `config.json`, `model.safetensors`, tokenizer files and remote code to `output_dir`."""
    output_dir = Path(output_dir)
    if _is_non_empty_dir(output_dir) and not force:  # refuse before reading large weight files
        raise ElmoConversionError(f"{output_dir}: folder is not empty (use --force to replace it)")
    model = load_original_elmo(options_path, weights_path)

    def write(folder):
        model.save_pretrained(folder)
        ElmoTokenizer().save_pretrained(folder)

    return save_atomically(output_dir, write, force=force)


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--options", required=True, help="options.json of the original model")
    parser.add_argument("--weights", required=True, help="weights.hdf5 of the original model")
    parser.add_argument("--output-dir", required=True, help="folder to write (must be empty or absent)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty output folder")


def run(args: argparse.Namespace) -> int:
    try:
        output_dir = convert(args.options, args.weights, args.output_dir, force=args.force)
    except ElmoConversionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Converted ELMo written to {output_dir}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
