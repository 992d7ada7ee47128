"""Convert an ELMoForManyLangs (HIT-SCIR) model folder to a Hugging Face folder.

    hf-elmo convert --format elmoformanylangs --model-dir zht.model --output-dir elmo-zht [--model-config FILE]

A released folder holds `config.json` (the trainer's arguments; only `config_path` is read), usually not the model
configuration it names, `char.dic`, `word.dic`, `token_embedder.pkl` and `encoder.pkl`. Mapping:

- model configuration: found as their loader finds it: `config_path` relative to the folder (absolute as is), then
  its file name in the folder, then, for the two names their package ships (identical files), the built-in
  `DEFAULT_MODEL_CONFIG`; `--model-config` overrides all of it.
- `char.dic` -> the tokenizer's character vocabulary, every id + 1 (0 stays the padding word). Read as their
  loader reads it: each line stripped, split at the tab; a line left without a tab is the entry U+3000 (an
  entry made of whitespace); a later duplicate wins.
- `char_emb_layer.embedding.weight` -> `char_encoder.char_embedding.weight` with the `<bow>` and `<eow>` rows
  exchanged: their batcher writes the id of `<eow>` before a word's characters and `<bow>` after them, so the
  row trained as "begin of word" is the one named `<eow>`. Their `<pad>` row is not zero and is kept.
- `word.dic` + `word_emb_layer.embedding.weight` -> the tokenizer's word vocabulary (`input_word_ids`) and
  `char_encoder.word_embedding.weight`; the projection reads `[word | characters]` as theirs does.
- `convolutions.*`, `highways._layers.*` (AllenNLP's gate convention already) and `projection.*`: as they are.
- `encoder.pkl` `{forward,backward}_layer_{l}.*` -> `encoder.{forward,backward}_layers.{l}.*` as they are:
  AllenNLP's cell with its `[i, f, g, o]` gates, skip connections from layer 1, no forget bias at run time.

The `.pkl` files are `torch.save` pickles, often in torch 0.4's legacy format with storages tagged `cuda:N`; they
are read on the CPU with `torch.load(weights_only=True)`, which only rebuilds tensors and containers.

Not reproduced: their encoder carries its LSTM state from batch to batch, and their `Embedder` shuffles batch
order; the converted model is stateless (see `ElmoModel`'s `state` for the carried behaviour).
"""

import pickle
from pathlib import Path

import torch

from ..character_rows import (
    VOCAB_BEGINNING_OF_WORD,
    VOCAB_BOS_TOKEN,
    VOCAB_END_OF_WORD,
    VOCAB_EOS_TOKEN,
    VOCAB_PADDING,
    VOCAB_UNKNOWN,
)
from ..configuration_elmo import ElmoConfig
from ..io.files import (
    MODEL_FOLDER,
    ElmoInputError,
    check_output,
    checked_config,
    checked_filters,
    json_field,
    read_json_object,
    read_utf8,
    write_output,
)
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import add_origin
from ..tokenization_elmo import ElmoTokenizer

DEFAULT_MODEL_CONFIG = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
"""The model configuration their package ships under both names below (one file, two names)."""
DEFAULT_MODEL_CONFIG_NAMES = ("cnn_50_100_512_4096_sample.json", "cnn_0_100_512_4096_sample.json")

SPECIAL_CHARS = (
    VOCAB_BOS_TOKEN,
    VOCAB_EOS_TOKEN,
    VOCAB_UNKNOWN,
    VOCAB_PADDING,
    VOCAB_BEGINNING_OF_WORD,
    VOCAB_END_OF_WORD,
)
SPECIAL_WORDS = (VOCAB_UNKNOWN, VOCAB_BOS_TOKEN, VOCAB_EOS_TOKEN, VOCAB_PADDING)


def find_model_config(model_dir: Path, model_config=None) -> tuple[dict, str]:
    """The model configuration and where it came from (a path, or the built-in default)."""
    if model_config is not None:
        return read_json_object(Path(model_config), "model configuration file"), str(model_config)
    training = read_json_object(model_dir / "config.json", "training arguments file")
    config_path = training.get("config_path")
    if not isinstance(config_path, str) or not config_path:
        raise ElmoInputError(f"{model_dir / 'config.json'}: missing field 'config_path' (use --model-config)")
    name = config_path.replace("\\", "/").rsplit("/", 1)[-1]
    for candidate in (model_dir / config_path, model_dir / name):
        if candidate.is_file():
            return read_json_object(candidate, "model configuration file"), str(candidate)
    if name in DEFAULT_MODEL_CONFIG_NAMES:
        return DEFAULT_MODEL_CONFIG, f"the built-in {name}"
    raise ElmoInputError(
        f"{model_dir / 'config.json'}: the model configuration {config_path!r} is neither in {model_dir} nor one of "
        f"the defaults {list(DEFAULT_MODEL_CONFIG_NAMES)} (pass it with --model-config)"
    )


def config_from_model_config(model_config: dict, source: str, char_rows: int, word_rows: int) -> ElmoConfig:
    """The `ElmoConfig` of their model configuration, for tables of `char_rows` characters and `word_rows` words."""

    def field(path: str, kinds=(int,), default=KeyError):
        value = json_field(model_config, path, source, default)
        if value is not default and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise ElmoInputError(
                f"{source}: field '{path}' is {value!r}, expected {'/'.join(k.__name__ for k in kinds)}"
            )
        return value

    for path, expected in (("encoder.name", "elmo"), ("token_embedder.name", "cnn")):
        if field(path, (str,)) != expected:
            raise ElmoInputError(f"{source}: {path} is {field(path, (str,))!r}; only {expected!r} models are supported")
    if field("token_embedder.char_dim") <= 0:
        raise ElmoInputError(f"{source}: token_embedder.char_dim is 0 (a word-only model), which is not supported")
    filters = checked_filters(field("token_embedder.filters", (list,)), "token_embedder.filters", source)
    clip = lambda path: field(path, (int, float, type(None)), default=None) or None  # noqa: E731  (0 / null: none)
    return checked_config(
        ElmoConfig,
        source,
        char_embedding_dim=field("token_embedder.char_dim"),
        filters=filters,
        n_highway=field("token_embedder.n_highway"),
        activation=field("token_embedder.activation", (str,)),
        n_characters=char_rows + 1,
        max_characters_per_token=field("token_embedder.max_characters_per_token"),
        cell_dim=field("encoder.dim"),
        projection_dim=field("encoder.projection_dim"),
        num_layers=field("encoder.n_layers"),
        cell_clip=clip("encoder.cell_clip"),
        proj_clip=clip("encoder.proj_clip"),
        use_skip_connections=True,
        dropout=field("dropout", (int, float), default=0.1),
        char_vocabulary=True,
        input_word_vocab_size=word_rows if field("token_embedder.word_dim") > 0 else 0,
        input_word_dim=field("token_embedder.word_dim"),
    )


def read_dictionary(path: Path, specials: tuple[str, ...]) -> dict[str, int]:
    """`char.dic` / `word.dic` as their loader reads it (see the module docstring)."""
    entries = {}
    for number, line in enumerate(
        read_utf8(path, "file").splitlines(), start=1
    ):  # their codecs reader splits lines the same way
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        try:
            token, index = fields
            entries[token] = int(index)
        except ValueError:
            raise ElmoInputError(f"{path}: line {number} is {line!r}, expected an entry, a tab and an id") from None
    missing = [token for token in specials if token not in entries]
    if missing:
        raise ElmoInputError(f"{path}: lacks the special entries {missing}")
    return entries


def load_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """A `torch.save`d state dict, on the CPU, through the restricted `weights_only` unpickler."""
    if not path.is_file():
        raise ElmoInputError(f"{path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as error:
        message = " ".join(str(error).split())[:300] or type(error).__name__
        raise ElmoInputError(f"{path}: not a readable torch checkpoint or corrupted ({message})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ElmoInputError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
    return state


def _take(state: dict, path: Path, expected: dict[str, tuple], source: str) -> dict[str, torch.Tensor]:
    """Checks that `state` has exactly the `expected` keys and shapes (their strict load) and finite floats."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ElmoInputError(
            f"{path}: keys do not match the model configuration ({source}; another one can be given with "
            f"--model-config): missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    for key, shape in expected.items():
        tensor = state[key]
        if tuple(tensor.shape) != shape:
            raise ElmoInputError(
                f"{path}: '{key}' has shape {tuple(tensor.shape)}, expected {shape} from the model configuration "
                f"({source}; another one can be given with --model-config)"
            )
        if not tensor.is_floating_point() or not torch.isfinite(tensor).all():
            raise ElmoInputError(f"{path}: '{key}' must hold finite floats")
    return {key: state[key].float() for key in expected}


def load_elmoformanylangs(model_dir, model_config=None) -> tuple[ElmoModel, ElmoTokenizer]:
    """The converted model (eval mode) and its tokenizer."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ElmoInputError(f"{model_dir}: no such model folder")
    options, source = find_model_config(model_dir, model_config)
    embedder_path, encoder_path = model_dir / "token_embedder.pkl", model_dir / "encoder.pkl"
    embedder, encoder = load_checkpoint(embedder_path), load_checkpoint(encoder_path)
    char_table = embedder.get("char_emb_layer.embedding.weight")
    word_table = embedder.get("word_emb_layer.embedding.weight")
    if char_table is None or char_table.dim() != 2:
        raise ElmoInputError(f"{embedder_path}: no 2-D 'char_emb_layer.embedding.weight'")
    config = config_from_model_config(
        options, source, char_table.shape[0], word_table.shape[0] if word_table is not None and word_table.dim() else 0
    )

    e, n_filters, P, D = config.char_embedding_dim, config.num_filters, config.projection_dim, config.cell_dim
    expected = {"char_emb_layer.embedding.weight": (config.n_characters - 1, e)}
    if config.input_word_dim:
        expected["word_emb_layer.embedding.weight"] = (config.input_word_vocab_size, config.input_word_dim)
    for k, (width, num) in enumerate(config.filters):
        expected.update({f"convolutions.{k}.weight": (num, e, width), f"convolutions.{k}.bias": (num,)})
    for j in range(config.n_highway):
        expected.update(
            {f"highways._layers.{j}.weight": (2 * n_filters, n_filters), f"highways._layers.{j}.bias": (2 * n_filters,)}
        )
    expected.update({"projection.weight": (P, config.input_word_dim + n_filters), "projection.bias": (P,)})
    embedder = _take(embedder, embedder_path, expected, source)
    cell = {
        "input_linearity.weight": (4 * D, P),
        "state_linearity.weight": (4 * D, P),
        "state_linearity.bias": (4 * D,),
        "state_projection.weight": (P, D),
    }
    expected = {
        f"{direction}_layer_{layer}.{name}": shape
        for layer in range(config.num_layers)
        for direction in ("forward", "backward")
        for name, shape in cell.items()
    }
    encoder = _take(encoder, encoder_path, expected, source)

    chars = read_dictionary(model_dir / "char.dic", SPECIAL_CHARS)
    words = read_dictionary(model_dir / "word.dic", SPECIAL_WORDS) if config.input_word_dim else None
    for name, vocabulary, rows in (
        ("char.dic", chars, config.n_characters - 1),
        ("word.dic", words, config.input_word_vocab_size),
    ):
        if vocabulary is not None and not all(0 <= index < rows for index in vocabulary.values()):
            raise ElmoInputError(
                f"{model_dir / name}: ids must be in [0, {rows - 1}] (rows of the embedding table), found "
                f"[{min(vocabulary.values())}, {max(vocabulary.values())}]"
            )

    char_weight = embedder["char_emb_layer.embedding.weight"].clone()
    first, last = chars[VOCAB_BEGINNING_OF_WORD], chars[VOCAB_END_OF_WORD]
    char_weight[[first, last]] = char_weight[[last, first]]
    state = {"char_encoder.char_embedding.weight": char_weight}
    if config.input_word_dim:
        state["char_encoder.word_embedding.weight"] = embedder["word_emb_layer.embedding.weight"]
    for key, value in embedder.items():
        if key.startswith(("convolutions.", "projection.")):
            state[f"char_encoder.{key}"] = value
        elif key.startswith("highways._layers."):
            state[key.replace("highways._layers.", "char_encoder.highways.")] = value
    for key, value in encoder.items():
        layer, name = key.split(".", 1)
        direction, _, index = layer.rsplit("_", 2)
        state[f"encoder.{direction}_layers.{index}.{name}"] = value
    with torch.device("meta"):
        model = ElmoModel(config)
    model.load_state_dict({key: value.contiguous() for key, value in state.items()}, strict=True, assign=True)
    tokenizer = ElmoTokenizer(char_vocab={char: index + 1 for char, index in chars.items()}, input_word_vocab=words)
    return model.eval(), tokenizer


def convert_elmoformanylangs(model_dir, output_dir, model_config=None, force: bool = False) -> Path:
    """Converts and writes `config.json`, `model.safetensors`, tokenizer files and remote code to `output_dir`."""
    inputs = [model_dir, model_config]
    check_output(output_dir, MODEL_FOLDER, inputs, force)
    model, tokenizer = load_elmoformanylangs(model_dir, model_config)
    add_origin(
        model.config,
        f"Converted by `hf-elmo convert --format elmoformanylangs` from the ELMoForManyLangs model "
        f"`{Path(model_dir).resolve().name}`.",
    )

    def write(folder):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return write_output(output_dir, write, MODEL_FOLDER, inputs, force)


__all__ = ["DEFAULT_MODEL_CONFIG", "convert_elmoformanylangs", "load_elmoformanylangs"]
