"""How ELMo models are read from and written to folders: the policy every ELMo model class shares.

`ElmoPreTrainedModel.from_pretrained` (`ElmoPreTrainedMixin`) is `load_pretrained`:

* weights load only from safetensors unless `use_safetensors=False` is passed: a pickle checkpoint
  (`pytorch_model.bin`) is a program that runs while it is read; transformers restricts it with `weights_only`,
  but that unpickler has had escapes;
* a model with a classifier (`has_classifier`) refuses up front to load a saved classifier into a different number
  of labels, unless `ignore_mismatched_sizes=True`, with the `RuntimeError` transformers raises for a tensor of
  another size (in one line);
* before anything is allocated, the model the configuration describes is compared with the tensors on disk (their
  headers; with `from_pretrained(None, config=..., state_dict=...)` the tensors given): a biLM tensor of another
  shape, one the configuration has no place for, and a missing one (which transformers would fill with fresh values,
  with only a warning) are refused (`_check_weights_before_loading`), as is a shard index naming a file outside the
  folder;
* loaded parameters are copied to 64-byte aligned memory (see `align_parameters`), and weights holding NaN or
  infinite values are refused.

`ElmoTokenizer.from_pretrained` is `load_tokenizer`: a tokenizer file that is not valid JSON is named, and a
`tokenizer_class` other than ElmoTokenizer (`_check_tokenizer_class`) or a tokenizer that reads characters otherwise
than the model of the same folder (`_check_tokenizer_matches_model`) is refused.

`ElmoPreTrainedModel.save_pretrained` gives the weight files the permissions of any new file (safetensors writes
them 0600; `weights_follow_umask`) and ends with `name_pipeline`: a model class with a `pipeline_class` (for its
task in `configuration_elmo.MODEL_CLASSES`) writes it into the folder's `config.json` as `custom_pipelines`, so
that `pipeline(task, model=folder, trust_remote_code=True)` uses it (its module, imported by the model's, is saved
with the remote code). `load_model_folder` is how the commands read a model folder.
"""

import glob
import importlib
import json
import os
from functools import partial
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedConfig
from transformers.utils import CONFIG_NAME, cached_file
from transformers.utils import logging as hf_logging

from .configuration_elmo import MODEL_CLASSES, model_class_entry
from .folder_files import ElmoInputError, follow_umask, json_field, read_json_object, write_atomically

_PICKLE_REFUSED = (
    "ELMo loads weights only from safetensors by default, because a pickle checkpoint (pytorch_model.bin) can run "
    "code hidden in it while loading. If you trust its origin, pass use_safetensors=False explicitly."
)
_HUB_KEYS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
_BILM_PREFIXES = ("char_encoder.", "encoder.")


def add_origin(config, line: str):
    """Adds `line` to the history of how the model was made (`config.elmo_origin`, saved in config.json, told by the
    model card)."""
    config.elmo_origin = [*(getattr(config, "elmo_origin", None) or []), line]


def describe_source(name_or_path) -> str:
    """A folder by its name (where it lies on this machine is no part of the model's history), a Hub repository by its
    id."""
    path = Path(str(name_or_path))
    return f"the folder `{path.name}`" if path.exists() else f"the Hub repository `{name_or_path}`"


def note_new_head(model, name_or_path, saved_architectures):
    """Records a task head loaded from the folder of another class (`from_pretrained`): its biLM came from there, and
    until its parameters change its head is fresh values (`untrained_head`)."""
    model_class = type(model).__name__
    if model.has_classifier and name_or_path is not None and model_class not in (saved_architectures or []):
        add_origin(model.config, f"`{model_class}` head put on the biLM of {describe_source(name_or_path)}.")
        saved = [name for name in saved_architectures or [] if name in MODEL_CLASSES] or ["a biLM"]
        their_tasks = sorted({MODEL_CLASSES[name].pipeline_task for name in saved if name in MODEL_CLASSES})
        model.fresh_head = (
            f"{name_or_path} holds {' and '.join(saved)} (config.json architectures), not {model_class}: its "
            f"{model_class} head is untrained; train it first (e.g. with Trainer), or use the folder's own task "
            f"({', '.join(their_tasks) or 'feature-extraction'})",
            _head_versions(model),
        )


def _head_versions(model) -> dict[str, int]:
    # A parameter's version counter grows with every in-place change (an optimizer step, a copied state dict).
    prefix = f"{model.base_model_prefix}."
    return {name: p._version for name, p in model.named_parameters() if not name.startswith(prefix)}


def untrained_head(model) -> str | None:
    """Why a task pipeline must not run `model`, in one line: a head loaded from the folder of another class
    (`note_new_head`) whose parameters have not changed since; None otherwise."""
    fresh = getattr(model, "fresh_head", None)
    if fresh is None or _head_versions(model) != fresh[1]:
        return None
    return fresh[0]


def installed_hub_module():
    """`hf_elmo.features.hub` (model card, pushing to the Hub) of the installed package, or None where hf_elmo is not
    installed (a saved folder's code loaded with trust_remote_code=True). Imported by its absolute name so that
    `save_pretrained`, which copies the model's relative imports into the folder, does not copy Hub code."""
    try:
        return importlib.import_module("hf_elmo.features.hub")
    except ImportError:
        return None


def safetensors_shapes(files: list[str]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in safetensors files, read from their headers (no tensor data is read)."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as tensors:
                shapes.update((name, tuple(tensors.get_slice(name).get_shape())) for name in tensors.keys())
        except Exception as error:  # safetensors raises its own error type, OSError or ValueError
            raise OSError(f"{file}: not a readable safetensors file ({' '.join(str(error).split())})") from None
    return shapes


INTEGER_BUFFERS = ("word_vectors.sorted_keys", "word_vectors.rows")
"""The model's integer tensors: the task encoder's word-vector lookup (`task_layers.ElmoWordVectors`)."""


def _check_floating_point(dtypes: dict[str, str], where: str, singular: bool = False):
    """Refuses integer and bool tensors (`dtypes`: name -> safetensors or torch dtype name) where the model holds
    floating-point ones: transformers would cast them to the model's dtype without a word. `where` names the tensors'
    source, the subject of the message (`singular`: one that takes "holds")."""
    s = "s" if singular else ""
    for name, dtype in dtypes.items():
        if not dtype.startswith(("F", "BF", "float", "bfloat")) and not name.endswith(INTEGER_BUFFERS):
            raise ValueError(
                f"{where} hold{s} '{name}' of dtype {dtype}: ELMo's weights are floating-point numbers (an integer or "
                "bool tensor would be cast to them silently)"
            )


def safetensors_dtypes(files: list[str]) -> dict[str, str]:
    """Name -> dtype (safetensors' name: `F32`, `I64`, `BOOL`, ...) of every tensor in safetensors files, from their
    headers (read after `safetensors_shapes`, which names a file it cannot read)."""
    from safetensors import safe_open

    dtypes = {}
    for file in files:
        with safe_open(file, framework="pt") as tensors:
            dtypes.update((name, tensors.get_slice(name).get_dtype()) for name in tensors.keys())
    return dtypes


def _check_weights_before_loading(cls, path, kwargs):
    """Compares the model the configuration describes with the tensors on disk (their headers), before transformers
    allocates anything (`_check_weight_shapes`); with no path, with the tensors of `state_dict=`."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    config = kwargs.get("config")
    if path is None:  # `from_pretrained(None, config=..., state_dict=...)`, as transformers allows
        state_dict = kwargs.get("state_dict")
        if isinstance(config, PreTrainedConfig) and state_dict is not None:
            shapes = {name: tuple(tensor.shape) for name, tensor in state_dict.items()}
            _check_weight_shapes(cls, config, shapes, "from_pretrained(None, ...): state_dict", singular=True)
            dtypes = {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in state_dict.items()}
            _check_floating_point(dtypes, "from_pretrained(None, ...): state_dict", singular=True)
        return
    hub = {key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
    locate = partial(cached_file, path, _raise_exceptions_for_missing_entries=False, **hub)
    files = [locate(SAFE_WEIGHTS_NAME)]
    if files[0] is None:
        index = locate(SAFE_WEIGHTS_INDEX_NAME)
        if index is None:
            return  # transformers reports the missing weights
        weight_map = json_field(read_json_object(index, "shard index"), "weight_map", index)
        shards = sorted(set(map(str, weight_map.values()))) if isinstance(weight_map, dict) else []
        outside = [shard for shard in shards if Path(shard).is_absolute() or ".." in Path(shard).parts]
        if outside:  # transformers would read it wherever it is
            raise ValueError(
                f"{path}: {SAFE_WEIGHTS_INDEX_NAME} names the shard {outside[0]!r}, outside the model folder; shards "
                "must lie in it"
            )
        files = [locate(shard) for shard in shards]
    if not isinstance(config, PreTrainedConfig):
        # ElmoConfig.from_pretrained's errors name the folder and config.json
        config = cls.config_class.from_pretrained(path, **{k: v for k, v in kwargs.items() if k != "config"})
        config = config[0] if isinstance(config, tuple) else config
    where = f"{path}: the weights ({os.path.basename(files[0])})"
    _check_weight_shapes(cls, config, safetensors_shapes(files), where)
    _check_floating_point(safetensors_dtypes(files), where)


def _check_weight_shapes(cls, config, shapes: dict[str, tuple[int, ...]], where: str, singular: bool = False):
    """A `ValueError` naming the tensor for: a biLM tensor of another shape (or a softmax of another vocabulary size),
    one the configuration has no place for (e.g. a third LSTM layer), and a missing one that transformers would fill
    with fresh values with only a warning: any biLM tensor, and any tensor at all when the weights were saved from
    this very class (a new task head or softmax is what loading into another class is for). `where` names the
    tensors' source, the subject of the message (`singular`: one that takes "holds")."""
    s = "s" if singular else ""
    prefix = f"{cls.base_model_prefix}."
    on_disk = {name.removeprefix(prefix): shape for name, shape in shapes.items()}
    with torch.device("meta"):
        expected = {name.removeprefix(prefix): tuple(t.shape) for name, t in cls(config).state_dict().items()}
    bilm = [name for name in expected if name.startswith(_BILM_PREFIXES)]
    required = expected if cls.__name__ in (config.architectures or []) else bilm
    missing = [name for name in required if name not in on_disk]
    if missing:
        raise ValueError(
            f"{where} lack{s} {len(missing)} tensor(s) of the model that config.json describes, e.g. '{missing[0]}' "
            f"{expected[missing[0]]}"
        )
    extra = [name for name in on_disk if name.startswith(_BILM_PREFIXES) and name not in expected]
    if extra:
        raise ValueError(
            f"{where} hold{s} '{extra[0]}', which the biLM of config.json (num_layers={config.num_layers}, "
            f"n_highway={config.n_highway}, {len(config.filters)} filters) has no place for"
        )
    for name in [*bilm, "softmax.weight", "softmax.bias"]:
        if name in on_disk and name in expected and on_disk[name] != expected[name]:
            raise ValueError(
                f"{where} hold{s} '{name}' of shape {on_disk[name]}, but config.json implies {expected[name]}: the "
                "configuration and the weights do not belong together"
            )


def load_pretrained(load, cls, pretrained_model_name_or_path, *model_args, use_safetensors=None, **kwargs):
    """`load(...)` (`PreTrainedModel.from_pretrained` of `cls`) with the policy of the module docstring."""
    from_files = pretrained_model_name_or_path is not None
    if use_safetensors is None and from_files:
        _refuse_pickle_checkpoints(str(pretrained_model_name_or_path), kwargs.get("subfolder", ""))
    if cls.has_classifier and not kwargs.get("ignore_mismatched_sizes") and from_files:
        _check_saved_classifier(cls, pretrained_model_name_or_path, kwargs)
    if use_safetensors is not False:
        _check_weights_before_loading(cls, pretrained_model_name_or_path, kwargs)
    try:
        safetensors_only = use_safetensors is not False
        loaded = load(pretrained_model_name_or_path, *model_args, use_safetensors=safetensors_only, **kwargs)
    except OSError as error:
        # a Hub repo without safetensors: transformers' hint ("do not set use_safetensors=True") misleads
        if use_safetensors is not None or "use_safetensors" not in str(error):
            raise
        raise OSError(f"{pretrained_model_name_or_path}: {_PICKLE_REFUSED}") from None
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    align_parameters(model)
    check_finite_weights(model, pretrained_model_name_or_path)
    note_new_head(model, pretrained_model_name_or_path, model.config.architectures)
    return loaded


def load_tokenizer(load, pretrained_model_name_or_path, *args, **kwargs):
    """`load(...)` (`PreTrainedTokenizer.from_pretrained` of `ElmoTokenizer`) with the policy of the module docstring:
    a `json.JSONDecodeError` becomes a `ValueError` naming the file, and the tokenizer's own `ValueError` names the
    folder."""
    hub = {key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
    locate = partial(cached_file, pretrained_model_name_or_path, _raise_exceptions_for_missing_entries=False, **hub)
    check_tokenizer_files(pretrained_model_name_or_path, locate)
    try:
        tokenizer = load(pretrained_model_name_or_path, *args, **kwargs)
    except ValueError as error:  # the tokenizer's checks of the values its files hold: name the folder
        if str(pretrained_model_name_or_path) in str(error):
            raise
        raise ValueError(f"{pretrained_model_name_or_path}: {error}") from None
    _check_tokenizer_class(pretrained_model_name_or_path, locate("tokenizer_config.json"))
    _check_tokenizer_matches_model(tokenizer, pretrained_model_name_or_path, locate(CONFIG_NAME))
    return tokenizer


TOKENIZER_JSON_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def check_tokenizer_files(source, locate):
    """A `ValueError` naming the first of the tokenizer's JSON files (`locate(name)`: its path, or None where the
    folder has none) that is not a JSON object: transformers reads them first, and says neither which file nor where
    in it."""
    for name in TOKENIZER_JSON_FILES:
        path = locate(name)
        if path is None:
            continue
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            where = f"line {error.lineno}, column {error.colno}"
            raise ValueError(f"{source}: {name} is not valid JSON ({where}: {error.msg})") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{source}: cannot read {name} ({error})") from None
        if not isinstance(values, dict):
            raise ValueError(f"{source}: {name} holds a JSON {type(values).__name__}, expected an object")


def _check_tokenizer_class(where, tokenizer_config_file):
    """Refuses a `tokenizer_class` other than ElmoTokenizer: `AutoTokenizer` would load that class from the folder,
    whose ids fail only once they reach the model."""
    values = json.loads(Path(tokenizer_config_file).read_text(encoding="utf-8")) if tokenizer_config_file else {}
    named = values.get("tokenizer_class") if isinstance(values, dict) else None
    if named not in (None, "ElmoTokenizer"):
        raise ValueError(
            f"{where}: tokenizer_config.json names tokenizer_class {named!r}, expected 'ElmoTokenizer': the folder's "
            "tokenizer files are not ELMo's"
        )


def _check_tokenizer_matches_model(tokenizer, where, config_file):
    """Refuses a `char_vocab.json` dropped into the folder of a model that reads UTF-8 bytes (it would switch the
    tokenizer to it), or one missing where the model reads a character vocabulary (config.json's `char_vocabulary`)."""
    if config_file is None:
        return
    try:
        model_reads_vocabulary = json.loads(Path(config_file).read_text(encoding="utf-8")).get("char_vocabulary")
    except (ValueError, OSError, AttributeError):
        return  # the model's loading reports a damaged config.json
    tokenizer_reads_vocabulary = tokenizer.char_vocabulary is not None
    if model_reads_vocabulary is not None and bool(model_reads_vocabulary) != tokenizer_reads_vocabulary:
        held = "hold" if tokenizer_reads_vocabulary else "lack"
        reads = "a character vocabulary" if model_reads_vocabulary else "UTF-8 bytes"
        raise ValueError(
            f"{where}: the tokenizer files {held} char_vocab.json but the model reads {reads} (config.json "
            f"char_vocabulary: {str(bool(model_reads_vocabulary)).lower()}): tokenizer and model do not belong "
            "together"
        )


def check_finite_weights(model, where):
    """A NaN or infinite weight makes every output NaN without a word: refused."""
    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all():
            raise ValueError(f"{where}: the weights hold NaN or infinite values in '{name}'")


def _refuse_pickle_checkpoints(path: str, subfolder: str):
    folder = os.path.join(path, subfolder)
    only_pickles = os.path.isdir(folder) and not glob.glob(os.path.join(folder, "*.safetensors*"))
    if (os.path.isfile(path) and not path.endswith(".safetensors")) or (
        only_pickles and glob.glob(os.path.join(folder, "*.bin"))
    ):
        raise OSError(f"{path}: {_PICKLE_REFUSED}")


def _check_saved_classifier(cls, pretrained_model_name_or_path, kwargs: dict):
    config = kwargs.get("config")
    if isinstance(config, PreTrainedConfig):  # the Auto classes pass the config they built from the kwargs
        requested = config.num_labels
    else:
        requested = len(kwargs["id2label"]) if kwargs.get("id2label") else kwargs.get("num_labels")
    if requested is None:
        return
    saved, _ = cls.config_class.get_config_dict(
        pretrained_model_name_or_path, **{key: kwargs[key] for key in _HUB_KEYS if key in kwargs}
    )
    saved_labels = len(saved["id2label"]) if saved.get("id2label") else saved.get("num_labels", 2)
    sized_by_labels = {name for name, entry in MODEL_CLASSES.items() if entry.sized_by_labels}
    if sized_by_labels & set(saved.get("architectures") or []) and saved_labels != requested:
        raise RuntimeError(
            f"{pretrained_model_name_or_path} holds a classifier for {saved_labels} labels but {requested} "
            "labels were requested. Load it without num_labels/id2label to keep its classifier, or pass "
            f"ignore_mismatched_sizes=True to replace the classifier with a new one for {requested} labels."
        )


def align_parameters(model):
    """Copies parameters and buffers that are not 64-byte aligned.

    Weights read from safetensors are views into the mapped file at offsets that need not be aligned, and some CPU
    kernels (nn.LSTM's) round differently on such memory: copying them makes a reloaded model compute bit for bit
    what the saved one did.
    """
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.data_ptr() % 64:
            tensor.data = tensor.data.clone()


def name_pipeline(model, save_directory):
    """Writes `custom_pipelines` for the model's `pipeline_class` into the saved `config.json` (see the module
    docstring); the in-memory config is left as it is."""
    pipeline_class = getattr(model, "pipeline_class", None)
    config_file = Path(save_directory) / CONFIG_NAME
    if pipeline_class is None or not config_file.is_file():
        return
    values = json.loads(config_file.read_text(encoding="utf-8"))
    entry = model_class_entry(type(model))
    values["custom_pipelines"] = {
        entry.pipeline_task: {
            "impl": f"{pipeline_class.__module__.rsplit('.', 1)[-1]}.{pipeline_class.__name__}",
            "pt": [entry.auto_class],
            "type": "text",
        }
    }
    write_atomically(config_file, json.dumps(values, indent=2, sort_keys=True) + "\n")


TOKENIZER_CONFIG = "tokenizer_config.json"


def write_tokenizer(model, save_directory):
    """Saves the tokenizer of a model that reads UTF-8 bytes (`model.tokenizer_class`, with the model's
    `max_characters_per_token`) into `save_directory` unless it holds a tokenizer already, so that every model folder
    loads with `AutoTokenizer` (with `trust_remote_code=True` where hf_elmo is not installed: the tokenizer's code goes
    with the model's). A model reading a character vocabulary (`config.char_vocabulary`) gets none: its vocabulary
    lives in the tokenizer, and `AutoTokenizer` on a folder without it says so."""
    if model.config.char_vocabulary or (Path(save_directory) / TOKENIZER_CONFIG).exists():
        return
    tokenizer = model.tokenizer_class(max_characters_per_token=model.config.max_characters_per_token)
    tokenizer.save_pretrained(save_directory)


def weights_follow_umask(save_directory):
    """Gives the weight files `save_pretrained` wrote into `save_directory` the permissions of any new file, as its
    other files have (safetensors creates them 0600)."""
    for path in Path(save_directory).glob("model*.safetensors"):
        follow_umask(path)


def load_model_folder(model_class, folder):
    """`model_class.from_pretrained(folder)` in eval mode for a command: a missing or damaged folder is a one-line
    `ElmoInputError`, and a checkpoint that lacks some of the model's weights is refused (transformers would fill
    them with random values)."""
    folder = Path(folder)
    if not (folder / CONFIG_NAME).is_file():
        raise ElmoInputError(
            f"{folder}: no config.json (expected a folder written by hf-elmo convert or save_pretrained)"
        )
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per load is noise in a command's output
    try:
        model, info = model_class.from_pretrained(folder, output_loading_info=True)
    except Exception as error:  # transformers, safetensors and json each raise their own kinds
        message = " ".join(str(error).split()) or type(error).__name__
        if message.startswith(f"{folder}: "):  # the loading policy's own checks name the folder already
            raise ElmoInputError(message) from None
        raise ElmoInputError(f"{folder}: cannot load the model ({message})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    problems = info.get("missing_keys") or info.get("mismatched_keys")
    if problems:
        raise ElmoInputError(f"{folder}: the weights lack or mis-size {sorted(map(str, problems))[:5]}")
    return model.eval()


__all__ = [
    "add_origin",
    "align_parameters",
    "check_finite_weights",
    "check_tokenizer_files",
    "describe_source",
    "installed_hub_module",
    "load_model_folder",
    "load_pretrained",
    "load_tokenizer",
    "name_pipeline",
    "note_new_head",
    "safetensors_dtypes",
    "safetensors_shapes",
    "untrained_head",
    "weights_follow_umask",
    "write_tokenizer",
]


class ElmoPreTrainedMixin:
    """ELMo's overrides of `PreTrainedModel` (listed before it in a model's bases): loading, saving and pushing by the
    policy above, and two uses refused that would silently break the model."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained` with ELMo's loading policy (`load_pretrained`): weights only from
        safetensors unless `use_safetensors=False`, no silent resizing of a saved classifier, aligned parameters."""
        return load_pretrained(super().from_pretrained, cls, pretrained_model_name_or_path, *model_args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus the pipeline of a tagger in `config.json` (`name_pipeline`), the
        tokenizer that reads characters as the model does unless the folder has one (`write_tokenizer`) and, where
        hf_elmo is installed, the model card as `README.md` (`hub_elmo.write_model_card`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            weights_follow_umask(save_directory)
            name_pipeline(self, save_directory)
            write_tokenizer(self, save_directory)
            hub = installed_hub_module()
            if hub is not None:
                hub.write_model_card(self, save_directory)

    def push_to_hub(self, repo_id: str, **kwargs):
        """`PreTrainedModel.push_to_hub` (weights, config, remote code of every class) whose README, in a repository
        without one, is the ELMo model card (`model_card.md`). Extra arguments `datasets` and `license` fill the
        card's metadata. Without hf_elmo installed (remote code), transformers' own `push_to_hub`."""
        hub = installed_hub_module()
        if hub is None:
            return super().push_to_hub(repo_id, **kwargs)
        return hub.push_to_hub_with_model_card(self, repo_id, **kwargs)

    def _set_gradient_checkpointing(self, enable=True, gradient_checkpointing_func=checkpoint, every_n_layers=1):
        if enable and getattr(gradient_checkpointing_func, "keywords", {}).get("use_reentrant"):
            # Reentrant checkpoints pass gradients only to inputs that take them, and character ids never do: the
            # biLM would silently get none.
            raise ValueError(
                f"{type(self).__name__} supports gradient checkpointing with use_reentrant=False only (the default); "
                "got gradient_checkpointing_kwargs with use_reentrant=True."
            )
        super()._set_gradient_checkpointing(enable, gradient_checkpointing_func, every_n_layers)

    def resize_token_embeddings(self, *args, **kwargs):
        # transformers would put a plain `nn.Embedding` in its place, whose rows are off by one (see
        # `ElmoCharacterEmbedding`): every character read as another.
        raise NotImplementedError(
            f"{type(self).__name__} has no token embeddings to resize: it reads every word by its characters, whose "
            "ids the tokenizer fixes; tokens added to ElmoTokenizer are read by their characters too, so leave "
            "resize_token_embeddings out."
        )
