"""Compiled loops for float32 on CPUs: an LSTM layer's whole time loop, forward and backward; the sampled softmax's
row-wise log-sum-exp and its gradient; Adagrad's step; dropout with a counter-based generator; the character
CNN's max over windows and its gradient.

A step of ELMo's LSTM is two small matrix products and a dozen elementwise operations (gate nonlinearities, cell
update, clip, the cell's tanh, the output gate); as PyTorch calls from Python, dispatching them costs more than
their work (a step of the mid-size model: 32 rows of 2,048 gate inputs per direction). Here a layer's time loop is
one call: each direction runs on an OpenMP thread of its own (PyTorch's, see below), its products through the
BLAS that PyTorch itself links (`sgemm_`, single-threaded there), its elementwise part one pass over a step's rows
that also writes what the backward reads; one direction alone (the large sizes) gets every thread for its products
and rows. At inference, built for AVX-512, a call with steps of few rows packs each direction's weights into panels
first and forms those steps' products itself: a panel streams from memory once per step while a block of rows
accumulates against it in registers (the BLAS, for few rows, reads the weights slower than memory allows or without
AVX-512). The backward loop forms the gate gradients from the saved activations on the fly. `lstm_sorted.py` keeps the
packing and the products over all steps at once (input products, weight gradients) and falls back to PyTorch
operations per step wherever these loops are not available.

The source is C++ compiled on first use with the machine's C++ compiler, for the machine's own processor
(`-march=native`) and with OpenMP, into `~/.cache/hf_elmo` (or `$HF_ELMO_CACHE`), keyed by the source, the
compiler and the processor's features, written whole or not at all, its length and SHA-256 recorded after it; a
library that does not match its record (cut short, changed, or without one) is built again, never loaded (a cut one
can kill the process that loads it). It is loaded with `ctypes` (which lets go of
Python's lock during a call), so nothing is built at install time and no PyTorch headers are needed. PyTorch's
OpenMP runtime is already loaded under the same name (`libgomp.so.1`), so the loops share its threads and their
per-thread counts. Where no compiler is found, the build fails, PyTorch's BLAS does not export `sgemm_` (or gives
a wrong product in a check at load), `available()` is False; a model's `paths` turn them off for its own
computation (`"torch"` for `window_max`, `lstm_kernels` and `dropout`). The nonlinearities
use Cephes' single-precision `exp` polynomial (within two units in the last place) and `tanh(x) = 2 sigmoid(2x) -
1`, so results agree with PyTorch's to a few units in the last place, not bit for bit; the tests hold them to
float64 recomputations and to the reference path.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
import weakref
from pathlib import Path

import torch

from .folder_files import cache_file_damage, record_cache_file, remove_cache_file
from .onednn_linear import matmul_nt

_SOURCE_FILE = Path(__file__).with_name("cpu_kernels.cpp")
"""The loops' C++ source, package data beside this module (a model folder's copy of the code has none)."""


_PER_DIRECTION = ctypes.c_void_p * 2


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("K", "T", "B", "N", "D", "P")),
        *((name, ctypes.c_void_p) for name in ("batch_sizes", "offsets")),
        *(
            (name, _PER_DIRECTION)
            for name in ("state_weight", "projection_weight", "packed_state", "packed_projection")
        ),
        ("has_cell_clip", ctypes.c_bool),
        ("has_proj_clip", ctypes.c_bool),
        ("cell_clip", ctypes.c_float),
        ("proj_clip", ctypes.c_float),
        ("sgemm", ctypes.c_void_p),
    ]


_FUNCTIONS = {
    "lstm_forward_sequence": [ctypes.POINTER(_Layer), ctypes.c_int32] + [ctypes.c_void_p] * 9,
    "lstm_backward_sequence": [ctypes.POINTER(_Layer)] + [ctypes.c_void_p] * 11,
    "product_for_check": [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3,
    "logsumexp_rows": [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2,
    "logsumexp_rows_backward": [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4,
    "adagrad_step": [ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_float] * 3,
    "dropout": [ctypes.c_int64] + [ctypes.c_void_p] * 2 + [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_float],
    "window_max": [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3,
    "window_max_backward": [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 6,
    "pack_panels": [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2,
}


def _cache_folder() -> Path:
    """The folder of the built libraries, made if absent: `$HF_ELMO_CACHE/kernels` (`~/.cache/hf_elmo/kernels`)."""
    named = os.environ.get("HF_ELMO_CACHE")
    folder = Path(named or Path.home() / ".cache" / "hf_elmo") / "kernels"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        where = f"HF_ELMO_CACHE={folder.parent}" if named else str(folder.parent)
        if folder.parent.is_file():
            raise OSError(f"{where}: a file, expected a folder") from None
        raise OSError(f"{where}: no folder {folder.name}/ can be made there ({error.strerror or error})") from None
    return folder


def _warn(message: str) -> None:
    """A `RuntimeWarning` of this module shown as one line, without the source line of whichever call first used the
    loops."""
    warnings.warn_explicit(message, RuntimeWarning, __name__, 0, module=__name__)


def _processor_features() -> str:
    """What `-march=native` compiles for: a library built for one processor may not run on another."""
    try:
        return next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features"))
        )
    except (OSError, StopIteration):
        return platform.processor() + platform.machine()


def _source() -> str:
    try:
        return _SOURCE_FILE.read_text(encoding="utf-8")
    except OSError:
        raise OSError(f"their source {_SOURCE_FILE.name} is not beside {Path(__file__).name}") from None


def _build(compiler: str, target: Path) -> None:
    """Compiles the source into `target`, written whole or not at all (concurrent builds each rename their own)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        source = Path(folder) / _SOURCE_FILE.name
        source.write_text(_source())
        library = Path(folder) / target.name
        # OpenMP: the library then shares PyTorch's OpenMP runtime (already loaded under the same name) and threads.
        # Some compilers (Apple's) know neither OpenMP nor -march=native: then without.
        for flags in (["-march=native", "-fopenmp"], ["-march=native"], []):
            # No errno from sqrtf: its loops vectorize.
            command = [compiler, "-O3", "-fno-math-errno", *flags, "-shared", "-fPIC", "-o", str(library), str(source)]
            try:
                built = subprocess.run(command, capture_output=True, timeout=300).returncode == 0
            except subprocess.TimeoutExpired:
                built = False
            if built:
                os.replace(library, target)
                record_cache_file(target)
                return
    raise OSError(f"{compiler} could not build them")


def _sgemm_address() -> int | None:
    """Where `sgemm_` is in the BLAS PyTorch runs on (its x86 builds link MKL into `libtorch_cpu` and export it), or
    None."""
    folder = Path(torch.__file__).resolve().parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        try:
            return ctypes.cast(ctypes.CDLL(str(folder / name)).sgemm_, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def _products_are_right(library: ctypes.CDLL, sgemm: int) -> bool:
    """One small product through the library and `sgemm` against PyTorch's: a BLAS with other conventions than
    expected must not give wrong numbers."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, generator=generator), torch.randn(5, 4, generator=generator)
    c = torch.full((3, 4), float("nan"))
    library.product_for_check(sgemm, 3, 4, 5, a.data_ptr(), b.data_ptr(), c.data_ptr())
    # In float64, which no autocast region the first call may come from rounds.
    return bool(torch.allclose(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-6))


@functools.cache
def _library() -> tuple[ctypes.CDLL, int] | None:
    """The built library and the BLAS product it calls, or None (with a warning saying why)."""
    try:
        return _load()
    except OSError as error:
        _warn(
            f"hf_elmo's compiled CPU loops are not available ({error}): the LSTM, the sampled softmax, Adagrad and "
            "dropout run as PyTorch operations on CPUs, slower for small and mid-size models"
        )
        return None


def _load() -> tuple[ctypes.CDLL, int]:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise OSError("no C++ compiler found: set CXX or install g++ or clang++")
    sgemm = _sgemm_address()
    if sgemm is None:
        raise OSError("PyTorch's BLAS does not export sgemm_")
    key = hashlib.sha256("\0".join([_source(), compiler, _processor_features()]).encode()).hexdigest()[:16]
    target = _cache_folder() / f"cpu_kernels_{key}.so"
    # A library cut short can kill the process that loads it (a bus error): it is loaded only as it was recorded.
    if target.exists() and (damage := cache_file_damage(target)) is not None:
        _warn(f"{target}: a damaged build of the compiled CPU loops ({damage}): built again")
        remove_cache_file(target)
    if not target.exists():
        _build(compiler, target)
    library = ctypes.CDLL(str(target))
    for name, argtypes in _FUNCTIONS.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None
    for name in ("packed_panel_width", "packed_max_rows"):
        getattr(library, name).argtypes, getattr(library, name).restype = [], ctypes.c_int64
    if not _products_are_right(library, sgemm):
        raise OSError("PyTorch's sgemm_ gave a wrong product through them")
    return library, sgemm


def loops_built() -> bool:
    """Whether the compiled loops are built and loaded here (they run on float32 CPU tensors)."""
    return _library() is not None


def packed_products_built() -> bool:
    """Whether the built loops form an inference step's products of few rows from weights packed for them
    (AVX-512 processors), instead of through the BLAS."""
    library = _library()
    return library is not None and library[0].packed_max_rows() > 0


# Packed panels of frozen weights (`requires_grad` False) the loops were given, by `id` of the weight: each entry is
# dropped when its weight is freed, and not used once the weight changed in place (its version) or moved. Weights
# that train are packed at every call: an optimizer may write them where no version counts (through `.data`, or
# through pointers; the package's own Adagrad counts its writes).
_packed_panels: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}


def _panels(weight: torch.Tensor) -> torch.Tensor:
    """`(cols, inner)` float32 weight -> its panels for the packed products (kept while a frozen weight lives
    unchanged)."""
    key = id(weight)
    entry = _packed_panels.get(key)
    if entry is not None and entry[0]() is weight and entry[1:3] == (weight._version, weight.data_ptr()):
        return entry[3]
    library = _library()[0]
    cols, inner = weight.shape
    width = library.packed_panel_width()
    panels = torch.empty(-(-cols // width) * inner * width, dtype=torch.float32)
    (pointer,) = _pointers((weight, (cols, inner)))
    library.pack_panels(cols, inner, pointer, panels.data_ptr())
    if not weight.requires_grad:
        forget = functools.partial(_packed_panels.pop, key, None)
        _packed_panels[key] = (weakref.ref(weight, lambda _: forget()), weight._version, weight.data_ptr(), panels)
    return panels


def available(tensor: torch.Tensor) -> bool:
    """Whether the compiled loops run for tensors like `tensor` (float32 on a CPU, and a library built)."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.float32 and _library() is not None


def _pointers(*tensors_and_shapes) -> list[int | None]:
    """The data pointers of `(tensor, shape)` pairs, once each tensor is checked to be contiguous float32 of that
    shape: the loops trust them blindly. `None` for a tensor the loops do not read."""
    pointers = []
    for tensor, shape in tensors_and_shapes:
        if tensor is None:
            pointers.append(None)
            continue
        if tuple(tensor.shape) != shape or not tensor.is_contiguous() or tensor.dtype != torch.float32:
            raise ValueError(
                f"expected contiguous float32 of shape {shape}, got {tensor.dtype} {tuple(tensor.shape)} "
                f"with strides {tensor.stride()}"
            )
        pointers.append(tensor.data_ptr())
    return pointers


def _layer(batch_sizes, state_weights, projection_weights, batch_size, cell_clip, proj_clip, packed=False):
    """The `Layer` the loops read, and the tensors it points into (to be kept alive for the call); with `packed`,
    the weights' panels for the steps of few rows."""
    library, sgemm = _library()
    K = len(state_weights)
    if not 1 <= K <= 2:
        raise ValueError(f"expected 1 or 2 directions, got {K}")
    gate_dim, P = state_weights[0].shape
    D = gate_dim // 4
    sizes = torch.tensor(batch_sizes, dtype=torch.int64)
    offsets = torch.cumsum(sizes, 0) - sizes
    state = _pointers(*((w, (4 * D, P)) for w in state_weights))
    projection = _pointers(*((w, (P, D)) for w in projection_weights))
    panels = [(_panels(w_h), _panels(w_p)) for w_h, w_p in zip(state_weights, projection_weights)] if packed else []
    layer = _Layer(
        K,
        len(batch_sizes),
        batch_size,
        int(sizes.sum()),
        D,
        P,
        sizes.data_ptr(),
        offsets.data_ptr(),
        _PER_DIRECTION(*state),
        _PER_DIRECTION(*projection),
        _PER_DIRECTION(*(h.data_ptr() for h, _ in panels)),
        _PER_DIRECTION(*(p.data_ptr() for _, p in panels)),
        cell_clip is not None,
        proj_clip is not None,
        cell_clip or 0.0,
        proj_clip or 0.0,
        sgemm,
    )
    return library, layer, (sizes, offsets, panels)


# A call with fewer steps of few rows than this leaves the weights to the BLAS rather than pack them (packing reads
# and writes them once, about what a few steps read).
_MIN_PACKED_STEPS = 4


def _worth_packing(library, batch_sizes) -> bool:
    """Whether enough steps have few enough rows for the packed products (none where the build has none)."""
    most = library.packed_max_rows()
    return sum(1 for n in batch_sizes if 0 < n <= most) >= _MIN_PACKED_STEPS


def forward_sequence(
    batch_sizes,
    state_weight,
    projection_weight,
    cell_clip,
    proj_clip,
    save,
    gates,
    hidden0,
    memory0,
    raw_cells,
    cells,
    cell_tanh,
    cell_outputs,
    raw_outputs,
    outputs,
):
    """The time loop of one layer's forward for `K` stacked directions over `N` packed positions (`fast_lstm.py`'s
    layout: rows of step `t` from `sum(batch_sizes[:t])` on), writing into its arguments.

    Args:
        batch_sizes: `T` ints, rows running at each step (non-increasing); the batch has `B` rows.
        state_weight `(K, 4D, P)`, projection_weight `(K, P, D)` (or `K` tensors `(4D, P)`, `(P, D)`): `W_h` and
            `W_p`, gates `[input, forget, cell, output]`. Without `save`, the panels of each weight tensor given are
            packed, and a frozen one's (`requires_grad` False) kept while it lives unchanged: give the model's own
            parameters, not copies.
        gates: `(K, N, 4D)`, the input products (bias included) <- `[sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)]`.
        hidden0 `(K, B, P)`, memory0 `(K, B, D)`: the states rows start from.
        raw_cells, cells, cell_tanh, cell_outputs: with `save` (for a backward), `(K, N, D)` <- each step's cell
            before and after the clip (`raw_cells` None without a clip), its tanh and the cell output; without,
            `(K, B, D)` one step's rows, `cells` holding `memory0` and left with each row's final cell, `raw_cells`
            None.
        raw_outputs: `(K, N, P)` <- the outputs before the clip (None without a clip or without saving).
        outputs: `(K, N, P)` <- each step's new hidden state.
    """
    state_weights, projection_weights = list(state_weight), list(projection_weight)
    K, P, D = len(state_weights), state_weights[0].shape[1], projection_weights[0].shape[1]
    B, N = hidden0.shape[1], gates.shape[1]
    packed = not save and _worth_packing(_library()[0], batch_sizes)
    library, layer, keep = _layer(batch_sizes, state_weights, projection_weights, B, cell_clip, proj_clip, packed)
    if layer.N != N:
        raise ValueError(f"expected {layer.N} packed positions, got {N}")
    cell_rows = N if save else B
    library.lstm_forward_sequence(
        ctypes.byref(layer),
        save,
        *_pointers(
            (gates, (K, N, 4 * D)),
            (hidden0, (K, B, P)),
            (memory0, (K, B, D)),
            (raw_cells, (K, cell_rows, D)),
            (cells, (K, cell_rows, D)),
            (cell_tanh, (K, cell_rows, D)),
            (cell_outputs, (K, cell_rows, D)),
            (raw_outputs, (K, N, P)),
            (outputs, (K, N, P)),
        ),
    )


def backward_sequence(
    batch_sizes,
    state_weight,
    projection_weight,
    cell_clip,
    proj_clip,
    gates,
    memory0,
    raw_cells,
    cells,
    cell_tanh,
    raw_outputs,
    grad_outputs,
    grad_projected,
    grad_hidden,
    grad_memory,
):
    """The time loop of one layer's backward over what `forward_sequence` saved (same layout and arguments), in
    place: `gates` `(K, N, 4D)` from the activations to the gradients of the gate inputs, `grad_hidden` `(K, B, P)`
    and `grad_memory` `(K, B, D)` from the gradients of the final states to those of the states rows start from;
    `grad_outputs` `(K, N, P)`: of the (clipped) outputs; `grad_projected` `(K, N, P)` <- of the outputs before the
    clip."""
    state_weights, projection_weights = list(state_weight), list(projection_weight)
    K, P, D = len(state_weights), state_weights[0].shape[1], projection_weights[0].shape[1]
    B, N = grad_hidden.shape[1], gates.shape[1]
    library, layer, keep = _layer(batch_sizes, state_weights, projection_weights, B, cell_clip, proj_clip)
    if layer.N != N:
        raise ValueError(f"expected {layer.N} packed positions, got {N}")
    scratch = torch.empty(K, B, D)
    library.lstm_backward_sequence(
        ctypes.byref(layer),
        *_pointers(
            (gates, (K, N, 4 * D)),
            (memory0, (K, B, D)),
            (raw_cells, (K, N, D)),
            (cells, (K, N, D)),
            (cell_tanh, (K, N, D)),
            (raw_outputs, (K, N, P)),
            (grad_outputs, (K, N, P)),
            (grad_projected, (K, N, P)),
            (grad_hidden, (K, B, P)),
            (grad_memory, (K, B, D)),
            (scratch, (K, B, D)),
        ),
    )


def logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """`(N, S)` -> `(N,)` `torch.logsumexp(logits, dim=1)` in one pass per row."""
    rows, cols = logits.shape
    totals = logits.new_empty(rows)
    (logits_pointer,) = _pointers((logits, (rows, cols)))
    _library()[0].logsumexp_rows(rows, cols, logits_pointer, totals.data_ptr())
    return totals


def logsumexp_rows_backward(logits: torch.Tensor, totals: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of `logsumexp_rows` for the incoming `(N,)` `grad`: `exp(logits - totals) grad`, `(N, S)`."""
    rows, cols = logits.shape
    out = torch.empty_like(logits)
    pointers = _pointers((logits, (rows, cols)), (totals, (rows,)), (grad.contiguous(), (rows,)), (out, (rows, cols)))
    _library()[0].logsumexp_rows_backward(rows, cols, *pointers)
    return out


def adagrad_step(
    param: torch.Tensor, grad: torch.Tensor, total: torch.Tensor, lr: float, eps: float, scale: torch.Tensor
) -> None:
    """One Adagrad step in place on contiguous float32 `param` and its accumulator `total` (the same shape as
    `grad`), with the gradient times `scale` (a one-element float32 tensor: a clipping factor, else 1)."""
    shape = tuple(param.shape)
    pointers = _pointers((param, shape), (grad, shape), (total, shape))
    _library()[0].adagrad_step(param.numel(), *pointers, lr, eps, float(scale))


def dropout(x: torch.Tensor, threshold: int, scale: float, seed: int) -> torch.Tensor:
    """`x * scale` where the counter-based generator keeps a value (`seed`, probability `1 - threshold / 2^32`),
    0 elsewhere; the same `seed` keeps the same values."""
    x = x.contiguous()
    out = torch.empty_like(x)
    pointers = _pointers((x, tuple(x.shape)), (out, tuple(x.shape)))
    _library()[0].dropout(x.numel(), *pointers, seed, threshold, scale)
    return out


def dropout_forward(module: torch.nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """`ElmoDropout.forward` in training on `paths.dropout = "compiled"`: the mask from the counter-based generator
    (PyTorch's CPU Bernoulli draws are slow), seeded from PyTorch's CPU generator, so `torch.manual_seed` repeats it.
    Same keep probability (to 2^-32) and scaling as PyTorch's; the backward regenerates the mask instead of storing
    it."""
    if 0 < module.p < 1 and not module.inplace and available(x):
        return _CompiledDropout.apply(x, module.p)
    return torch.nn.functional.dropout(x, module.p, module.training, module.inplace)


class _CompiledDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        # As PyTorch's CPU dropout scales: float32 1 / (1 - p).
        ctx.threshold = min(round(p * 2**32), 2**32 - 1)
        ctx.scale = float(torch.tensor(1.0) / torch.tensor(1 - p, dtype=torch.float32))
        ctx.seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
        return dropout(x, ctx.threshold, ctx.scale, ctx.seed)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return dropout(grad, ctx.threshold, ctx.scale, ctx.seed), None


class WindowMax(torch.autograd.Function):
    """The character CNN's filters of one width over the windows of a group of words: per word and filter, the
    largest product of a window with the filter. The products are PyTorch's; their max, and the gradient, which
    reaches only the window each max was taken at, are compiled loops. (As PyTorch operations the gradient was the
    scatter of the maxima's gradients into every window, two products with that and the fold of the windows back
    into characters: most of the character CNN's time in training.)"""

    @staticmethod
    def forward(ctx, chars: torch.Tensor, weight: torch.Tensor, num_windows: int, onednn=None) -> torch.Tensor:
        """`chars` `(U, num_windows + W - 1, E)` float32, `weight` `(F, E, W)` (a `Conv1d`'s) -> `(U, F)`; the
        products through oneDNN where `onednn` (`OnednnProducts`) takes them."""
        num_filters, channels, width = weight.shape
        chars = chars.contiguous()
        # Windows and filters as (W, E): a window is then W x E consecutive values of its word's characters.
        kernel = weight.transpose(1, 2).reshape(num_filters, width * channels)
        windows = chars.unfold(1, width, 1).transpose(2, 3).reshape(-1, width * channels)  # (U T, W E)
        products = matmul_nt(windows, kernel, onednn=onednn)  # (U T, F)
        values = products.new_empty(chars.shape[0], num_filters)
        taken_at = torch.empty(chars.shape[0], num_filters, dtype=torch.int64)
        pointers = _pointers((products, (chars.shape[0] * num_windows, num_filters)), (values, tuple(values.shape)))
        _library()[0].window_max(chars.shape[0], num_windows, num_filters, *pointers, taken_at.data_ptr())
        ctx.save_for_backward(chars, kernel, taken_at)
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        chars, kernel, taken_at = ctx.saved_tensors
        words, length, channels = chars.shape
        num_filters = kernel.shape[0]
        width = kernel.shape[1] // channels
        grad = grad.contiguous()
        grad_chars = torch.zeros_like(chars)
        grad_kernel = torch.empty_like(kernel)
        pointers = _pointers(
            (chars, (words, length, channels)),
            (kernel, (num_filters, width * channels)),
            (grad, (words, num_filters)),
            (grad_chars, (words, length, channels)),
            (grad_kernel, (num_filters, width * channels)),
        )
        _library()[0].window_max_backward(
            words, length, channels, width, num_filters, pointers[0], pointers[1], taken_at.data_ptr(), *pointers[2:]
        )
        grad_weight = grad_kernel.view(num_filters, width, channels).transpose(1, 2)
        return grad_chars, grad_weight, None, None
