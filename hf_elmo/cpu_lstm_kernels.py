"""One LSTM time step's elementwise work as one compiled loop, forward and backward, for float32 on CPUs.

Between its two matrix products a step of ELMo's LSTM is a dozen elementwise operations (gate nonlinearities, cell
update, clip, the cell's tanh, the output gate); each is a PyTorch call that costs more to dispatch than its work
(a step of the mid-size model: 32 rows of 2,048 gate inputs). Here they are one loop over the step's rows, and in
the backward one loop that forms the gate gradients from the saved activations, so that a step is two products and
one call each way (`fast_lstm.py`).

The loop is C++ compiled on first use with the machine's C++ compiler, for the machine's own processor
(`-march=native`), into `~/.cache/hf_elmo` (or `$HF_ELMO_CACHE`), keyed by the source, the compiler and the
processor's features; it is loaded with `ctypes`, so nothing is built at install time and no PyTorch headers are
needed. Where no compiler is found, or the build fails, or `HF_ELMO_CPU_KERNELS=0` is set, `available()` is False
and `fast_lstm.py` runs the same step as PyTorch operations. The nonlinearities use a polynomial `exp` (Cephes'
single-precision one, about one unit in the last place) and `tanh(x) = 2 sigmoid(2x) - 1`, so results agree with
PyTorch's to a few units in the last place, not bit for bit; the tests hold both to the reference path.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

_SOURCE = r"""
#include <stdint.h>

// Fewer cells than this per thread are not worth waking another thread for.
#define MIN_CELLS_PER_THREAD 8192

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }

// Cephes' expf: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], a degree-6
// polynomial for exp(r).
static inline v8 vexp(v8 x) {
    x = x > splat(88.3762626647949f) ? splat(88.3762626647949f) : x;  // written so that NaN stays NaN
    x = x < splat(-87.3365447504f) ? splat(-87.3365447504f) : x;
    // Adding 1.5 * 2^23 rounds x / ln 2 to an integer and leaves that integer in the low bits of the sum.
    v8 shifted = x * splat(1.44269504088896341f) + splat(12582912.0f);
    v8 fn = shifted - splat(12582912.0f);
    v8i n = (v8i)shifted - (v8i)splat(12582912.0f);
    x = x - fn * splat(0.693359375f) - fn * splat(-2.12194440e-4f);
    v8 y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * (x * x) + x + splat(1.0f);
    v8i scale = (n + 127) << 23;
    return y * (v8)scale;
}

static inline v8 vsigmoid(v8 x) { return splat(1.0f) / (splat(1.0f) + vexp(-x)); }
static inline v8 vtanh(v8 x) { return splat(2.0f) * vsigmoid(splat(2.0f) * x) - splat(1.0f); }

static inline v8 load(const float* p, int64_t count) {
    v8 v = splat(0.0f);
    if (count == 8) { __builtin_memcpy(&v, p, sizeof v); return v; }
    for (int64_t j = 0; j < count; ++j) v[j] = p[j];
    return v;
}

static inline void store(float* p, v8 v, int64_t count) {
    if (count == 8) { __builtin_memcpy(p, &v, sizeof v); return; }
    for (int64_t j = 0; j < count; ++j) p[j] = v[j];
}

static inline v8 clip(v8 x, float limit) {
    x = x > splat(limit) ? splat(limit) : x;  // NaN stays NaN, as in torch.clamp
    return x < splat(-limit) ? splat(-limit) : x;
}

// Rows of `D` cells; every tensor is (K, n, width) with the given stride between directions and rows packed.
// gates (K, n, 4D) [input, forget, cell, output]: out = [s(i), s(f), tanh(g), s(o)] of in + product.
// memory_in may be raw_cell (updated in place); cell may be raw_cell (no clip).
extern "C" void lstm_forward_step(
    int64_t K, int64_t n, int64_t D,
    const float* gates_in, int64_t gates_in_k, int64_t gates_in_r, const float* product, int64_t product_k, int64_t product_r,
    float* gates_out, int64_t gates_out_k, int64_t gates_out_r, const float* memory_in, int64_t memory_in_k, int64_t memory_in_r,
    float* raw_cell, int64_t raw_cell_k, int64_t raw_cell_r, float* cell, int64_t cell_k, int64_t cell_r, float* cell_tanh, int64_t cell_tanh_k, int64_t cell_tanh_r,
    float* cell_output, int64_t cell_output_k, int64_t cell_output_r, int32_t has_clip, float cell_clip) {
    #pragma omp parallel for collapse(2) schedule(static) if (K * n * D >= MIN_CELLS_PER_THREAD * 2)
    for (int64_t k = 0; k < K; ++k)
    for (int64_t r = 0; r < n; ++r) {
        const float* gi = gates_in + k * gates_in_k + r * gates_in_r;
        const float* pr = product + k * product_k + r * product_r;
        float* go = gates_out + k * gates_out_k + r * gates_out_r;
        const float* m = memory_in + k * memory_in_k + r * memory_in_r;
        float* rc = raw_cell + k * raw_cell_k + r * raw_cell_r;
        float* c = cell + k * cell_k + r * cell_r;
        float* tc = cell_tanh + k * cell_tanh_k + r * cell_tanh_r;
        float* co = cell_output + k * cell_output_k + r * cell_output_r;
        for (int64_t d = 0; d < D; d += 8) {
            int64_t w = D - d < 8 ? D - d : 8;
            v8 i = vsigmoid(load(gi + d, w) + load(pr + d, w));
            v8 f = vsigmoid(load(gi + D + d, w) + load(pr + D + d, w));
            v8 g = vtanh(load(gi + 2 * D + d, w) + load(pr + 2 * D + d, w));
            v8 o = vsigmoid(load(gi + 3 * D + d, w) + load(pr + 3 * D + d, w));
            v8 new_cell = f * load(m + d, w) + i * g;
            store(rc + d, new_cell, w);
            if (has_clip) { new_cell = clip(new_cell, cell_clip); store(c + d, new_cell, w); }
            v8 t = vtanh(new_cell);
            store(tc + d, t, w);
            store(co + d, o * t, w);
            store(go + d, i, w); store(go + D + d, f, w); store(go + 2 * D + d, g, w); store(go + 3 * D + d, o, w);
        }
    }
}

// gates (K, n, 4D): in the saved [s(i), s(f), tanh(g), s(o)], out the gradients of the gate inputs.
// grad_memory: in the gradient of the step's cell from later steps, out that of the cell it started from.
// raw_cell is read only with a clip (where the clip held the cell, no gradient passes).
extern "C" void lstm_backward_step(
    int64_t K, int64_t n, int64_t D,
    float* gates, int64_t gates_k, int64_t gates_r, const float* grad_cell_output, int64_t grad_cell_output_k, int64_t grad_cell_output_r,
    const float* cell_tanh, int64_t cell_tanh_k, int64_t cell_tanh_r, const float* memory_in, int64_t memory_in_k, int64_t memory_in_r,
    const float* raw_cell, int64_t raw_cell_k, int64_t raw_cell_r, float* grad_memory, int64_t grad_memory_k, int64_t grad_memory_r,
    int32_t has_clip, float cell_clip) {
    #pragma omp parallel for collapse(2) schedule(static) if (K * n * D >= MIN_CELLS_PER_THREAD * 2)
    for (int64_t k = 0; k < K; ++k)
    for (int64_t r = 0; r < n; ++r) {
        float* g4 = gates + k * gates_k + r * gates_r;
        const float* gco = grad_cell_output + k * grad_cell_output_k + r * grad_cell_output_r;
        const float* tc = cell_tanh + k * cell_tanh_k + r * cell_tanh_r;
        const float* m = memory_in + k * memory_in_k + r * memory_in_r;
        const float* rc = has_clip ? raw_cell + k * raw_cell_k + r * raw_cell_r : 0;
        float* gm = grad_memory + k * grad_memory_k + r * grad_memory_r;
        for (int64_t d = 0; d < D; d += 8) {
            int64_t w = D - d < 8 ? D - d : 8;
            v8 i = load(g4 + d, w), f = load(g4 + D + d, w), g = load(g4 + 2 * D + d, w), o = load(g4 + 3 * D + d, w);
            v8 t = load(tc + d, w), dco = load(gco + d, w);
            v8 dc = load(gm + d, w) + dco * ((splat(1.0f) - t * t) * o);
            if (has_clip) {
                v8 raw = load(rc + d, w);
                v8 magnitude = raw < splat(0.0f) ? -raw : raw;
                dc = dc * (magnitude <= splat(cell_clip) ? splat(1.0f) : splat(0.0f));  // as a 0/1 factor
            }
            store(g4 + d, dc * (i * (splat(1.0f) - i) * g), w);
            store(g4 + D + d, dc * (f * (splat(1.0f) - f) * load(m + d, w)), w);
            store(g4 + 2 * D + d, dc * ((splat(1.0f) - g * g) * i), w);
            store(g4 + 3 * D + d, dco * (o * (splat(1.0f) - o) * t), w);
            store(gm + d, dc * f, w);
        }
    }
}
"""

_FUNCTIONS = {
    "lstm_forward_step": [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 8 + [ctypes.c_int32, ctypes.c_float],
    "lstm_backward_step": [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 6 + [ctypes.c_int32, ctypes.c_float],
}


def _cache_folder() -> Path:
    return Path(os.environ.get("HF_ELMO_CACHE") or Path.home() / ".cache" / "hf_elmo") / "kernels"


def _processor_features() -> str:
    """What `-march=native` compiles for: a library built for one processor may not run on another."""
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        return platform.processor() + platform.machine()


def _build(compiler: str, target: Path) -> None:
    """Compiles the source into `target`, written whole or not at all (concurrent builds each rename their own)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        source = Path(folder) / "lstm_step.cpp"
        source.write_text(_SOURCE)
        library = Path(folder) / target.name
        # OpenMP: the library then shares PyTorch's OpenMP runtime (already loaded under the same name) and threads.
        # Some compilers (Apple's) know neither OpenMP nor -march=native: then without.
        for flags in (["-march=native", "-fopenmp"], ["-march=native"], []):
            command = [compiler, "-O3", *flags, "-shared", "-fPIC", "-o", str(library), str(source)]
            if subprocess.run(command, capture_output=True).returncode == 0:
                os.replace(library, target)
                return
    raise OSError(f"{compiler} could not build the CPU LSTM kernels")


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("HF_ELMO_CPU_KERNELS", "1") == "0":
        return None
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        return None
    key = hashlib.sha256("\0".join([_SOURCE, compiler, _processor_features()]).encode()).hexdigest()[:16]
    target = _cache_folder() / f"lstm_step_{key}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        library = ctypes.CDLL(str(target))
    except OSError:
        return None
    for name, argtypes in _FUNCTIONS.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None
    return library


def available(tensor: torch.Tensor) -> bool:
    """Whether the compiled step runs for tensors like `tensor` (float32 on a CPU, and a library built)."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.float32 and _library() is not None


def _arguments(rows: tuple[int, int], cell_dim: int, *tensors_and_widths) -> list[int]:
    """Per `(tensor, width)`, the tensor's data pointer and its strides between directions and rows, once it is
    checked to be `rows + (width,)` float32 with each row contiguous: the loop trusts them blindly. `None` for
    a tensor the loop does not read."""
    arguments = []
    for tensor, width in tensors_and_widths:
        if tensor is None:
            arguments += [None, 0, 0]
            continue
        if tuple(tensor.shape[:2]) != rows:
            raise ValueError(f"expected {rows} rows, got a tensor of shape {tuple(tensor.shape)}")
        if tensor.shape[2] != width * cell_dim or tensor.stride(2) != 1 or tensor.dtype != torch.float32:
            raise ValueError(
                f"expected float32 rows of {width * cell_dim} contiguous, got {tensor.dtype} {tuple(tensor.shape)} "
                f"with strides {tensor.stride()}"
            )
        arguments += [tensor.data_ptr(), tensor.stride(0), tensor.stride(1)]
    return arguments


def forward_step(gates_in, product, gates_out, memory_in, raw_cell, cell, cell_tanh, cell_output, cell_clip):
    """One step's elementwise forward for `K` directions of `n` rows and `D` cells, writing into its arguments.

    Args:
        gates_in, product: `(K, n, 4D)`, summed: the gate inputs, gates `[input, forget, cell, output]`.
        gates_out: `(K, n, 4D)` <- `[sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)]` (may be `gates_in`).
        memory_in: `(K, n, D)`, the cell each row starts from (may be `raw_cell`: updated in place).
        raw_cell, cell: `(K, n, D)` <- the new cell before and after the clip (the same tensor without a clip).
        cell_tanh, cell_output: `(K, n, D)` <- `tanh(cell)`, `sigmoid(o) * tanh(cell)`.
    """
    K, n, D = cell.shape
    arguments = _arguments(
        (K, n), D, (gates_in, 4), (product, 4), (gates_out, 4), (memory_in, 1), (raw_cell, 1), (cell, 1),
        (cell_tanh, 1), (cell_output, 1),
    )  # fmt: skip
    _library().lstm_forward_step(K, n, D, *arguments, cell_clip is not None, cell_clip or 0.0)


def backward_step(gates, grad_cell_output, cell_tanh, memory_in, raw_cell, grad_memory, cell_clip):
    """One step's elementwise backward, in place: `gates` `(K, n, 4D)` from the saved activations to the gradients
    of the gate inputs, `grad_memory` `(K, n, D)` from the gradient of the step's cell (from later steps) to that of
    the cell the step started from. `grad_cell_output` `(K, n, D)`: of `sigmoid(o) * tanh(cell)`; `cell_tanh`,
    `memory_in` and, with a clip, `raw_cell` `(K, n, D)` as the forward step wrote or read them."""
    K, n, D = grad_memory.shape
    arguments = _arguments(
        (K, n), D, (gates, 4), (grad_cell_output, 1), (cell_tanh, 1), (memory_in, 1),
        (raw_cell if cell_clip is not None else None, 1), (grad_memory, 1),
    )  # fmt: skip
    _library().lstm_backward_step(K, n, D, *arguments, cell_clip is not None, cell_clip or 0.0)
