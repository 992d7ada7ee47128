"""Convert an original ELMo (bilm-tf / AllenNLP `options.json` + `weights.hdf5`) to a Hugging Face folder.

The output folder holds `config.json`, `model.safetensors`, the tokenizer files and the remote code, and
loads with `AutoModel.from_pretrained` / `AutoTokenizer.from_pretrained`. The reading of the original format and its
weight mapping are `original_format.py`; `hf-elmo export` goes the other way with the same mapping.
"""

from pathlib import Path

from ..io.files import MODEL_FOLDER, ElmoConversionError, check_output, write_output
from ..pretrained_elmo import add_origin
from ..tokenization_elmo import ElmoTokenizer
from ..training.warm_state import add_warm_state
from .original_format import load_original_elmo


def convert(
    options_path, weights_path, output_dir, force: bool = False, warm_state_text=None, warm_state_sentences=2000
) -> Path:
    """Converts and writes `config.json`, `model.safetensors`, tokenizer files and remote code to `output_dir`;
    with `warm_state_text` (text files), also a warm start state estimated from them (`hf-elmo warm-state`)."""
    inputs = [options_path, weights_path, *(warm_state_text or [])]
    check_output(output_dir, MODEL_FOLDER, inputs, force)  # before reading large weight files
    model = load_original_elmo(options_path, weights_path)
    if warm_state_text:
        add_warm_state(model, warm_state_text, warm_state_sentences)
    add_origin(
        model.config,
        f"Converted by `hf-elmo convert` from an original bilm-tf / AllenNLP model (`{Path(options_path).name}`, "
        f"`{Path(weights_path).name}`).",
    )

    def write(folder):
        model.save_pretrained(folder)
        ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token).save_pretrained(folder)

    return write_output(output_dir, write, MODEL_FOLDER, inputs, force)


__all__ = ["ElmoConversionError", "convert"]
