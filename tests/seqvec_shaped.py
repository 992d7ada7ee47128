"""A model with SeqVec's structure (Heinzinger et al. 2019) and random weights drawn from a seed, written in the
original format (`options.json` + `weights.hdf5`) that SeqVec is released in.

`SEQVEC_OPTIONS` is SeqVec's `options.json` as released (char-CNN of the original ELMo, 2 layers of 4,096 cells
projected to 512, 1,024-dim outputs; training fields included). `SMALL_OPTIONS` keeps its structure (7 filters of
widths 1..7, 2 highway layers, 2 layers, clips of 3, skip connections) at sizes fast tests can afford.

The weights are drawn with NumPy's PCG64 `Generator` from the seed in file order, so the same seed writes the same
file on every machine: the fixture in `tests/fixtures/seqvec/` holds outputs for seed `SEED` and is compared with
this file regenerated at test time (90M parameters are not stored in the repository)."""

import json
from pathlib import Path

import h5py
import numpy as np

SEED = 20191217  # SeqVec's publication date (BMC Bioinformatics 20, 723)

SEQVEC_OPTIONS = {
    "bidirectional": True,
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "max_characters_per_token": 50,
        "n_characters": 262,
        "n_highway": 2,
    },
    "dropout": 0.1,
    "lstm": {
        "cell_clip": 3,
        "dim": 4096,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 512,
        "use_skip_connections": True,
    },
    "all_clip_norm_val": 10.0,
    "n_epochs": 10,
    "n_train_tokens": 9577889953,
    "batch_size": 48,
    "n_tokens_vocab": 28,
    "unroll_steps": 100,
    "n_negative_samples_batch": 20,
}

SMALL_OPTIONS = {
    **SEQVEC_OPTIONS,
    "char_cnn": {
        **SEQVEC_OPTIONS["char_cnn"],
        "embedding": {"dim": 4},
        "filters": [[1, 4], [2, 4], [3, 4], [4, 8], [5, 8], [6, 8], [7, 12]],
    },
    "lstm": {**SEQVEC_OPTIONS["lstm"], "dim": 64, "projection_dim": 16},
}

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWYXUOBZ"  # the 20 standard residues, then X (unknown), U, O, B, Z


def weight_shapes(options: dict) -> dict[str, tuple[int, ...]]:
    """The datasets of the original `weights.hdf5` and their shapes, in the order the generator draws them."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    embedding, filters = cnn["embedding"]["dim"], cnn["filters"]
    total_filters = sum(count for _, count in filters)
    cells, projection = lstm["dim"], lstm["projection_dim"]
    shapes = {"char_embed": (cnn["n_characters"] - 1, embedding)}
    for i, (width, count) in enumerate(filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, embedding, count)
        shapes[f"CNN/b_cnn_{i}"] = (count,)
    for k in range(cnn["n_highway"]):
        for name in ("W_transform", "W_carry"):
            shapes[f"CNN_high_{k}/{name}"] = (total_filters, total_filters)
        for name in ("b_transform", "b_carry"):
            shapes[f"CNN_high_{k}/{name}"] = (total_filters,)
    shapes["CNN_proj/W_proj"] = (total_filters, projection)
    shapes["CNN_proj/b_proj"] = (projection,)
    for direction in range(2):
        for layer in range(lstm["n_layers"]):
            cell = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            shapes[f"{cell}/W_0"] = (2 * projection, 4 * cells)
            shapes[f"{cell}/B"] = (4 * cells,)
            shapes[f"{cell}/W_P_0"] = (cells, projection)
    return shapes


def _scale(name: str, shape: tuple[int, ...]) -> float:
    """Standard deviation of a dataset's values: 1 / sqrt(fan-in) for a weight matrix, so that activations stay of
    order one, the clips are sometimes reached and the LSTM does not saturate; 0.1 for a bias."""
    if name == "char_embed":
        return 1.0
    if len(shape) == 1:
        return 0.1
    fan_in = int(np.prod(shape[:-1]))
    return 1.0 / np.sqrt(fan_in)


def write_seqvec_shaped(folder, options: dict = SEQVEC_OPTIONS, seed: int = SEED) -> tuple[Path, Path]:
    """Writes `options.json` and `weights.hdf5` into `folder`; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    options_path, weights_path = folder / "options.json", folder / "weights.hdf5"
    options_path.write_text(json.dumps(options))
    generator = np.random.default_rng(seed)
    with h5py.File(weights_path, "w") as h5file:
        for name, shape in weight_shapes(options).items():
            values = generator.standard_normal(shape, dtype=np.float32) * np.float32(_scale(name, shape))
            h5file.create_dataset(name, data=values)
    return options_path, weights_path


def memory_bound_per_residue(options: dict) -> int:
    """docs/proteins.md's bound on the CPU memory one residue of a protein takes, in bytes: the input-to-gate
    products of both directions (2 x 4 cells), the layers, their stack and the stored copy (6 x 3 x 2P), float32,
    and 1,000 bytes for its character row and bookkeeping."""
    cells, projection = options["lstm"]["dim"], options["lstm"]["projection_dim"]
    return 4 * (2 * 4 * cells + 6 * 3 * 2 * projection) + 1000


def random_protein(length: int, generator: np.random.Generator) -> str:
    """`length` residues drawn uniformly from `AMINO_ACIDS`."""
    return "".join(generator.choice(list(AMINO_ACIDS), size=length))
