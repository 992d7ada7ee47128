"""What a biLM training run starts from: the configuration, the word vocabulary with its tokenizer, and the weights,
each checked against the others before any data is read (`hf-elmo train`, or a script of one's own around
`ElmoTrainer`).

The functions take `hf_elmo.commands.train`'s `ElmoModelArguments` (`model`, `model_args`) and `ElmoDataArguments`
(`data`), or any objects with their fields.
"""

import json
from pathlib import Path

from transformers import set_seed

from ..configuration_elmo import ARCHITECTURE_FIELDS, ELMO_PRESETS, WEIGHT_FORMAT_FIELDS, ElmoConfig
from ..convert.original_format import config_from_options
from ..modeling_elmo import ElmoForBiLM
from ..pretrained_elmo import add_origin, describe_source
from ..tokenization_elmo import ElmoTokenizer
from ..word_vocabulary import WORD_VOCABULARY_FILE, read_word_vocabulary
from .corpus import TRAINING_OPTIONS_FILE, build_word_vocabulary
from .trainer import check_frequency_order, log_once


def load_config(spec: str) -> ElmoConfig:
    """A preset name, a folder or config.json written by `save_pretrained`, or a bilm-tf `options.json`."""
    if spec in ELMO_PRESETS:
        return ElmoConfig.from_preset(spec)
    path = Path(spec)
    if path.is_dir():
        return ElmoConfig.from_pretrained(path)
    if not path.is_file():
        raise ValueError(
            f"--config {spec!r} is neither a preset ({', '.join(ELMO_PRESETS)}) nor an existing file or folder."
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"--config {spec!r} is not a JSON file: {error}.") from None
    if "lstm" in values and "char_cnn" in values:
        return config_from_options(values, source=str(path))
    return ElmoConfig.from_json_file(path)


def check_same_architecture(config: ElmoConfig, checkpoint: ElmoConfig, config_spec: str, init_from: str):
    different = [
        f"{name}: --config has {getattr(config, name)!r}, the weights have {getattr(checkpoint, name)!r}"
        for name in ARCHITECTURE_FIELDS
        if getattr(config, name) != getattr(checkpoint, name)
    ]
    if different:
        raise ValueError(
            f"--config {config_spec} does not match the --init-from weights in {init_from}: " + "; ".join(different)
        )


def record_training(model, data, config: ElmoConfig, checkpoint_config):
    """Adds this run to the history the model card tells (`hub_elmo`), after that of the --init-from checkpoint."""
    if checkpoint_config is not None:
        config.elmo_origin = getattr(checkpoint_config, "elmo_origin", None)
    vars(config).pop("elmo_evaluation", None)  # the --init-from weights', not those this run trains
    start = "from scratch" if model.init_from is None else f"from the weights of {describe_source(model.init_from)}"
    names = ", ".join(f"`{Path(file).name}`" for file in data.train_files[:5])
    more = f" and {len(data.train_files) - 5:,} more" if len(data.train_files) > 5 else ""
    add_origin(
        config,
        f"biLM trained {start} by `hf-elmo train` on {names}{more}; the run's arguments are in "
        f"`{TRAINING_OPTIONS_FILE}` in its output folder.",
    )


def tokenizer_and_config(model, data) -> tuple[ElmoTokenizer, ElmoConfig]:
    """The tokenizer with its word vocabulary and the run's config, checked against the --init-from checkpoint."""
    checkpoint_config = None
    if model.init_from is not None:
        if not (Path(model.init_from) / "config.json").is_file():
            raise ValueError(
                f"--init-from {model.init_from}: no config.json there; expected a folder saved by save_pretrained."
            )
        checkpoint_config = ElmoConfig.from_pretrained(model.init_from)
    if model.config is not None:
        config = load_config(model.config)
        if checkpoint_config is not None:
            check_same_architecture(config, checkpoint_config, model.config, model.init_from)
            # How the checkpoint's weights are read is the checkpoint's: converted weights need TensorFlow's
            # forget bias added at run time, which a --config preset does not know about.
            for name in WEIGHT_FORMAT_FIELDS:
                setattr(config, name, getattr(checkpoint_config, name))
    else:
        config = checkpoint_config if checkpoint_config is not None else ElmoConfig.from_preset("small")

    record_training(model, data, config, checkpoint_config)
    tokenizer = ElmoTokenizer(max_characters_per_token=config.max_characters_per_token)
    checkpoint_words = None
    if model.init_from is not None and (Path(model.init_from) / WORD_VOCABULARY_FILE).is_file():
        checkpoint_words = read_word_vocabulary(Path(model.init_from) / WORD_VOCABULARY_FILE)
    if data.vocab is not None:
        words, source = read_word_vocabulary(data.vocab), f"from {data.vocab}"
    elif checkpoint_words is not None:
        words, source = checkpoint_words, f"from {Path(model.init_from) / WORD_VOCABULARY_FILE}"
    else:
        words = build_word_vocabulary(data.train_files, data.split, tokenizer, data.min_count, data.max_vocab_size)
        source = f"built from the training files with min count {data.min_count}"
    tokenizer.set_word_vocabulary(words)

    if checkpoint_config is not None and checkpoint_config.vocab_size:
        if checkpoint_config.vocab_size != len(words):
            raise ValueError(
                f"--init-from {model.init_from} has a softmax of {checkpoint_config.vocab_size} words but the "
                f"vocabulary ({source}) has {len(words)}; use the checkpoint's vocab.txt."
            )
        if checkpoint_words is not None and checkpoint_words != words:
            raise ValueError(
                f"The vocabulary ({source}) lists other words than the one of --init-from {model.init_from}, whose "
                "softmax rows belong to its own words; use the checkpoint's vocab.txt."
            )
    if not source.startswith("built") and 0 < model.num_softmax_samples < len(words):
        check_frequency_order(words, data.train_files, data.split, source)
    config.vocab_size = len(words)
    config.dropout = model.dropout
    config.num_softmax_samples = model.num_softmax_samples
    config.validate_architecture()
    log_once(f"Word vocabulary: {len(words):,} words, {source}.")
    return tokenizer, config


def build_bilm(model_args, config: ElmoConfig, seed: int) -> ElmoForBiLM:
    set_seed(seed)
    if model_args.init_from is None:
        return ElmoForBiLM(config)
    model, info = ElmoForBiLM.from_pretrained(model_args.init_from, config=config, output_loading_info=True)
    softmax_keys = {"softmax.weight", "softmax.bias"}
    missing = set(info["missing_keys"])
    if missing - softmax_keys or info["mismatched_keys"]:
        raise ValueError(
            f"--init-from {model_args.init_from} does not hold the weights of this model: missing "
            f"{sorted(missing - softmax_keys)}, mismatched {sorted(info['mismatched_keys'])}."
        )
    if missing:
        log_once(
            f"--init-from {model_args.init_from} has no word softmax (e.g. converted released weights): a fresh "
            f"softmax of {config.vocab_size:,} words is initialised; the biLM starts from the checkpoint."
        )
    else:
        log_once(f"--init-from {model_args.init_from}: biLM and softmax continue from the checkpoint.")
    return model
