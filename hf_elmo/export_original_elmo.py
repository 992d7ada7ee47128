"""Export an ELMo folder back to the original format: `options.json` + `weights.hdf5` (bilm-tf / AllenNLP).

    hf-elmo export --model DIR --output-dir OUT
    hf-elmo export --format onnx --model DIR --output-dir OUT [--with-state]   (`export_onnx.py`)

The datasets are the inverse of `hf-elmo convert`, from the one mapping both use
(`convert_original_elmo.weight_links`): a converted model exports back to its original file bit for bit, and a
model trained or fine-tuned here loads in AllenNLP's `Elmo` and bilm-tf's `BidirectionalLanguageModel`.
`CNN_proj` is always written (AllenNLP requires it), also for bilm-tf models that had none because F == P.
Models reading a character vocabulary or word embeddings (ELMoForManyLangs conversions) have no equivalent in
that format and are refused.
"""

import argparse
import json
import warnings
from pathlib import Path

from .convert_original_elmo import hdf5_datasets_from_state_dict, options_from_config
from .export_onnx import export_onnx
from .file_io import ORIGINAL_FOLDER, HDF5Output, check_output, write_output
from .model_io import load_model_folder
from .modeling_elmo import ElmoModel


def export(model_dir, output_dir, force: bool = False) -> Path:
    """Writes `options.json` and `weights.hdf5` of the model in `model_dir` to `output_dir`."""
    check_output(output_dir, ORIGINAL_FOLDER, [model_dir], force)
    model = load_model_folder(ElmoModel, model_dir)
    options = options_from_config(model.config)
    if model.config.warm_state:
        warnings.warn(
            f"{model_dir}: the original format has no place for the model's warm start state; it is not exported "
            "(the exported model starts every sentence from zeros).",
            stacklevel=2,
        )
    datasets = hdf5_datasets_from_state_dict(model.state_dict(), model.config)

    def write(folder):
        # allow_nan=False: NaN is not JSON (the config's floats are checked finite, so this never triggers)
        (folder / "options.json").write_text(json.dumps(options, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        with HDF5Output(folder / "weights.hdf5") as output:
            for name, array in datasets.items():
                output.file.create_dataset(name, data=array)

    return write_output(output_dir, write, ORIGINAL_FOLDER, [model_dir], force)


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--model", required=True, help="folder written by hf-elmo convert or save_pretrained")
    parser.add_argument("--output-dir", required=True, help="folder to write (must be empty or absent)")
    parser.add_argument(
        "--format", choices=("original", "onnx"), default="original",
        help="original: options.json + weights.hdf5; onnx: model.onnx with dynamic batch and length (docs/export.md)",
    )  # fmt: skip
    parser.add_argument(
        "--with-state", action="store_true",
        help="onnx: the LSTM state as explicit inputs (state_hidden, state_memory) and outputs (final_state_*)",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace an earlier export in that folder")


def run(args: argparse.Namespace) -> int:
    if args.format == "onnx":
        output = export_onnx(args.model, args.output_dir, with_state=args.with_state, force=args.force)
        print(f"model.onnx written to {output}")
        return 0
    if args.with_state:
        raise ValueError("--with-state: only --format onnx has the LSTM state as inputs and outputs")
    print(f"options.json and weights.hdf5 written to {export(args.model, args.output_dir, force=args.force)}")
    return 0


__all__ = ["export"]
