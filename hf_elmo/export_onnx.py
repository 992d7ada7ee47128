"""Export a model folder as an ONNX graph for onnxruntime and other ONNX runtimes.

    hf-elmo export --format onnx --model DIR --output-dir OUT [--with-state]

`OUT/model.onnx` computes `ElmoModel` with every layer: inputs `input_ids` `(batch, length, 50)` and
`attention_mask` `(batch, length)`, int64 as the tokenizer gives them (`return_tensors="np"`), plus `input_word_ids`
`(batch, length)` for models with word embeddings; outputs `last_hidden_state` `(batch, length, 2P)` and
`hidden_states` `(num_layers + 1, batch, length, 2P)`. Batch and length are dynamic axes. With `--with-state` the LSTM
state is explicit, inputs `state_hidden` `(num_layers, batch, 2P)` and `state_memory` `(num_layers, batch, 2D)` and
outputs `final_state_hidden` and `final_state_memory` (as `state=` and `use_cache=True`); without it every row starts
from the model's start state (zeros, or its warm start state). The graph is `torch.export`'s of the model, whose
values are not checked in the graph: docs/export.md says what is checked where.
"""

import logging
import warnings

import torch
from torch import nn

from .file_io import OutputKind, write_output
from .model_io import load_model_folder
from .modeling_elmo import ElmoModel

ONNX_FOLDER = OutputKind(
    "an ONNX export folder (model.onnx)", True, lambda p: p.name in ("model.onnx", "model.onnx.data")
)


class ElmoOnnxGraph(nn.Module):
    """What `model.onnx` computes: `model` with every layer, the state explicit with `with_state`."""

    def __init__(self, model: ElmoModel, with_state: bool = False):
        super().__init__()
        self.model, self.with_state = model, with_state

    def input_names(self) -> list[str]:
        names = ["input_ids", "attention_mask"]
        if self.model.config.input_word_dim:
            names.append("input_word_ids")
        return names + (["state_hidden", "state_memory"] if self.with_state else [])

    def output_names(self) -> list[str]:
        return ["last_hidden_state", "hidden_states"] + (
            ["final_state_hidden", "final_state_memory"] if self.with_state else []
        )

    def forward(self, input_ids, attention_mask, input_word_ids=None, state_hidden=None, state_memory=None):
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
        """Inputs of the traced call: two sentences of different lengths, so that no size is taken for a constant."""
        config = self.model.config
        chars = torch.zeros(2, 3, config.max_characters_per_token, dtype=torch.long)
        chars[:, :, 0] = 1
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
        chars[1, 2] = 0
        inputs = {"input_ids": chars, "attention_mask": mask}
        if config.input_word_dim:
            inputs["input_word_ids"] = mask.clone()
        if self.with_state:
            inputs["state_hidden"], inputs["state_memory"] = self.model.initial_state(2)
        return inputs

    def dynamic_shapes(self) -> dict[str, dict[int, torch.export.Dim]]:
        batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
        words = {0: batch, 1: length}
        axes = {
            "input_ids": words,
            "attention_mask": words,
            "input_word_ids": words,
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
    model = load_model_folder(ElmoModel, model_dir)
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
