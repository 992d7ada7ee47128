"""Checks of what an ELMo model is given; a problem is a one-line `ValueError` naming the input, expected vs got.

Shapes, dtypes and devices are checked on the host. The checks of values (ids in range, right padding, a finite
`state`, and for the task heads the sentence boundaries) are reduced on the device and read back in one transfer per
call: on a GPU every transfer makes the host wait for the device, so a caller that has checked a batch on the host
already (`check_bilm_batch` before moving it) calls the model with `values_checked_on_host=True`, which skips them
(as does `torch.export`, whose tensors hold no values); shapes, dtypes and devices are checked all the same.
"""

import torch

from .character_rows import boundary_rows
from .compute_paths import exporting
from .configuration_elmo import PROBLEM_TYPES, ElmoConfig

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _skips_values(values_checked_on_host: bool) -> bool:
    """Whether the checks of values are skipped: the caller checked them on the host already, or a graph is being
    exported, whose tensors hold no values (the exported graph checks no values)."""
    return values_checked_on_host or exporting()


def device_option(name: str | None) -> torch.device:
    """The device a command's `--device` names (`None`: cuda if available, else cpu); an unknown name, or cuda on a
    machine without it, is a one-line error naming the option."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: unknown device {name!r} (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def check_labels(
    config: ElmoConfig,
    labels,
    positions: torch.Size,
    split_directions: bool = False,
    values_checked_on_host: bool = False,
):
    """Validates the biLM's `(B, T, 2)` targets: integer word ids of the model's vocabulary, or -100; with
    `split_directions` (the forward LM reads the first half of the rows, the backward LM the second), -100 in the
    direction a row is not read by. `values_checked_on_host`: the caller checked the values already."""
    expected = (*positions, 2)
    if not isinstance(labels, torch.Tensor) or labels.shape != expected:
        got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(
            f"labels must have shape {expected} (batch, positions, [forward target, backward target]), got {got}."
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must hold integer word ids, got dtype {labels.dtype}.")
    if _skips_values(values_checked_on_host):
        return
    bad = (labels != -100) & ((labels < 0) | (labels >= config.vocab_size))
    if bad.any():
        raise ValueError(
            f"labels must be word ids in [0, {config.vocab_size - 1}] or -100 (no target), found "
            f"{labels[bad][0].item()}; was the vocabulary used for the data the one of this model?"
        )
    half = positions[0] // 2
    if split_directions and ((labels[:half, :, 1] != -100).any() or (labels[half:, :, 0] != -100).any()):
        raise ValueError(
            "with split_directions, the first half of the rows is read by the forward LM only and the second by the "
            "backward LM only: labels[:B/2, :, 1] and labels[B/2:, :, 0] must be -100."
        )


def check_finite_labels(labels: torch.Tensor, problem_type: str):
    """The float labels of the sequence heads (regression, multi-label): a NaN would make the loss NaN."""
    if not exporting() and not torch.isfinite(labels).all():
        raise ValueError(f"labels hold NaN or infinite values ({problem_type}): the loss would be NaN.")


def check_cached_layers(config: ElmoConfig, elmo_hidden_states: torch.Tensor, input_ids: torch.Tensor):
    """The biLM layers `(B, T, num_layers + 1, 2P)` a task head is given instead of running its frozen biLM."""
    if not config.freeze_elmo:
        raise ValueError(
            "elmo_hidden_states (cached biLM layers) cannot be used with freeze_elmo=False: the biLM being "
            "fine-tuned must run on every step."
        )
    expected = (*input_ids.shape[:2], config.num_layers + 1, config.hidden_size)
    if tuple(elmo_hidden_states.shape) != expected:
        raise ValueError(
            f"elmo_hidden_states must have shape {expected} (batch, positions, num_layers + 1, 2P) to match "
            f"input_ids, got {tuple(elmo_hidden_states.shape)}."
        )


def check_sequence_labels(labels: torch.Tensor, problem_type: str, batch_size: int, num_labels: int):
    """The labels of `ElmoForSequenceClassification` for its `problem_type` (as in transformers)."""
    if problem_type == "regression":
        if labels.shape not in ((batch_size,), (batch_size, num_labels)) or not labels.is_floating_point():
            raise ValueError(
                f"Regression labels must be floats of shape ({batch_size},) or ({batch_size}, {num_labels}), got "
                f"{labels.dtype} {tuple(labels.shape)}."
            )
        check_finite_labels(labels, problem_type)
    elif problem_type == "single_label_classification":
        if labels.shape != (batch_size,) or labels.is_floating_point():
            raise ValueError(
                f"Single-label classification needs integer labels of shape ({batch_size},), got {labels.dtype} "
                f"{tuple(labels.shape)}."
            )
        if labels.min() < 0 or labels.max() >= num_labels:
            raise ValueError(
                f"Labels must be in [0, {num_labels - 1}] (num_labels={num_labels}), got {labels.tolist()}."
            )
    elif problem_type == "multi_label_classification":
        if labels.shape != (batch_size, num_labels):
            raise ValueError(
                f"Multi-label classification needs labels of shape ({batch_size}, {num_labels}) (one 0/1 column "
                f"per label), got {tuple(labels.shape)}."
            )
        check_finite_labels(labels, problem_type)
    else:
        raise ValueError(f"Unknown problem_type {problem_type!r}; expected one of {PROBLEM_TYPES} or None.")


def check_token_labels(labels: torch.Tensor, mask: torch.Tensor, num_labels: int):
    """The `(B, T)` labels of `ElmoForTokenClassification`: a class id at word positions (of the `(B, T)` `mask`,
    boundaries included), -100 at `<S>`, `</S>` and padding."""
    if labels.shape != mask.shape:
        raise ValueError(
            f"labels must have one entry per input position, shape {tuple(mask.shape)} like attention_mask "
            f"(-100 at <S>, </S> and padding), got {tuple(labels.shape)}; "
            "hf_elmo.features.task_data.tokenize_and_align_labels builds them from per-word labels."
        )
    if labels.is_floating_point():
        raise ValueError(f"Token classification labels must be integer class ids, got {labels.dtype}.")
    is_word = torch.nn.functional.pad(mask[:, 2:], (1, 1), value=False)
    labelled = labels != -100
    if (labelled & ~is_word).any():
        row, position = (labelled & ~is_word).nonzero()[0].tolist()
        kind = "<S>" if position == 0 else "</S>" if mask[row, position] else "padding"
        raise ValueError(
            f"labels[{row}, {position}] = {int(labels[row, position])} labels a {kind} position: only words carry "
            "labels; use -100 there (labels do not match the words)."
        )
    if labelled.any() and (labels[labelled].min() < 0 or labels[labelled].max() >= num_labels):
        raise ValueError(
            f"Labels must be -100 or in [0, {num_labels - 1}] (num_labels={num_labels}), got values "
            f"{sorted(set(labels[labelled].tolist()))}."
        )


def check_answer_positions(start_positions, end_positions, context_mask: torch.Tensor):
    """`ElmoForQuestionAnswering`'s `(B,)` answer positions: both or neither, each 0 (no answer) or a position of a
    word of the `(B, Wc)` `context_mask` (word `j` at `j + 1`), the start at or before the end."""
    if start_positions is None and end_positions is None:
        return
    if start_positions is None or end_positions is None:
        raise ValueError("start_positions and end_positions go together: pass both or neither")
    words = context_mask.sum(dim=1)
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        if positions.shape != words.shape or positions.is_floating_point():
            raise ValueError(
                f"{name} must be integer positions of shape {tuple(words.shape)} (one per question), got "
                f"{positions.dtype} {tuple(positions.shape)}"
            )
        outside = ((positions < 0) | (positions > words)).nonzero()
        if len(outside):
            row = int(outside[0])
            raise ValueError(
                f"{name}[{row}] = {int(positions[row])} is outside the context: its words are at positions 1 to "
                f"{int(words[row])} of pair_input_ids (0: no answer)"
            )
    reversed_rows = (start_positions > end_positions).nonzero()
    if len(reversed_rows):
        row = int(reversed_rows[0])
        raise ValueError(
            f"start_positions[{row}] = {int(start_positions[row])} comes after end_positions[{row}] = "
            f"{int(end_positions[row])}: an answer ends at or after its start"
        )


def check_pair_given(model_name: str, pair_input_ids, reads_pairs: bool):
    """Second sentences are given to a model that reads sentence pairs, and only to one."""
    if reads_pairs and pair_input_ids is None:
        raise ValueError(
            f"{model_name} reads sentence pairs: pass pair_input_ids (and pair_attention_mask) for the second "
            "sentences, as tokenizer(text, text_pair) returns them"
        )
    if not reads_pairs and pair_input_ids is not None:
        raise ValueError(
            "pair_input_ids given to a single-sentence classifier: build a pair classifier with "
            "sentence_pairs=True, e.g. from_pretrained(folder, num_labels=..., sentence_pairs=True)"
        )


def check_pair_side(prefix: str, mask: torch.Tensor):
    """Every row of one side of a sentence pair (its `(B, T)` `mask`, boundaries included) has a word."""
    if exporting():  # a value
        return
    empty = (mask.sum(dim=1) <= 2).nonzero()
    if len(empty):
        raise ValueError(
            f"{prefix}input_ids row {int(empty[0])} has no words: each side of a sentence pair needs at least one word"
        )


def check_pair_rows(rows: int, pair_rows: int):
    """Both sides of the sentence pairs have as many rows."""
    if rows != pair_rows:
        raise ValueError(f"input_ids has {rows} rows but pair_input_ids has {pair_rows}: each sentence needs its pair")


def check_softmax_vocabulary(config: ElmoConfig):
    """`ElmoForBiLM` needs words for its softmax."""
    if config.vocab_size < 1:
        raise ValueError(
            "ElmoForBiLM needs config.vocab_size >= 1 (the words of its softmax), got "
            f"{config.vocab_size}; set it to the size of the word vocabulary."
        )


def check_bilm_batch(config: ElmoConfig, input_ids, attention_mask=None, labels=None) -> None:
    """`check_inputs` and `check_labels` of a biLM batch, as `ElmoForBiLM.forward` runs them."""
    check_inputs(config, input_ids, attention_mask)
    if labels is not None:
        check_labels(config, labels, input_ids.shape[:2])


def check_inputs(
    config: ElmoConfig,
    input_ids,
    attention_mask=None,
    input_word_ids=None,
    state=None,
    dtype: torch.dtype | None = None,
    framed: bool = False,
    values_checked_on_host: bool = False,
) -> torch.BoolTensor:
    """Validates the inputs of a model built from `config` and returns the `(B, T)` mask of real positions.

    Args:
        input_ids: `(B, T, 50)` character ids; attention_mask: `(B, T)`, right padding; input_word_ids: `(B, T)`,
            given exactly when the model has word embeddings.
        state: `(hidden, memory)`, checked against the model's sizes, the batch size, `dtype` and the device of
            `input_ids`; a state from another model of the same sizes cannot be told apart and is accepted.
        framed: also require every sentence to start with the `<S>` row and end with the `</S>` row (the task
            heads read the words between them). With a character vocabulary the model does not know the rows
            (the tokenizer holds the vocabulary): every sentence must then start with one same row and end with
            another.
        values_checked_on_host: the caller checked the values already (`check_bilm_batch` on the host): only
            shapes, dtypes and devices are checked.
    """
    if torch.jit.is_tracing():
        raise ValueError(
            "ELMo models cannot be traced by torch.jit.trace (TorchScript, as torch.onnx.export(dynamo=False) does): "
            "the trace would keep the length and the sentence lengths of its example as constants; use "
            "torch.export.export with dynamic batch and length, or hf-elmo export --format onnx (docs/export.md)."
        )
    chars = config.max_characters_per_token
    if input_ids is None:
        raise ValueError(
            f"ElmoModel needs input_ids of shape (batch, words, {chars}): character ids from ElmoTokenizer."
        )
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(
            f"input_ids must be a torch.Tensor (tokenizer(..., return_tensors='pt')), got {type(input_ids).__name__}."
        )
    if input_ids.dim() != 3 or input_ids.shape[-1] != chars:
        raise ValueError(
            f"input_ids must have shape (batch, words, {chars}), got "
            f"{tuple(input_ids.shape)}; a single sentence needs a batch axis (input_ids[None])."
        )
    if input_ids.dtype not in INTEGER_DTYPES:
        raise ValueError(f"input_ids must hold integer character ids, got dtype {input_ids.dtype}.")
    if torch.iinfo(input_ids.dtype).max < config.n_characters - 1:  # the ids were wrapped when the tensor was made
        raise ValueError(
            f"input_ids of dtype {input_ids.dtype} cannot hold this model's character ids (up to "
            f"{config.n_characters - 1}); use torch.int64, as the tokenizer returns them."
        )
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "input_word_ids": input_word_ids}
    for name, tensor in inputs.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:  # a state follows input_ids' device (_check_state)
            raise ValueError(f"{name} is on the meta device, which holds shapes but no values; pass real tensors.")
    if input_ids.shape[0] == 0:
        raise ValueError(f"input_ids is an empty batch: shape {tuple(input_ids.shape)}; pass at least one sentence.")
    if input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids is empty: shape {tuple(input_ids.shape)} has no positions; every sentence, even an "
            "empty one, needs its <S> and </S> rows (tokenize with add_special_tokens=True)."
        )
    has_word = (input_ids > 0).any(dim=-1)  # padding positions are all-zero rows
    if attention_mask is None:
        mask = has_word
    else:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape[:2]:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
            raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape[:2])} (batch, words), got {got}.")
        mask = attention_mask.bool()
    _check_word_id_shape(config, input_word_ids, input_ids.shape[:2])
    if state is not None:
        _check_state(config, state, input_ids, dtype)
    if _skips_values(values_checked_on_host):
        return mask

    lengths = mask.sum(dim=1)
    values = {
        "low": input_ids.min(),
        "high": input_ids.max(),
        "ragged": (mask != (torch.arange(mask.shape[1], device=mask.device) < lengths[:, None])).any(),
    }
    if attention_mask is not None:  # a mask of 1 over an all-zero row: the LSTM would read padding as a word
        values["over_padding"] = (mask & ~has_word).any()
    if input_word_ids is not None:
        values.update(word_low=input_word_ids.min(), word_high=input_word_ids.max())
    if state is not None:
        values["state_not_finite"] = ~(torch.isfinite(state[0]).all() & torch.isfinite(state[1]).all())
    if framed:
        values["unframed"] = ~_framed(config, input_ids, lengths)
    values = dict(zip(values, torch.stack([value.long() for value in values.values()]).tolist()))

    if values["low"] < 0 or values["high"] >= config.n_characters:
        raise ValueError(
            f"input_ids must be in [0, {config.n_characters - 1}], found values in [{values['low']}, "
            f"{values['high']}]; were they made by this model's tokenizer?"
        )
    if values.get("state_not_finite"):
        raise ValueError("state holds NaN or infinite values; every output would be NaN.")
    if values["ragged"]:
        raise ValueError("ELMo needs right-padded input: every attention_mask row must be ones then zeros.")
    if values.get("over_padding"):
        row, position = (mask & ~has_word).nonzero()[0].tolist()
        raise ValueError(
            f"attention_mask is 1 at row {row}, position {position}, whose input_ids are all zeros (padding): the "
            "LSTM would read the padding as a word. Pass the tokenizer's attention_mask."
        )
    if input_word_ids is not None:
        vocab_size, low, high = config.input_word_vocab_size, values["word_low"], values["word_high"]
        if low < 0 or high >= vocab_size:
            raise ValueError(f"input_word_ids must be in [0, {vocab_size - 1}], found values in [{low}, {high}].")
    if values.get("unframed"):
        raise ValueError(
            "The task heads need every sentence framed by the <S> and </S> rows (positions 0 and length - 1): "
            "tokenize with ElmoTokenizer and add_special_tokens=True (the default)."
        )
    return mask


def _framed(config: ElmoConfig, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Whether every sentence starts and ends with the boundary rows (a 0-d bool tensor, not read back)."""
    first = input_ids[:, 0]
    last = input_ids[torch.arange(len(input_ids), device=input_ids.device), lengths - 1]
    if config.char_vocabulary:
        return (first == first[:1]).all() & (last == last[:1]).all() & (first[0] != last[0]).any()
    bos, eos = boundary_rows(config.max_characters_per_token)
    return (first == first.new_tensor(bos)).all() & (last == last.new_tensor(eos)).all()


def _check_word_id_shape(config: ElmoConfig, input_word_ids, shape: torch.Size):
    if not config.input_word_vocab_size:
        if input_word_ids is not None:
            raise ValueError(
                "input_word_ids given, but this model has no word embeddings (config.input_word_dim = 0); they "
                "are read only by models converted from ELMoForManyLangs."
            )
        return
    if not isinstance(input_word_ids, torch.Tensor):
        raise ValueError(
            f"This model reads word embeddings beside the characters: pass input_word_ids {tuple(shape)} from its "
            f"tokenizer, got {type(input_word_ids).__name__}."
        )
    if input_word_ids.shape != shape or input_word_ids.is_floating_point() or input_word_ids.dtype == torch.bool:
        raise ValueError(
            f"input_word_ids must be integer ids of shape {tuple(shape)} (batch, words), got "
            f"{tuple(input_word_ids.shape)} of dtype {input_word_ids.dtype}."
        )


def _check_state(config: ElmoConfig, state, input_ids: torch.Tensor, dtype: torch.dtype):
    batch_size = input_ids.shape[0]
    expected = (
        (config.num_layers, batch_size, 2 * config.projection_dim),
        (config.num_layers, batch_size, 2 * config.cell_dim),
    )
    is_pair = isinstance(state, (tuple, list)) and len(state) == 2
    is_pair = is_pair and all(isinstance(t, torch.Tensor) for t in state)
    got = tuple(tuple(t.shape) for t in state) if is_pair else type(state).__name__
    if not is_pair or got != expected:
        raise ValueError(
            f"state must be (hidden, memory) of shapes {expected} (num_layers, batch, 2 * projection_dim / "
            f"2 * cell_dim) for this model and a batch of {batch_size}, got {got}."
        )
    dtypes, devices = {t.dtype for t in state}, {t.device for t in state}
    if dtypes != {dtype} or devices != {input_ids.device}:
        raise ValueError(
            f"state must be {dtype} on {input_ids.device} like the model and input_ids, got "
            f"{sorted(map(str, dtypes))} on {sorted(map(str, devices))}."
        )


__all__ = ["check_inputs", "exporting"]


def check_warm_state(config: ElmoConfig, state) -> tuple[tuple[int, int], tuple[int, int]]:
    """Checks a warm start state `(hidden, memory)` for `ElmoModel.set_warm_state` (also one row's state,
    `(num_layers, 1, 2P)` / `(num_layers, 1, 2D)`) and returns the shapes it is stored in."""
    expected = ((config.num_layers, 2 * config.projection_dim), (config.num_layers, 2 * config.cell_dim))
    is_pair = isinstance(state, (tuple, list)) and len(state) == 2
    is_pair = is_pair and all(isinstance(t, torch.Tensor) for t in state)
    shapes = [tuple(t.shape) for t in state] if is_pair else None
    squeezed = [shape[:1] + shape[2:] if len(shape) == 3 and shape[1] == 1 else shape for shape in shapes or []]
    if not is_pair or tuple(squeezed) != expected:
        raise ValueError(
            f"A warm state must be (hidden, memory) of shapes {expected[0]} and {expected[1]} (num_layers, 2 * "
            f"projection_dim / 2 * cell_dim), got {shapes if is_pair else type(state).__name__}."
        )
    if not all(torch.isfinite(t).all() for t in state):
        raise ValueError("A warm state must be finite; it contains NaN or infinite values.")
    return expected


def direction_rows(batch_size: int, split_directions: bool) -> tuple[slice, slice]:
    """The rows each direction of the biLM reads: all of them, or with `split_directions` the first and the second
    half of an even batch."""
    if not split_directions:
        return slice(None), slice(None)
    if batch_size % 2:
        raise ValueError(
            f"split_directions needs an even batch (forward rows, then as many backward rows), got {batch_size} rows."
        )
    return slice(0, batch_size // 2), slice(batch_size // 2, None)
