"""Which computation runs each part of ELMo: one frozen description, `ElmoPaths`, and the rules that resolve "auto".

Every path computes the same function as the plain math in `modeling_elmo.py` (tested against it); they differ in
speed only. `config.paths` holds the choices (a dict in config.json, every field "auto" by default), for example
`ElmoModel.from_pretrained(folder, paths={"lstm": "reference"})`; `model.paths` shows what runs on the model's device
and dtype. `resolve` turns "auto" into a named path from the device, the dtype, training or not, and whether a graph
is being captured.
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .cpu_kernels import loops_built
from .triton_support import INTERPRETED, triton

CHOICES = {
    "char_cnn": ("reference", "distinct_words", "every_word"),
    "window_max": ("torch", "compiled", "triton"),
    "highway": ("torch", "triton"),
    "lstm": ("reference", "sorted", "static"),
    "lstm_kernels": ("torch", "compiled", "triton", "triton_fused", "triton_unfused"),
    "joint_input_product": ("by_batch_size", "joint", "separate"),
    "cuda_graphs": ("on", "off"),
    "linear": ("onednn", "torch"),
    "dropout": ("compiled", "torch"),
    "threads": ("concurrent", "single"),
}
"""The named paths of each field ("auto" besides)."""

CAPTURING = (None, "cuda_graph", "export")
"""What may be capturing the model: nothing, a CUDA graph, or `torch.export` / `torch.compile`."""


@dataclass(frozen=True)
class ElmoPaths:
    """The path of each part; "auto" chooses by `resolve`'s rules. Owners: `char_cnn_fast.py` (char_cnn, window_max,
    highway), `fast_lstm.py` (lstm "sorted"), `gpu_lstm.py` (lstm "static", lstm_kernels "triton*",
    joint_input_product), `cuda_graphs.py` (cuda_graphs), `onednn_linear.py` (linear), `cpu_kernels.py` (compiled
    loops, dropout), `cpu_threads.py` (threads)."""

    char_cnn: str = "auto"
    """"distinct_words": each distinct word once, windows inside a word's final run skipped; "every_word": the same
    operations whatever the input (no sort on the host)."""
    window_max: str = "auto"
    """The max over each filter's windows: PyTorch's products, the compiled CPU loop, or one Triton kernel."""
    highway: str = "auto"
    """The highway's elementwise part in PyTorch operations or one Triton kernel each way."""
    lstm: str = "auto"
    """"sorted": rows sorted by length, each step multiplying only the rows still running; "static": both directions
    stepped together over the whole batch with masks (static shapes, CUDA graphs)."""
    lstm_kernels: str = "auto"
    """The LSTM steps: PyTorch operations, the compiled CPU loop (sorted), Triton kernels (static; "triton": each
    step's product fused into its kernel where a captured layer runs faster so, "triton_fused" / "triton_unfused":
    always / never)."""
    joint_input_product: str = "auto"
    """Static path: each step multiplies its input together with its state, or all inputs in one product first."""
    cuda_graphs: str = "auto"
    """Replay the static path's layers and whole training steps as CUDA graphs (GPU tensors only)."""
    linear: str = "auto"
    """Large CPU matrix products through oneDNN, or PyTorch's."""
    dropout: str = "auto"
    """Training dropout masks from the compiled loops' counter-based generator, or PyTorch's."""
    threads: str = "auto"
    """Independent parts of a CPU inference pass side by side on threads, or one after the other."""

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value != "auto" and value not in allowed:
                raise ValueError(f"paths.{name} must be one of {('auto', *allowed)}, got {value!r}.")

    @classmethod
    def reference(cls) -> "ElmoPaths":
        """The plain math everywhere: the computation every other path is tested against."""
        plain = {"char_cnn": "reference", "lstm": "reference", "joint_input_product": "separate", "cuda_graphs": "off"}
        return cls(**{**dict.fromkeys(CHOICES, "torch"), **plain, "threads": "single"})

    @classmethod
    def from_value(cls, value: "ElmoPaths | dict | None") -> "ElmoPaths":
        """`config.paths` (a dict of some fields, an `ElmoPaths` or None) -> `ElmoPaths`."""
        if value is None or isinstance(value, ElmoPaths):
            return value or cls()
        if not isinstance(value, dict):
            raise ValueError(f"paths must be a dict of {tuple(CHOICES)} or an ElmoPaths, got {value!r:.100}.")
        unknown = sorted(set(value) - set(CHOICES))
        if unknown:
            raise ValueError(f"paths has no field {unknown[0]!r}; the fields are {tuple(CHOICES)}.")
        return cls(**value)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return "\n".join(f"{name}: {getattr(self, name)}" for name in CHOICES)


def _triton_runs(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of `device`: CUDA, or CPU under Triton's interpreter."""
    if triton is None:
        return False
    return device.type == "cpu" if INTERPRETED else device.type == "cuda"


def resolve(paths: ElmoPaths, device: torch.device, dtype: torch.dtype, training: bool, capturing: str | None = None):
    """`paths` with every "auto" replaced by the path that runs for parameters (or autocast) of `dtype` on `device`.

    A named path that cannot run there (Triton kernels without Triton, compiled loops without float32 CPU tensors)
    is a one-line ValueError. Under `torch.export` or `torch.compile` (`capturing="export"`) everything is the
    reference: its shapes depend on the input's shapes only.
    """
    if capturing not in CAPTURING:
        raise ValueError(f"capturing must be one of {CAPTURING}, got {capturing!r}.")
    device = torch.device(device)
    built = device.type == "cpu" and loops_built()
    return _resolve(paths, device.type, dtype, bool(training), capturing, built, _triton_runs(device))


_REFERENCE_PATHS = ElmoPaths.reference()


def exporting() -> bool:
    """Whether `torch.export` (also under `torch.onnx.export`) is tracing the model."""
    # Older PyTorch versions lack torch.compiler.is_exporting.
    return getattr(torch.compiler, "is_exporting", lambda: False)()


def paths_in_effect(config, device: torch.device, dtype: torch.dtype, training: bool) -> ElmoPaths:
    """An `ElmoConfig`'s `paths` resolved for a call on `device` with parameters of `dtype` (the autocast dtype under
    autocast). `torch.export` and `torch.compile` get the reference, whose operations and shapes depend on the
    input's shapes only."""
    if exporting() or torch.compiler.is_compiling():
        return _REFERENCE_PATHS
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    capturing = "cuda_graph" if device.type == "cuda" and torch.cuda.is_current_stream_capturing() else None
    return resolve(ElmoPaths.from_value(config.paths), device, dtype, training, capturing)


@functools.lru_cache(maxsize=256)
def _resolve(paths, device_type, dtype, training, capturing, built, triton):
    loops = built and dtype == torch.float32
    if capturing == "export":
        return ElmoPaths.reference()
    on_gpu, sixteen_bit = device_type == "cuda", dtype in (torch.bfloat16, torch.float16)
    # Only where Triton compiles for a GPU by default: interpreted kernels (the CPU tests) run where asked for.
    gpu_triton = on_gpu and triton
    auto = {
        # GPUs would wait for the host to sort and group the words.
        "char_cnn": "every_word" if on_gpu else "distinct_words",
        # On GPUs the fused window products pay for 16-bit products, and for float32 while a CUDA graph is captured
        # (PyTorch's products would then take every slot of every word).
        "window_max": (
            "triton"
            if gpu_triton and (sixteen_bit or (dtype == torch.float32 and capturing == "cuda_graph"))
            else "compiled"
            if loops
            else "torch"
        ),
        "highway": "triton" if gpu_triton else "torch",
        "lstm": "static" if on_gpu else "sorted",
        "joint_input_product": "by_batch_size",
        "cuda_graphs": "on" if on_gpu and capturing is None else "off",
        "linear": "onednn" if device_type == "cpu" else "torch",
        # Dropout draws on the tensors it is given (float32 ones also under autocast): where they are not float32 it
        # falls back by itself.
        "dropout": "compiled" if training and built else "torch",
        "threads": "concurrent" if device_type == "cpu" and not training else "single",
    }
    chosen = {name: auto[name] if getattr(paths, name) == "auto" else getattr(paths, name) for name in auto}
    if chosen["char_cnn"] == "reference":
        chosen["window_max"] = chosen["highway"] = "torch"
    lstm_kernels = paths.lstm_kernels
    if lstm_kernels == "auto":
        lstm_kernels = {"sorted": "compiled" if loops else "torch", "static": "triton" if gpu_triton else "torch"}
        lstm_kernels = lstm_kernels.get(chosen["lstm"], "torch")
    chosen["lstm_kernels"] = lstm_kernels
    needs = {
        "compiled": (loops, "the compiled CPU loops (float32 CPU tensors, a C++ compiler)"),
        "triton": (triton, "Triton and CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"),
    }
    for name in ("window_max", "highway", "lstm_kernels", "dropout"):
        value = chosen[name]
        runs, what = needs.get(value.split("_")[0], (True, ""))
        if name == "dropout" and value == "compiled":
            runs, what = built, "the compiled CPU loops (CPU tensors, a C++ compiler)"
        if not runs:
            raise ValueError(f"paths.{name}={value!r} needs {what}; got {dtype} tensors on {device_type}.")
    kernels_of = {"compiled": "sorted", "triton": "static"}.get(lstm_kernels.split("_")[0])
    if kernels_of is not None and chosen["lstm"] != kernels_of:
        raise ValueError(
            f"paths.lstm_kernels={lstm_kernels!r} runs on paths.lstm={kernels_of!r}, got {chosen['lstm']!r}."
        )
    return ElmoPaths(**chosen)


__all__ = ["CHOICES", "ElmoPaths", "exporting", "paths_in_effect", "resolve"]
