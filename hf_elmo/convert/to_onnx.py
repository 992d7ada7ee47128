"""Export a model folder as an ONNX graph for onnxruntime and other ONNX runtimes.

    hf-elmo export --format onnx --model DIR --output-dir OUT [--with-state] [--quantize int8]

`OUT/model.onnx` computes `ElmoModel` with every layer: inputs `input_ids` `(batch, length, 50)` and
`attention_mask` `(batch, length)`, int64 as the tokenizer gives them (`return_tensors="np"`), plus `input_word_ids`
`(batch, length)` for models with word embeddings; outputs `last_hidden_state` `(batch, length, 2P)` and
`hidden_states` `(num_layers + 1, batch, length, 2P)`. Batch and length are dynamic axes. With `--with-state` the LSTM
state is explicit, inputs `state_hidden` `(num_layers, batch, 2P)` and `state_memory` `(num_layers, batch, 2D)` and
outputs `final_state_hidden` and `final_state_memory` (as `state=` and `use_cache=True`); without it every row starts
from the model's start state (zeros, or its warm start state). A folder saved as a task head (`architectures` in its
config.json) gives the head's logits instead (`head_outputs`), with `pair_input_ids` and `pair_attention_mask`
`(batch, pair_length, ...)` for sentence pairs and question answering. The graph is `torch.export`'s of the model
with its character encoder replaced by `DistinctWordsCharacterEncoder`, float32 whatever the folder's dtype, and is
run in onnxruntime against the PyTorch model before it is written; `--quantize int8` makes its matrix products int8,
refused below a cosine of `MIN_INT8_COSINE` to float32 per layer. The graph checks no values; `CheckedOnnxSession`
checks a feed as the PyTorch model does: docs/export.md says what is checked where.
"""

import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import CONFIG_NAME

from .. import modeling_elmo
from ..configuration_elmo import TASK_HEADS, ElmoConfig
from ..folder_files import read_json_object
from ..input_checks import check_inputs, check_pair_rows, check_pair_side
from ..io.files import OutputKind, write_output
from ..modeling_elmo import ElmoCharacterEncoder, ElmoModel
from ..pretrained_elmo import load_model_folder
from ..tokenization_elmo import ElmoTokenizer

ONNX_FOLDER = OutputKind(
    "an ONNX export folder (model.onnx)", True, lambda p: p.name in ("model.onnx", "model.onnx.data")
)


def head_outputs(head: str) -> list[str]:
    """The outputs of `model.onnx` for a folder saved as the task head `head` (one of `TASK_HEADS`): its logits."""
    return ["start_logits", "end_logits"] if head == "ElmoForQuestionAnswering" else ["logits"]


def saved_head(model_dir) -> str | None:
    """The task head (of `TASK_HEADS`) a model folder was saved as (`architectures` in its config.json), or None."""
    path = Path(model_dir) / CONFIG_NAME
    architectures = read_json_object(path, CONFIG_NAME).get("architectures") if path.is_file() else None
    if not isinstance(architectures, list):
        return None
    return next((name for name in TASK_HEADS if name in architectures), None)


class DistinctWordsCharacterEncoder(nn.Module):
    """`ElmoCharacterEncoder`'s computation in operators an exported graph keeps dynamic, with less work: each
    distinct word once (ONNX `Unique` on the rows), and the windows of every word only up to the batch's longest
    span (the slots up to a word's last change of character, `char_cnn_fast._spans`): a window beyond a word's span
    lies inside its final run of one character, whose value per filter is that character's embedding times the
    kernel summed over its width. Shares the encoder's parameters."""

    def __init__(self, encoder: ElmoCharacterEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, char_ids: torch.LongTensor, word_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """`(..., C)` character ids (and `(...)` word ids with word embeddings) -> `(..., P)`."""
        encoder = self.encoder
        batch_shape, num_chars = char_ids.shape[:-1], char_ids.shape[-1]
        words, word_index = torch.unique(char_ids.reshape(-1, num_chars), dim=0, return_inverse=True)  # (U, C)
        differs = words != words[:, -1:]
        spans = torch.where(differs, torch.arange(1, num_chars + 1), 0).amax(dim=1)  # (U,)
        widths = [conv.kernel_size[0] for conv in encoder.convolutions]
        # At least one window of the widest filter, so that every filter has a window to take the max of.
        kept = torch.clamp(spans.max() + max(widths) - 1, min=max(widths), max=num_chars)
        chars = encoder.char_embedding(words[:, :kept]).transpose(1, 2)  # (U, e, kept)
        final_char = encoder.char_embedding(words[:, -1])  # (U, e)
        per_filter = []
        for conv, width in zip(encoder.convolutions, widths):
            window_max = F.conv1d(chars, conv.weight).amax(dim=-1)  # (U, n), the windows of the first `kept` slots
            run_value = final_char @ conv.weight.sum(dim=-1).t()
            # Whether the word's final run holds a whole window: then the run's value is one of its windows.
            has_run = (spans <= num_chars - width)[:, None]
            per_filter.append(torch.where(has_run, torch.maximum(window_max, run_value), window_max))
        bias = torch.cat([conv.bias for conv in encoder.convolutions])
        # The bias and the activation commute with the max: both are monotonic.
        features = encoder.activation(torch.cat(per_filter, dim=-1) + bias)
        for highway in encoder.highways:
            features = highway(features)
        if encoder.word_embedding is None:  # the projection depends on the characters only: once per distinct word
            return encoder.projection(features)[word_index].reshape(*batch_shape, -1)
        features = torch.cat([encoder.word_embedding(word_ids.reshape(-1)), features[word_index]], dim=-1)
        return encoder.projection(features).reshape(*batch_shape, -1)


def with_distinct_words_encoder(model: nn.Module) -> nn.Module:
    """`model` with each of its `ElmoCharacterEncoder`s replaced by a `DistinctWordsCharacterEncoder` of it."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, ElmoCharacterEncoder):
                setattr(parent, name, DistinctWordsCharacterEncoder(child))
    return model


class ElmoOnnxGraph(nn.Module):
    """What `model.onnx` computes: `ElmoModel` with every layer, the state explicit with `with_state`; or a task head's
    logits, of each side of sentence pairs (questions and contexts)."""

    def __init__(self, model: nn.Module, with_state: bool = False):
        super().__init__()
        self.model, self.with_state = model, with_state
        self.head = type(model).__name__ if type(model).__name__ in TASK_HEADS else None
        self.pairs = self.head == "ElmoForQuestionAnswering" or (self.head is not None and model.config.sentence_pairs)

    def input_names(self) -> list[str]:
        names = []
        for prefix in ("", "pair_") if self.pairs else ("",):
            names += [prefix + "input_ids", prefix + "attention_mask"]
            if self.model.config.input_word_dim:
                names.append(prefix + "input_word_ids")
        return names + (["state_hidden", "state_memory"] if self.with_state else [])

    def output_names(self) -> list[str]:
        if self.head:
            return head_outputs(self.head)
        return ["last_hidden_state", "hidden_states"] + (
            ["final_state_hidden", "final_state_memory"] if self.with_state else []
        )

    def forward(
        self,
        input_ids,
        attention_mask,
        input_word_ids=None,
        state_hidden=None,
        state_memory=None,
        pair_input_ids=None,
        pair_attention_mask=None,
        pair_input_word_ids=None,
    ):
        if self.head:
            pair = dict(pair_input_ids=pair_input_ids, pair_attention_mask=pair_attention_mask)
            if pair_input_word_ids is not None:
                pair["pair_input_word_ids"] = pair_input_word_ids
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                input_word_ids=input_word_ids,
                **(pair if self.pairs else {}),
                return_dict=True,
            )
            return tuple(out[name] for name in self.output_names())
        state = (state_hidden, state_memory) if self.with_state else None
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            input_word_ids=input_word_ids,
            state=state,
            use_cache=self.with_state,
            output_hidden_states=True,
            return_dict=True,
        )
        return (out.last_hidden_state, torch.stack(out.hidden_states), *(out.state if self.with_state else ()))

    def example_inputs(self) -> dict[str, torch.Tensor]:
        """Inputs of the traced call: two sentences of different lengths, so that no size is taken for a constant (the
        second sentences of pairs one position longer, so that neither length is taken for the other)."""
        config = self.model.config
        inputs = {}
        for prefix, length in (("", 3), ("pair_", 4)) if self.pairs else (("", 3),):
            chars = torch.zeros(2, length, config.max_characters_per_token, dtype=torch.long)
            chars[:, :, 0] = 1
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, -1] = chars[1, -1] = 0
            inputs.update({prefix + "input_ids": chars, prefix + "attention_mask": mask})
            if config.input_word_dim:
                inputs[prefix + "input_word_ids"] = mask.clone()
        if self.with_state:
            inputs["state_hidden"], inputs["state_memory"] = self.model.initial_state(2)
        return inputs

    def dynamic_shapes(self) -> dict[str, dict[int, torch.export.Dim]]:
        batch, length, pair_length = (torch.export.Dim(name) for name in ("batch", "length", "pair_length"))
        words, pair_words = {0: batch, 1: length}, {0: batch, 1: pair_length}
        axes = {
            "input_ids": words,
            "attention_mask": words,
            "input_word_ids": words,
            "pair_input_ids": pair_words,
            "pair_attention_mask": pair_words,
            "pair_input_word_ids": pair_words,
            "state_hidden": {1: batch},
            "state_memory": {1: batch},
        }
        return {name: axes[name] for name in self.input_names()}


# What the export is checked on: the exported graph against the PyTorch model, the int8 graph against float32.
CHECK_SENTENCES = [
    "The cat sat on the mat .",
    "A quick brown fox jumps over the lazy dog near the river bank .",
    "Stocks fell 3.5 % on Tuesday after the central bank raised interest rates again .",
    "She said : “ I will not go , ” and closed the door .",
    "Photosynthesis converts light energy into chemical energy stored in glucose .",
    "Why ?",
]
QUANTIZATIONS = ("int8",)
# The least mean cosine per layer of the int8 graph's vectors to float32's on the check sentences.
MIN_INT8_COSINE = 0.999


def check_inputs_of(graph: "ElmoOnnxGraph", model_dir) -> dict[str, torch.Tensor]:
    """The check sentences as the graph's inputs, made by the folder's tokenizer (by `ElmoTokenizer` for a folder
    without one); sentence pairs: the first half with the second."""
    config = graph.model.config
    if (Path(model_dir) / "tokenizer_config.json").is_file():
        try:
            tokenizer = ElmoTokenizer.from_pretrained(model_dir)
        except Exception as error:  # json, OSError, ValueError from the tokenizer files
            message = " ".join(str(error).split()) or type(error).__name__
            raise ValueError(f"{model_dir}: cannot load the tokenizer to check the export ({message})") from None
    else:
        tokenizer = ElmoTokenizer(max_characters_per_token=config.max_characters_per_token)
    half = len(CHECK_SENTENCES) // 2
    texts = (CHECK_SENTENCES[:half], CHECK_SENTENCES[half:]) if graph.pairs else (CHECK_SENTENCES,)
    batch = tokenizer(*texts, padding=True, return_tensors="pt")
    inputs = {}
    for name in graph.input_names():
        if name in batch:
            inputs[name] = batch[name]
        elif name.endswith("input_word_ids"):  # a tokenizer without the word vocabulary: any valid ids do
            inputs[name] = batch[name.replace("input_word_ids", "attention_mask")].clone()
    if graph.with_state:
        inputs["state_hidden"], inputs["state_memory"] = graph.model.initial_state(len(CHECK_SENTENCES))
    return inputs


def layer_cosines(expected: np.ndarray, actual: np.ndarray, real: np.ndarray) -> list[float]:
    """Per layer of `(L + 1, B, T, 2P)` `hidden_states`: the mean cosine of the vectors at the `(B, T)` real
    positions."""
    result = []
    for want, got in zip(expected, actual):
        want, got = want[real].astype(np.float64), got[real].astype(np.float64)
        norms = np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1)
        result.append(float(np.mean((want * got).sum(-1) / np.maximum(norms, np.finfo(np.float64).tiny))))
    return result


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _check_float32(path: Path, graph: "ElmoOnnxGraph", inputs: dict, expected: list[torch.Tensor]):
    """onnxruntime loads and runs the written graph and gives the PyTorch model's outputs on the check inputs."""
    try:
        outputs = _session(path).run(None, {name: value.numpy() for name, value in inputs.items()})
    except Exception as error:  # onnxruntime raises its own kinds
        message = " ".join(str(error).split())
        raise ValueError(f"{path.name}: onnxruntime cannot run the exported graph ({message})") from None
    for name, got, want in zip(graph.output_names(), outputs, expected):
        want = want.numpy()
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))
        diff = float(np.abs(got - want).max(initial=0.0))
        if not np.isfinite(got).all() or not diff <= 1e-4 * scale:
            raise ValueError(
                f"{path.name}: onnxruntime's {name} differs from the PyTorch model's by {diff:.3g} on the check "
                "sentences (expected within 1e-4 of its largest value); not written"
            )


def _quantize_time_loops(model) -> int:
    """The matrix products with a constant weight inside the `Scan` bodies of an ONNX `model` (the LSTM's state
    products, which `quantize_dynamic` leaves in float32) as onnxruntime's `DynamicQuantizeMatMul`: int8 weights
    with one scale per output column, the state quantised at run time. Returns how many were replaced."""
    import onnx

    replaced = 0
    for node in model.graph.node:
        if node.op_type != "Scan":
            continue
        body = next(attribute for attribute in node.attribute if attribute.name == "body").g
        weights = {tensor.name: tensor for tensor in body.initializer}
        nodes, quantized = [], set()
        for inner in body.node:
            if inner.op_type != "MatMul" or inner.input[1] not in weights:
                nodes.append(inner)
                continue
            weight = onnx.numpy_helper.to_array(weights[inner.input[1]]).astype(np.float32)  # (K, N)
            scale = np.maximum(np.abs(weight).max(axis=0), np.finfo(np.float32).tiny) / 127
            name = inner.input[1] + "_int8"
            body.initializer.extend(
                onnx.numpy_helper.from_array(value, name + suffix)
                for value, suffix in (
                    (np.clip(np.round(weight / scale), -127, 127).astype(np.int8), ""),
                    (scale.astype(np.float32), "_scale"),
                    (np.zeros(scale.shape, np.int8), "_zero_point"),
                )
            )
            inputs = [inner.input[0], name, name + "_scale", name + "_zero_point"]
            nodes.append(
                onnx.helper.make_node(
                    "DynamicQuantizeMatMul",
                    inputs,
                    list(inner.output),
                    name=inner.name + "_int8",
                    domain="com.microsoft",
                )
            )
            quantized.add(inner.input[1])
        replaced += len(quantized)
        del body.node[:]
        body.node.extend(nodes)
        kept = [tensor for tensor in body.initializer if tensor.name not in quantized]
        del body.initializer[:]
        body.initializer.extend(kept)
    if replaced and not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return replaced


def _quantize_int8(float_path: Path, path: Path, inputs: dict, real: np.ndarray) -> list[float]:
    """`float_path` quantised to `path`: onnxruntime's dynamic int8 quantisation (int8 weights, activations
    quantised at run time) of the products outside the time loops (not the convolutions, whose int8 kernels are
    slower than float32's), then of those inside them (`_quantize_time_loops`) -> the mean cosine per layer of its
    vectors to float32's on the check inputs."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantizer_log = logging.getLogger()  # onnxruntime's quantizer notes its shape inference on the root logger
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)
    try:
        quantize_dynamic(float_path, path, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    finally:
        quantizer_log.setLevel(level)
    model = onnx.load(str(path))
    if _quantize_time_loops(model):
        onnx.save(model, str(path))
    feed = {name: value.numpy() for name, value in inputs.items()}
    (expected,) = _session(float_path).run(["hidden_states"], feed)
    (actual,) = _session(path).run(["hidden_states"], feed)
    cosines = layer_cosines(expected, actual, real)
    if min(cosines) < MIN_INT8_COSINE:
        shown = ", ".join(f"{c:.5f}" for c in cosines)
        raise ValueError(
            f"--quantize int8: the int8 graph's vectors are too far from float32's (mean cosine per layer {shown} on "
            f"the check sentences, expected at least {MIN_INT8_COSINE}); not written: use the float32 export"
        )
    return cosines


# The key of the model's config (JSON) in `model.onnx`'s metadata, which `CheckedOnnxSession` reads.
CONFIG_METADATA_KEY = "hf_elmo_config"


# The tensor types of the graphs' inputs, as onnxruntime names them.
ONNX_TENSOR_DTYPES = {"tensor(int64)": np.dtype(np.int64), "tensor(float)": np.dtype(np.float32)}


class CheckedOnnxSession:
    """An onnxruntime session of an exported `model.onnx` whose `run` first checks its inputs as the PyTorch model
    does (`input_checks.check_inputs`, with the config the export wrote into the graph's metadata): a missing or
    unknown input, a wrong shape, dtype or value (character ids out of range, left padding, a mask over padding rows,
    rows of different batch sizes) is a one-line `ValueError` naming the input, before onnxruntime runs.
    `session_options` and `providers` go to `onnxruntime.InferenceSession`."""

    def __init__(self, path, session_options=None, providers=("CPUExecutionProvider",)):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), session_options, providers=list(providers))
        metadata = self.session.get_modelmeta().custom_metadata_map
        if CONFIG_METADATA_KEY not in metadata:
            raise ValueError(f"{path}: no {CONFIG_METADATA_KEY} in its metadata: not written by hf-elmo export")
        self.config = ElmoConfig.from_dict(json.loads(metadata[CONFIG_METADATA_KEY]))
        self.input_names = [i.name for i in self.session.get_inputs()]
        # onnxruntime names no input when a feed's dtype differs from the graph's ("Unexpected input data type").
        self.input_dtypes = {i.name: ONNX_TENSOR_DTYPES.get(i.type) for i in self.session.get_inputs()}
        self.framed = self.session.get_outputs()[0].name in ("logits", "start_logits")  # a task head's graph

    def check(self, feed: dict):
        """Raises a one-line `ValueError` naming the first input of `feed` (name -> numpy array) that the graph
        cannot take."""
        missing, unknown = set(self.input_names) - set(feed), set(feed) - set(self.input_names)
        if missing or unknown:
            raise ValueError(
                f"the graph's inputs are {', '.join(self.input_names)}; missing {sorted(missing)}, unknown "
                f"{sorted(unknown)}"
            )
        for name, value in feed.items():
            if not isinstance(value, np.ndarray):
                raise ValueError(f"{name} must be a numpy array (return_tensors='np'), got {type(value).__name__}")
            expected = self.input_dtypes[name]
            if expected is not None and value.dtype != expected:
                raise ValueError(f"{name} must have dtype {expected} (the graph's), got {value.dtype}")
        state = None
        if "state_hidden" in feed:
            state = tuple(torch.from_numpy(feed[name]) for name in ("state_hidden", "state_memory"))
        pairs = "pair_input_ids" in feed
        for prefix in ("", "pair_") if pairs else ("",):
            tensors = [feed.get(prefix + name) for name in ("input_ids", "attention_mask", "input_word_ids")]
            tensors = [None if value is None else torch.from_numpy(value) for value in tensors]
            try:
                mask = check_inputs(self.config, *tensors, state=state, dtype=torch.float32, framed=self.framed)
            except ValueError as error:  # its messages name the first side's inputs
                raise ValueError(f"{prefix}input_ids, {prefix}attention_mask: {error}" if prefix else error) from None
            if pairs:
                check_pair_side(prefix, mask)
        if pairs:
            check_pair_rows(len(feed["input_ids"]), len(feed["pair_input_ids"]))

    def run(self, output_names, feed: dict, run_options=None) -> list[np.ndarray]:
        """`onnxruntime.InferenceSession.run` after `check(feed)`."""
        self.check(feed)
        return self.session.run(output_names, feed, run_options)


@dataclass
class OnnxExport:
    """What `export_onnx` wrote: the folder, and for an int8 graph the mean cosine per layer of its vectors to
    float32's on the check sentences."""

    folder: Path
    int8_cosines: list[float] | None = None


def export_onnx(
    model_dir, output_dir, with_state: bool = False, force: bool = False, quantize: str | None = None
) -> OnnxExport:
    """Writes `model.onnx` of the model in `model_dir` to `output_dir` (the module docstring), in float32 whatever
    the folder's dtype, or int8 with `quantize="int8"`; checks it in onnxruntime on `CHECK_SENTENCES` before it is
    moved into place."""
    for package in ("onnx", "onnxscript", "onnxruntime"):  # torch.onnx's exporter; the check
        try:
            __import__(package)
        except ImportError:
            raise ValueError(
                f"--format onnx needs the package {package}: pip install 'hf-elmo[onnx]' (onnx, onnxscript, "
                "onnxruntime)"
            ) from None
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"--quantize: expected one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    head = saved_head(model_dir)
    if head and with_state:
        raise ValueError(
            f"--with-state: {model_dir} holds a task head ({head}), whose model.onnx computes its logits from each "
            "sentence's start state; only a biLM's (ElmoModel, ElmoForBiLM) has the LSTM state as inputs and outputs"
        )
    if head and quantize:
        raise ValueError(
            f"--quantize: {model_dir} holds a task head ({head}); only a biLM's model.onnx (ElmoModel, ElmoForBiLM) is "
            "quantised, checked by the cosine of its layers to float32's"
        )
    # onnxruntime's CPU provider runs float32 graphs only (a float16 graph crashes it, a bfloat16 one does not
    # load): a 16-bit model is exported from its weights made float32, which holds them exactly.
    model = load_model_folder(getattr(modeling_elmo, head) if head else ElmoModel, model_dir).float()
    reference = ElmoOnnxGraph(model, with_state).eval()
    inputs = check_inputs_of(reference, model_dir)
    with torch.no_grad():
        expected = reference(**inputs)
    graph = ElmoOnnxGraph(with_distinct_words_encoder(model), with_state).eval()
    cosines = None

    def write(folder):
        # The exporter's notes on its own internals (operators of packages not installed, deprecations) are noise
        # in a command's output.
        exporter_log = logging.getLogger("torch.onnx")
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(
                    graph,
                    (),
                    kwargs=graph.example_inputs(),
                    dynamic_shapes=graph.dynamic_shapes(),
                    input_names=graph.input_names(),
                    output_names=graph.output_names(),
                    dynamo=True,
                    verbose=False,
                )
        finally:
            exporter_log.setLevel(level)
        program.model.metadata_props[CONFIG_METADATA_KEY] = model.config.to_json_string(use_diff=False)
        float_path = folder / ("model.float32.onnx" if quantize else "model.onnx")
        program.save(str(float_path))
        _check_float32(float_path, graph, inputs, expected)
        if quantize:
            nonlocal cosines
            cosines = _quantize_int8(float_path, folder / "model.onnx", inputs, inputs["attention_mask"].bool().numpy())
            float_path.unlink()

    return OnnxExport(write_output(output_dir, write, ONNX_FOLDER, [model_dir], force), cosines)


__all__ = ["CheckedOnnxSession", "DistinctWordsCharacterEncoder", "ElmoOnnxGraph", "OnnxExport", "export_onnx"]
