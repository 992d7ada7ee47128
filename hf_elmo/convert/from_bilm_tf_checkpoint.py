"""Convert a bilm-tf *training* checkpoint (TensorFlow V2 format, read without TensorFlow) to an `ElmoForBiLM`.

bilm-tf's `train()` saves every variable under `lm/`, the word softmax included, which its `dump_weights` (the
`weights.hdf5` the released models come as) leaves out. Converting the checkpoint keeps the softmax, so that
perplexity and continued training (`hf-elmo train --init-from`) start from the model exactly as it was trained.

Training layout versus `weights.hdf5` (the mapping is otherwise the one of `original_format.weight_links`):
- names: `lm/char_embed`, `lm/CNN*/...` are the HDF5 names under `lm/`; the LSTM cells are
  `lm/RNN_{d}/rnn/multi_rnn_cell/cell_{l}/lstm_cell/{kernel, bias, projection/kernel}` for HDF5's
  `RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/{W_0, B, W_P_0}`;
- `lm/char_embed` has the 261 rows of character ids 0..260 (training feeds ids without the +1 shift): the same
  rows as HDF5's `char_embed`, which inference shifts by one row for the padding id 0;
- `lm/softmax/W` `(V, P)` and `lm/softmax/b` `(V,)`, shared by both directions: `ElmoForBiLM.softmax` as is;
- the forget-gate bias of 1.0 is added at run time and is not stored (`forget_bias = 1.0` in the config);
- optimizer slots (`*/Adagrad`), `global_step` and `train_perplexity` are not part of the model.
"""

import re
from pathlib import Path

import torch

from ..io.files import MODEL_FOLDER, ElmoInputError, check_output, write_output
from ..modeling_elmo import ElmoForBiLM
from ..pretrained_elmo import add_origin
from ..tokenization_elmo import ElmoTokenizer
from ..training.warm_state import add_warm_state
from ..word_vocabulary import read_word_vocabulary
from .original_format import config_from_options, load_options, not_described_error, weight_links
from .tf_checkpoint import TFCheckpoint

_LSTM_NAME = re.compile(r"RNN_(\d+)/RNN/MultiRNNCell/Cell(\d+)/LSTMCell/(W_0|B|W_P_0)")
_LSTM_PARTS = {"W_0": "kernel", "B": "bias", "W_P_0": "projection/kernel"}
SOFTMAX_WEIGHT, SOFTMAX_BIAS = "lm/softmax/W", "lm/softmax/b"
TRAINING_STATE = ("global_step", "train_perplexity")
"""Variables bilm-tf's `train()` saves that are not part of the model (besides the optimizer's `*/Adagrad` slots)."""


def checkpoint_name(hdf5_name: str) -> str:
    """The bilm-tf training-checkpoint name of a `weights.hdf5` dataset name."""
    lstm = _LSTM_NAME.fullmatch(hdf5_name)
    if lstm:
        direction, layer, part = lstm.groups()
        return f"lm/RNN_{direction}/rnn/multi_rnn_cell/cell_{layer}/lstm_cell/{_LSTM_PARTS[part]}"
    return f"lm/{hdf5_name}"


class _VariableReader:
    def __init__(self, checkpoint: TFCheckpoint, options_source: str):
        self.checkpoint = checkpoint
        self.options_source = options_source

    def read(self, name: str, shape: tuple, why: str) -> torch.Tensor:
        variable = self.checkpoint.variables.get(name)
        if variable is None:
            raise ElmoInputError(f"{self.checkpoint.index_path}: missing variable {name!r} ({why})")
        if variable.shape != tuple(shape):
            raise ElmoInputError(
                f"{self.checkpoint.index_path}: variable {name!r} has shape {variable.shape}, but "
                f"{self.options_source} implies {tuple(shape)} ({why})"
            )
        if variable.dtype_name not in ("float32", "float16", "float64"):
            raise ElmoInputError(
                f"{self.checkpoint.index_path}: variable {name!r} has type {variable.dtype_name}, expected float32"
            )
        tensor = torch.from_numpy(self.checkpoint.read(name)).float()
        if not torch.isfinite(tensor).all():
            raise ElmoInputError(f"{self.checkpoint.index_path}: variable {name!r} contains NaN or infinite values")
        return tensor


def _options_for(checkpoint: TFCheckpoint, options_path) -> tuple[dict, str]:
    path = Path(options_path) if options_path is not None else checkpoint.prefix.parent / "options.json"
    if options_path is None and not path.is_file():
        raise ElmoInputError(
            f"{path}: no options.json beside the checkpoint (bilm-tf saves it there); give it with --options"
        )
    options = load_options(path)
    if options.get("bidirectional") is False:
        raise ElmoInputError(f"{path}: bidirectional is false; only bidirectional biLMs can be converted")
    if "char_cnn" not in options:
        raise ElmoInputError(f"{path}: no char_cnn section; only character-input biLMs can be converted")
    return options, str(path)


def load_bilm_tf_checkpoint(checkpoint_path, options_path=None, vocab_path=None) -> tuple[ElmoForBiLM, list | None]:
    """The `ElmoForBiLM` (eval mode) of a bilm-tf training checkpoint, and its word list if `vocab_path` is given.

    Args:
        checkpoint_path: the checkpoint folder (`tf_save_dir`, with its `checkpoint` state file), a prefix
            (`.../model.ckpt-N`) or the `.index` file.
        options_path: `options.json`; default: the one bilm-tf saved beside the checkpoint.
        vocab_path: the vocabulary file the model was trained with (one token per line); its length must equal
            the softmax's rows.
    """
    checkpoint = TFCheckpoint(checkpoint_path)
    options, options_source = _options_for(checkpoint, options_path)
    config = config_from_options(options, source=options_source)
    reader = _VariableReader(checkpoint, options_source)

    if SOFTMAX_WEIGHT not in checkpoint:
        raise ElmoInputError(
            f"{checkpoint.index_path}: missing variable {SOFTMAX_WEIGHT!r} (the word softmax of a bilm-tf training "
            "checkpoint)"
        )
    softmax_shape = checkpoint.variables[SOFTMAX_WEIGHT].shape
    if len(softmax_shape) != 2:
        raise ElmoInputError(
            f"{checkpoint.index_path}: variable {SOFTMAX_WEIGHT!r} has shape {softmax_shape}, expected (vocabulary "
            f"size, lstm.projection_dim = {config.projection_dim})"
        )
    vocab_size = softmax_shape[0]
    declared = options.get("n_tokens_vocab")
    if declared is not None and declared != vocab_size:
        raise ElmoInputError(
            f"{options_source}: n_tokens_vocab is {declared}, but the checkpoint's softmax {SOFTMAX_WEIGHT!r} has "
            f"{vocab_size} rows"
        )
    words = None
    if vocab_path is not None:
        try:
            words = read_word_vocabulary(vocab_path)
        except (ValueError, OSError) as error:
            raise ElmoInputError(str(error)) from None
        if len(words) != vocab_size:
            raise ElmoInputError(
                f"{vocab_path}: {len(words)} words, but the checkpoint's softmax has {vocab_size} rows; give the "
                "vocabulary the model was trained with"
            )

    links = weight_links(config)
    described = {checkpoint_name(name) for link in links for name in link.datasets}
    described.update((SOFTMAX_WEIGHT, SOFTMAX_BIAS, *TRAINING_STATE))

    def optimizer_slot(name):  # accounted for with its variable: described, missing or reported itself
        variable = name.removesuffix("/Adagrad")
        return variable != name and (variable in described or variable in checkpoint)

    unused = [name for name in checkpoint.variables if name not in described and not optimizer_slot(name)]
    if unused:
        raise not_described_error(checkpoint.index_path, "variable", unused, config)
    state = {}
    for link in links:
        names = {checkpoint_name(name): shape for name, shape in link.datasets.items()}
        if link.when_absent is not None and not any(name in checkpoint for name in names):
            tensors = link.when_absent()
        else:
            tensors = link.to_model(*(reader.read(name, shape, link.why) for name, shape in names.items()))
        state.update((f"elmo.{key}", tensor.contiguous()) for key, tensor in zip(link.keys, tensors))
    projection_dim = config.projection_dim
    why = f"vocabulary of {vocab_size} words, lstm.projection_dim = {projection_dim}"
    state["softmax.weight"] = reader.read(SOFTMAX_WEIGHT, (vocab_size, projection_dim), why)
    state["softmax.bias"] = reader.read(SOFTMAX_BIAS, (vocab_size,), why)

    config.vocab_size = vocab_size
    config.dropout = float(options.get("dropout", config.dropout))
    config.num_softmax_samples = int(options.get("n_negative_samples_batch", config.num_softmax_samples))
    config.architectures = ["ElmoForBiLM"]
    with torch.device("meta"):
        model = ElmoForBiLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval(), words


def convert_bilm_tf_checkpoint(
    checkpoint_path,
    output_dir,
    vocab_path=None,
    options_path=None,
    force=False,
    warm_state_text=None,
    warm_state_sentences=2000,
) -> Path:
    """Writes the `ElmoForBiLM` of a bilm-tf training checkpoint, with its tokenizer and the word vocabulary of
    `vocab_path`, to `output_dir`; with `warm_state_text`, also a warm start state estimated from those text files.
    Nothing is written if anything fails."""
    if vocab_path is None:
        # Without its words the softmax scores nothing (perplexity refuses such a folder).
        raise ElmoInputError(
            f"{checkpoint_path}: no vocabulary given (--vocab): the checkpoint's softmax holds one row per word but "
            "not the words; give the vocabulary file the model was trained with"
        )
    inputs = [checkpoint_path, options_path, vocab_path, *(warm_state_text or [])]
    check_output(output_dir, MODEL_FOLDER, inputs, force)  # before reading large checkpoints
    model, words = load_bilm_tf_checkpoint(checkpoint_path, options_path, vocab_path)
    if warm_state_text:
        add_warm_state(model.elmo, warm_state_text, warm_state_sentences)
    tokenizer = ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token)
    tokenizer.set_word_vocabulary(words)
    add_origin(
        model.config,
        f"Converted by `hf-elmo convert` from the bilm-tf training checkpoint `{Path(checkpoint_path).name}`, with "
        f"its softmax and the {len(words):,}-word vocabulary `{Path(vocab_path).name}`.",
    )

    def write(folder):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return write_output(output_dir, write, MODEL_FOLDER, inputs, force)


__all__ = ["checkpoint_name", "convert_bilm_tf_checkpoint", "load_bilm_tf_checkpoint"]
