"""`hf-elmo export`: a model folder back to the original options.json + weights.hdf5 (`export_original_elmo`), or to
an ONNX graph (`export_onnx`)."""

from dataclasses import dataclass

from ..convert.to_onnx import export_onnx
from ..convert.to_original import export
from .command_line import option
from .launch import check_one_process


@dataclass(kw_only=True)
class ExportOptions:
    model: str = option(help="folder written by hf-elmo convert or save_pretrained")
    output_dir: str = option(help="folder to write (must be empty or absent)")
    format: str = option(
        "original",
        help="original: options.json + weights.hdf5; onnx: model.onnx with dynamic batch and length (docs/export.md)",
        choices=("original", "onnx"),
    )
    with_state: bool = option(
        False,
        help="onnx: the LSTM state as explicit inputs (state_hidden, state_memory) and outputs (final_state_*)",
        flag=True,
    )
    quantize: str | None = option(
        None,
        help="onnx: int8 weights (onnxruntime's dynamic quantisation), refused if the mean cosine of a layer's "
        "vectors to float32's is below 0.999 on the check sentences",
        choices=("int8",),
    )
    force: bool = option(False, help="replace an earlier export in that folder", flag=True)


COMMAND_OPTIONS = ExportOptions


def run(options) -> int:
    """`options`: the fields of `ExportOptions`, as parsed."""
    check_one_process("export")
    if options.format == "onnx":
        written = export_onnx(
            options.model,
            options.output_dir,
            with_state=options.with_state,
            force=options.force,
            quantize=options.quantize,
        )
        if written.int8_cosines is None:
            print(f"model.onnx written to {written.folder}")
        else:
            cosines = ", ".join(f"{c:.5f}" for c in written.int8_cosines)
            print(f"model.onnx (int8) written to {written.folder}; mean cosine to float32 per layer: {cosines}")
        return 0
    if options.with_state:
        raise ValueError("--with-state: only --format onnx has the LSTM state as inputs and outputs")
    if options.quantize:
        raise ValueError("--quantize: only --format onnx has int8 weights")
    print(f"options.json and weights.hdf5 written to {export(options.model, options.output_dir, force=options.force)}")
    return 0
