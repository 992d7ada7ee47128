"""The rules that resolve "auto" in `ElmoPaths` (`compute_paths.py`) for a call: from the device, the dtype, training
or not, what captures the model, the model's sizes and what this machine can run (the compiled CPU loops built,
Triton, oneDNN's products). `model.paths` is `paths_in_effect` of its config; a named path that cannot run there is
a one-line ValueError."""

import functools

import torch

from .compute_paths import (
    CAPTURING,
    MAX_COMPILED_STEP_MULTIPLY_ADDS,
    ElmoPaths,
    exporting,
    onednn_products,
)
from .cpu_kernels import loops_built, packed_products_built
from .triton_support import INTERPRETED, triton


def _triton_runs(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of `device`: CUDA, or CPU under Triton's interpreter."""
    if triton is None:
        return False
    return device.type == "cpu" if INTERPRETED else device.type == "cuda"


def resolve(
    paths: ElmoPaths,
    device: torch.device,
    dtype: torch.dtype,
    training: bool,
    capturing: str | None = None,
    *,
    step_multiply_adds: int = 0,
    word_embeddings: bool = False,
):
    """`paths` with every "auto" replaced by the path that runs for parameters (or autocast) of `dtype` on `device`,
    for a model whose LSTM steps take `step_multiply_adds` per row (`5 D P`) and which reads word embeddings or not.

    A named path that cannot run there (Triton kernels without Triton, compiled loops without float32 CPU tensors,
    oneDNN without CPU tensors) is a one-line ValueError. Under `torch.export` or `torch.compile`
    (`capturing="export"`) everything is the reference: its shapes depend on the input's shapes only.
    """
    if capturing not in CAPTURING:
        raise ValueError(f"capturing must be one of {CAPTURING}, got {capturing!r}.")
    device = torch.device(device)
    built = device.type == "cpu" and loops_built()
    large_steps = step_multiply_adds >= MAX_COMPILED_STEP_MULTIPLY_ADDS
    machine = (built, built and packed_products_built(), _triton_runs(device), onednn_products())
    model = (large_steps, bool(word_embeddings))
    return _resolve(paths, device.type, dtype, bool(training), capturing, *machine, *model)


_REFERENCE_PATHS = ElmoPaths.reference()


def paths_in_effect(config, device: torch.device, dtype: torch.dtype, training: bool) -> ElmoPaths:
    """An `ElmoConfig`'s `paths` resolved for a call on `device` with parameters of `dtype` (the autocast dtype under
    autocast). `torch.export` and `torch.compile` get the reference, whose operations and shapes depend on the
    input's shapes only."""
    if exporting() or torch.compiler.is_compiling():
        return _REFERENCE_PATHS
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    capturing = "cuda_graph" if device.type == "cuda" and torch.cuda.is_current_stream_capturing() else None
    paths = ElmoPaths.from_value(config.paths)
    step_multiply_adds = 5 * config.cell_dim * config.projection_dim
    return resolve(
        paths,
        device,
        dtype,
        training,
        capturing,
        step_multiply_adds=step_multiply_adds,
        word_embeddings=bool(config.input_word_dim),
    )


@functools.lru_cache(maxsize=256)
def _resolve(
    paths, device_type, dtype, training, capturing, built, packed, triton, onednn, large_steps, word_embeddings
):
    loops = built and dtype == torch.float32
    if capturing == "export":
        return ElmoPaths.reference()
    on_gpu, sixteen_bit = device_type == "cuda", dtype in (torch.bfloat16, torch.float16)
    # Only where Triton compiles for a GPU by default: interpreted kernels (the CPU tests) run where asked for.
    gpu_triton = on_gpu and triton
    auto = {
        # GPUs would wait for the host to sort and group the words.
        "char_cnn": "every_word" if on_gpu else "distinct_words",
        # On GPUs the fused window products pay for 16-bit products only: in float32 their weight gradient (exact
        # products, no tensor cores) costs more than PyTorch's products of every slot of every word in a captured step.
        "window_max": "triton" if gpu_triton and sixteen_bit else "compiled" if loops else "torch",
        "highway": "triton" if gpu_triton else "torch",
        "lstm": "static" if on_gpu else "sorted",
        "joint_input_product": "by_batch_size",
        "cuda_graphs": "on" if on_gpu and capturing is None else "off",
        "linear": "onednn" if device_type == "cpu" else "torch",
        # The compiled draws are float32 only: under bfloat16 autocast (resolved with its dtype) PyTorch's draw.
        "dropout": "compiled" if training and loops else "torch",
        "threads": "concurrent" if device_type == "cpu" and not training else "single",
    }
    chosen = {name: auto[name] if getattr(paths, name) == "auto" else getattr(paths, name) for name in auto}
    if chosen["char_cnn"] == "reference":
        chosen["window_max"] = chosen["highway"] = "torch"
    reasons = {}
    lstm_kernels = paths.lstm_kernels
    if lstm_kernels == "auto":
        lstm_kernels = {"sorted": "compiled" if loops else "torch", "static": "triton" if gpu_triton else "torch"}
        lstm_kernels = lstm_kernels.get(chosen["lstm"], "torch")
        # Large steps' time goes into products, which oneDNN forms faster than the BLAS the loop calls (and their few
        # operations cost little to dispatch), except at inference where the loop forms them from weights packed for
        # a step's few rows.
        if lstm_kernels == "compiled" and large_steps and (training or not packed):
            lstm_kernels = "torch"
            reasons["lstm_kernels"] = (
                f"steps of at least {MAX_COMPILED_STEP_MULTIPLY_ADDS:,} multiply-adds per row run faster in PyTorch"
                + (" in training" if packed else "")
            )
    chosen["lstm_kernels"] = lstm_kernels
    needs = {
        "compiled": (loops, "the compiled CPU loops (float32 CPU tensors, a C++ compiler)"),
        "triton": (triton, "Triton and CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"),
    }
    for name in ("window_max", "highway", "lstm_kernels", "dropout"):
        value = chosen[name]
        runs, what = needs.get(value.split("_")[0], (True, ""))
        if not runs:
            raise ValueError(f"paths.{name}={value!r} needs {what}; got {dtype} tensors on {device_type}.")
    kernels_of = {"compiled": "sorted", "triton": "static"}.get(lstm_kernels.split("_")[0])
    if kernels_of is not None and chosen["lstm"] != kernels_of:
        raise ValueError(
            f"paths.lstm_kernels={lstm_kernels!r} runs on paths.lstm={kernels_of!r}, got {chosen['lstm']!r}."
        )
    if chosen["linear"] == "onednn" and device_type != "cpu":
        raise ValueError(f"paths.linear='onednn' needs CPU tensors; got {dtype} tensors on {device_type}.")
    training_step = None
    if training:
        # Sorting the words for "distinct_words" would make the host wait for the device.
        refusal = (
            "CUDA graphs off"
            if chosen["cuda_graphs"] != "on" or not on_gpu
            else "not the static LSTM"
            if chosen["lstm"] != "static"
            else "the character CNN's distinct words"
            if chosen["char_cnn"] == "distinct_words"
            else "word embeddings (ELMoForManyLangs)"
            if word_embeddings
            else None
        )
        training_step = "captured" if refusal is None else f"direct: {refusal}"
    onednn = onednn if chosen["linear"] == "onednn" else None
    sampled_softmax = "compiled" if loops else "triton" if gpu_triton and dtype != torch.float64 else "torch"
    return ElmoPaths(
        **chosen,
        onednn=onednn,
        sampled_softmax=sampled_softmax,
        training_step=training_step,
        reasons=tuple(reasons.items()),
    )


__all__ = ["paths_in_effect", "resolve"]
