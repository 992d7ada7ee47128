"""Export an ELMo folder back to the original format: `options.json` + `weights.hdf5` (bilm-tf / AllenNLP).

    hf-elmo export --model DIR --output-dir OUT
    hf-elmo export --format onnx --model DIR --output-dir OUT [--with-state]   (`export_onnx.py`)

The datasets are the inverse of `hf-elmo convert`, from the one mapping both use
(`original_format.weight_links`): a converted model exports back to its original file bit for bit, and a
model trained or fine-tuned here loads in AllenNLP's `Elmo` and bilm-tf's `BidirectionalLanguageModel`.
`CNN_proj` is always written (AllenNLP requires it), also for bilm-tf models that had none because F == P.
Models reading a character vocabulary or word embeddings (ELMoForManyLangs conversions) have no equivalent in
that format and are refused.
"""

import json
import warnings
from pathlib import Path

from ..configuration_elmo import TASK_HEADS
from ..io.files import ORIGINAL_FOLDER, HDF5Output, check_output, write_output
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder
from .original_format import hdf5_datasets_from_state_dict, options_from_config


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
    heads = [name for name in model.config.architectures or [] if name in TASK_HEADS]
    if heads:
        warnings.warn(
            f"{model_dir}: the original format holds a biLM only; the task head ({', '.join(heads)}) is not exported, "
            "its biLM is.",
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


__all__ = ["export"]
