"""Loading a model for the compatibility APIs: an original `options.json` + `weights.hdf5` pair read in memory, an
hf-elmo folder, or a Hub id."""

import os
from pathlib import Path

from ..convert.original_format import load_original_elmo
from ..io.files import ElmoInputError
from ..modeling_elmo import ElmoModel
from ..pretrained_elmo import load_model_folder
from ..tokenization_elmo import ElmoTokenizer


def load_elmo(source, weight_file=None) -> tuple[ElmoModel, ElmoTokenizer]:
    """The model (eval mode) and its tokenizer: from the original pair `source` (options.json) + `weight_file`, or,
    with `weight_file` None, from `source` as an hf-elmo folder or Hub id. Bad arguments are a one-line
    `ValueError`."""
    if not isinstance(source, (str, os.PathLike)):
        raise ElmoInputError(f"expected a path or Hub id for the model, got {type(source).__name__}")
    if "://" in str(source) or "://" in str(weight_file or ""):
        raise ElmoInputError(f"{source}: URLs are not downloaded; give local files, an hf-elmo folder or a Hub id")
    if weight_file is not None and Path(weight_file) != Path(source):
        model = load_original_elmo(source, weight_file)
        return model, ElmoTokenizer(max_characters_per_token=model.config.max_characters_per_token)
    path = Path(source)
    if path.is_dir():
        model = load_model_folder(ElmoModel, path)
    elif path.suffix in (".json", ".hdf5") or path.is_file():
        raise ElmoInputError(
            f"{source}: an original options file needs its weight file (weights.hdf5); only an hf-elmo folder or "
            "a Hub id is loaded alone"
        )
    elif str(source).startswith((".", "/", "~")) or str(source).count("/") > 1:
        raise ElmoInputError(f"{source}: no such model folder (nor a Hub id, which is 'name' or 'namespace/name')")
    else:
        try:
            model = ElmoModel.from_pretrained(str(source)).eval()
        except (OSError, ValueError) as error:
            message = " ".join(str(error).split()) or type(error).__name__
            raise ElmoInputError(f"{source}: cannot load the model ({message})") from None
    try:
        tokenizer = ElmoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        if message.startswith(f"{source}: "):
            raise ElmoInputError(message) from None
        raise ElmoInputError(f"{source}: cannot load the tokenizer ({message})") from None
    return model, tokenizer
