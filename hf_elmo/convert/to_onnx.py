"""Export a model folder as an ONNX graph for onnxruntime and other ONNX runtimes.

    hf-elmo export --format onnx --model DIR --output-dir OUT [--with-state]

`OUT/model.onnx` computes `ElmoModel` with every layer: inputs `input_ids` `(batch, length, 50)` and
`attention_mask` `(batch, length)`, int64 as the tokenizer gives them (`return_tensors="np"`), plus `input_word_ids`
`(batch, length)` for models with word embeddings; outputs `last_hidden_state` `(batch, length, 2P)` and
`hidden_states` `(num_layers + 1, batch, length, 2P)`. Batch and length are dynamic axes. With `--with-state` the LSTM
state is explicit, inputs `state_hidden` `(num_layers, batch, 2P)` and `state_memory` `(num_layers, batch, 2D)` and
outputs `final_state_hidden` and `final_state_memory` (as `state=` and `use_cache=True`); without it every row starts
from the model's start state (zeros, or its warm start state). A folder saved as a task head (`architectures` in its
config.json) gives the head's logits instead (`head_outputs`), with `pair_input_ids` and `pair_attention_mask`
`(batch, pair_length, ...)` for sentence pairs and question answering. The graph is `torch.export`'s of the model,
whose values are not checked in the graph: docs/export.md says what is checked where.
"""

import logging
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers.utils import CONFIG_NAME

from .. import modeling_elmo
from ..configuration_elmo import TASK_HEADS
from ..folder_files import read_json_object
from ..io.files import OutputKind, write_output
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder

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


def export_onnx(model_dir, output_dir, with_state: bool = False, force: bool = False):
    """Writes `model.onnx` of the model in `model_dir` to `output_dir` (the module docstring)."""
    for package in ("onnx", "onnxscript"):  # torch.onnx's exporter needs both
        try:
            __import__(package)
        except ImportError:
            raise ValueError(
                f"--format onnx needs the package {package}: pip install 'hf-elmo[onnx]' (onnx, onnxscript, "
                "onnxruntime)"
            ) from None
    head = saved_head(model_dir)
    if head and with_state:
        raise ValueError(
            f"--with-state: {model_dir} holds a task head ({head}), whose model.onnx computes its logits from each "
            "sentence's start state; only a biLM's (ElmoModel, ElmoForBiLM) has the LSTM state as inputs and outputs"
        )
    model = load_model_folder(getattr(modeling_elmo, head) if head else ElmoModel, model_dir)
    graph = ElmoOnnxGraph(model, with_state).eval()

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
        program.save(str(folder / "model.onnx"))

    return write_output(output_dir, write, ONNX_FOLDER, [model_dir], force)


__all__ = ["ElmoOnnxGraph", "export_onnx"]
