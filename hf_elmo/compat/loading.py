"""Loading a model for the compatibility APIs: an original `options.json` + `weights.hdf5` pair read in memory, an
hf-elmo folder, or a Hub id."""

import os
from pathlib import Path

from ..character_rows import MAX_WORD_LENGTH
from ..configuration_elmo import ElmoConfig
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


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping (`MemAvailable`, Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_padded_batch(where: str, rows: int, positions: int, config: ElmoConfig | None = None) -> None:
    """Refuses, before anything is allocated, a batch of `rows` sentences padded to `positions` whose padded tensors
    would not fit in the memory available: the character ids `(rows, positions, 50)` int64 and their framed copy,
    and with `config` the layers `(num_layers + 1)` x `(rows, positions, 2P)` float32 returned and a copy of each
    (the LSTM itself runs on the words only). A sentence far longer than the others pads every row to its length:
    the message says so."""
    padded = rows * positions
    per_position = 2 * 8 * MAX_WORD_LENGTH
    if config is not None:
        per_position += 2 * 4 * (config.num_layers + 1) * 2 * config.projection_dim
    needed, available = padded * per_position, available_memory()
    if available is not None and needed > available:
        raise ElmoInputError(
            f"{where}: {rows:,} sentences padded to the longest, {positions:,} positions, need about "
            f"{needed / 2**30:,.1f} GiB for their padded tensors, more than the {available / 2**30:,.1f} GiB "
            "available; give the longest sentences batches of their own (or smaller batches)"
        )
