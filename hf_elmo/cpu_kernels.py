"""Compiled loops for float32 on CPUs: an LSTM layer's whole time loop, forward and backward; the sampled softmax's
row-wise log-sum-exp and its gradient; Adagrad's step; dropout with a counter-based generator; the character
CNN's max over windows and its gradient.

A step of ELMo's LSTM is two small matrix products and a dozen elementwise operations (gate nonlinearities, cell
update, clip, the cell's tanh, the output gate); as PyTorch calls from Python, dispatching them costs more than
their work (a step of the mid-size model: 32 rows of 2,048 gate inputs per direction). Here a layer's time loop is
one call: each direction runs on an OpenMP thread of its own (PyTorch's, see below), its products through the
BLAS that PyTorch itself links (`sgemm_`, single-threaded there), its elementwise part one pass over a step's rows
that also writes what the backward reads; one direction alone (the large sizes) gets every thread for its products
and rows. The backward loop forms the gate gradients from the saved activations on the fly. `fast_lstm.py` keeps the
packing and the products over all steps at once (input products, weight gradients) and falls back to PyTorch
operations per step wherever these loops are not available.

The source is C++ compiled on first use with the machine's C++ compiler, for the machine's own processor
(`-march=native`) and with OpenMP, into `~/.cache/hf_elmo` (or `$HF_ELMO_CACHE`), keyed by the source, the
compiler and the processor's features, written whole or not at all; it is loaded with `ctypes` (which lets go of
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
from pathlib import Path

import torch

from .onednn_linear import matmul_nt

_SOURCE = r"""
#include <stdint.h>
#include <stdbool.h>
#include <math.h>

// Fewer cells than this per thread are not worth waking another thread for.
#define MIN_CELLS_PER_THREAD 8192

#ifdef _OPENMP
#include <omp.h>
static inline bool in_parallel() { return omp_in_parallel(); }
#else
static inline bool in_parallel() { return true; }
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }

// Cephes' expf: exp(z) = 2^n exp(r), n = round(z / ln 2), r = z - n ln 2 in [-ln2/2, ln2/2], a degree-6
// polynomial for exp(r). Returns exp(r) and sets n; `z` within [-104, 89].
static inline v8 exp_reduced(v8 z, v8i* n) {
    // Adding 1.5 * 2^23 rounds z / ln 2 to an integer and leaves that integer in the low bits of the sum.
    v8 shifted = z * splat(1.44269504088896341f) + splat(12582912.0f);
    v8 fn = shifted - splat(12582912.0f);
    *n = (v8i)shifted - (v8i)splat(12582912.0f);
    z = z - fn * splat(0.693359375f) - fn * splat(-2.12194440e-4f);
    v8 y = splat(1.9875691500e-4f);
    y = y * z + splat(1.3981999507e-3f);
    y = y * z + splat(8.3334519073e-3f);
    y = y * z + splat(4.1665795894e-2f);
    y = y * z + splat(1.6666665459e-1f);
    y = y * z + splat(5.0000001201e-1f);
    return y * (z * z) + z + splat(1.0f);
}

// exp(x), with 2^n applied as two factors so that results down to the smallest subnormal and up to the largest
// float come out right; beyond those 0 and infinity; NaN stays NaN.
static inline v8 vexp(v8 x) {
    const v8 largest = splat(88.72283935546875f), smallest = splat(-103.97207708f);
    v8 z = x > largest ? largest : x;
    z = z < smallest ? smallest : z;
    v8i n;
    v8 y = exp_reduced(z, &n);
    v8i half = n >> 1;
    y = y * (v8)((half + 127) << 23) * (v8)((n - half + 127) << 23);
    y = x > largest ? splat(INFINITY) : y;
    return x < smallest ? splat(0.0f) : y;
}

// exp(x) for x in [-87.34, 88.38], where 2^n is one float; outside, the value at the nearer end (NaN stays NaN).
// Enough for the sigmoid, which is within 5e-39 of 0 or 1 there, and cheaper than `vexp`.
static inline v8 vexp_within_normals(v8 x) {
    x = x > splat(88.3762626647949f) ? splat(88.3762626647949f) : x;
    x = x < splat(-87.3365447504f) ? splat(-87.3365447504f) : x;
    v8i n;
    v8 y = exp_reduced(x, &n);
    return y * (v8)((n + 127) << 23);
}

static inline v8 vsigmoid(v8 x) { return splat(1.0f) / (splat(1.0f) + vexp_within_normals(-x)); }
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

// Fortran BLAS's sgemm (column-major), as PyTorch's own BLAS exports it. Sizes go as 64-bit integers: an LP64
// library reads their low halves, which on a little-endian machine hold the same values.
typedef void (*sgemm_t)(const char*, const char*, const int64_t*, const int64_t*, const int64_t*, const float*,
                        const float*, const int64_t*, const float*, const int64_t*, const float*, float*,
                        const int64_t*);

// Row-major C (rows x cols) = A (rows x inner) B (inner x cols) + beta C, with B given as stored: `b_transposed`
// when its memory holds B^T (cols x inner) row-major. Rows of A, B and C `lda`, `ldb`, `ldc` apart.
static inline void product(sgemm_t sgemm, int64_t rows, int64_t cols, int64_t inner, const float* a, int64_t lda,
                           const float* b, int64_t ldb, bool b_transposed, float beta, float* c, int64_t ldc) {
    // Column-major, C^T = B^T A^T: B's memory is the first operand, A's the second.
    const char transpose_b = b_transposed ? 'T' : 'N', no = 'N';
    const float one = 1.0f;
    sgemm(&transpose_b, &no, &cols, &rows, &inner, &one, b, &ldb, a, &lda, &beta, c, &ldc);
}

// One row of `D` cells: gates [input, forget, cell, output] in place from their inputs to
// [s(i), s(f), tanh(g), s(o)]; the new cell (raw and clipped: the same row without a clip), its tanh and the output.
// `memory_in` may be `cell` (updated in place).
static inline void forward_row(int64_t D, float* gates, const float* memory_in, float* raw_cell, float* cell,
                               float* cell_tanh, float* cell_output, bool has_clip, float cell_clip) {
    for (int64_t d = 0; d < D; d += 8) {
        int64_t w = D - d < 8 ? D - d : 8;
        v8 i = vsigmoid(load(gates + d, w));
        v8 f = vsigmoid(load(gates + D + d, w));
        v8 g = vtanh(load(gates + 2 * D + d, w));
        v8 o = vsigmoid(load(gates + 3 * D + d, w));
        v8 new_cell = f * load(memory_in + d, w) + i * g;
        store(raw_cell + d, new_cell, w);
        if (has_clip) { new_cell = clip(new_cell, cell_clip); store(cell + d, new_cell, w); }
        v8 t = vtanh(new_cell);
        store(cell_tanh + d, t, w);
        store(cell_output + d, o * t, w);
        store(gates + d, i, w); store(gates + D + d, f, w);
        store(gates + 2 * D + d, g, w); store(gates + 3 * D + d, o, w);
    }
}

// One row's backward: `gates` from the saved [s(i), s(f), tanh(g), s(o)] to the gradients of their inputs,
// `grad_memory` from the gradient of the row's new cell (from later steps) to that of the cell it started from.
static inline void backward_row(int64_t D, float* gates, const float* grad_cell_output, const float* cell_tanh,
                                const float* memory_in, const float* raw_cell, float* grad_memory, bool has_clip,
                                float cell_clip) {
    for (int64_t d = 0; d < D; d += 8) {
        int64_t w = D - d < 8 ? D - d : 8;
        v8 i = load(gates + d, w), f = load(gates + D + d, w);
        v8 g = load(gates + 2 * D + d, w), o = load(gates + 3 * D + d, w);
        v8 t = load(cell_tanh + d, w), dco = load(grad_cell_output + d, w);
        v8 dc = load(grad_memory + d, w) + dco * ((splat(1.0f) - t * t) * o);
        if (has_clip) {
            v8 raw = load(raw_cell + d, w);
            v8 magnitude = raw < splat(0.0f) ? -raw : raw;
            dc = dc * (magnitude <= splat(cell_clip) ? splat(1.0f) : splat(0.0f));  // where the clip held the cell
        }
        store(gates + d, dc * (i * (splat(1.0f) - i) * g), w);
        store(gates + D + d, dc * (f * (splat(1.0f) - f) * load(memory_in + d, w)), w);
        store(gates + 2 * D + d, dc * ((splat(1.0f) - g * g) * i), w);
        store(gates + 3 * D + d, dco * (o * (splat(1.0f) - o) * t), w);
        store(grad_memory + d, dc * f, w);
    }
}

// For the check at load time that the BLAS found is called right: row-major C (rows x cols) = A B.
extern "C" void product_for_check(sgemm_t sgemm, int64_t rows, int64_t cols, int64_t inner, const float* a,
                                  const float* b, float* c) {
    product(sgemm, rows, cols, inner, a, inner, b, cols, false, 0.0f, c, cols);
}

struct Layer {
    int64_t K, T, B, N, D, P;       // directions, steps, rows, packed positions, cells, projection
    const int64_t* batch_sizes;     // (T,) rows running at each step, non-increasing
    const int64_t* offsets;         // (T,) where each step's rows start among the N packed positions
    const float* state_weight;      // (K, 4D, P)
    const float* projection_weight; // (K, P, D)
    bool has_cell_clip, has_proj_clip;
    float cell_clip, proj_clip;
    sgemm_t sgemm;
};

// Runs `direction(k)` for each direction: side by side on the OpenMP threads when there are several (each then
// runs its products on one thread), or one with every thread for its products and rows.
template <typename F> static void for_each_direction(int64_t K, F direction) {
    #pragma omp parallel for schedule(static, 1) if (K > 1)
    for (int64_t k = 0; k < K; ++k) direction(k);
}

// Rows [0, n) of one step: with every thread when called alone, on the calling thread inside a direction's thread.
template <typename F> static void for_each_row(int64_t n, int64_t D, F row) {
    #pragma omp parallel for schedule(static) if (n * D >= 2 * MIN_CELLS_PER_THREAD && !in_parallel())
    for (int64_t r = 0; r < n; ++r) row(r);
}

// The time loop of a layer's forward. Packed (K, N, width) buffers; hidden0 (K, B, P) and memory0 (K, B, D) the
// states rows start from. `gates` holds the input products (bias included) and is overwritten with the
// activations. With `save`, every step's cells, their tanh, the cell outputs and the outputs before the clip are
// kept (K, N, width); without, `cells`, `cell_tanh` and `cell_outputs` are one step's rows (K, B, width), `cells`
// starting as memory0 and left holding each row's final cell, and `raw_outputs` is unused.
extern "C" void lstm_forward_sequence(
    const Layer* layer, int32_t save, float* gates, const float* hidden0, const float* memory0, float* raw_cells,
    float* cells, float* cell_tanh, float* cell_outputs, float* raw_outputs, float* outputs) {
    const Layer L = *layer;
    const int64_t D = L.D, P = L.P, G = 4 * L.D;
    for_each_direction(L.K, [&](int64_t k) {
        const float* W_h = L.state_weight + k * G * P;
        const float* W_p = L.projection_weight + k * P * D;
        const int64_t rows_k = save ? L.N : L.B;  // rows of a direction in the cell buffers
        for (int64_t t = 0; t < L.T; ++t) {
            const int64_t n = L.batch_sizes[t], at = L.offsets[t], here = save ? at : 0;
            if (n == 0) continue;
            float* step_gates = gates + (k * L.N + at) * G;
            const float* hidden_in = t == 0 ? hidden0 + k * L.B * P : outputs + (k * L.N + L.offsets[t - 1]) * P;
            product(L.sgemm, n, G, P, hidden_in, P, W_h, P, true, 1.0f, step_gates, G);
            const float* memory_in = !save ? cells + k * L.B * D
                                   : t == 0 ? memory0 + k * L.B * D : cells + (k * L.N + L.offsets[t - 1]) * D;
            float* raw = (save && L.has_cell_clip ? raw_cells : cells) + (k * rows_k + here) * D;
            float* cell = cells + (k * rows_k + here) * D;
            float* tanh_c = cell_tanh + (k * rows_k + here) * D;
            float* cell_out = cell_outputs + (k * rows_k + here) * D;
            for_each_row(n, D, [&](int64_t r) {
                forward_row(D, step_gates + r * G, memory_in + r * D, raw + r * D, cell + r * D, tanh_c + r * D,
                            cell_out + r * D, L.has_cell_clip, L.cell_clip);
            });
            float* out = outputs + (k * L.N + at) * P;
            float* raw_out = save && L.has_proj_clip ? raw_outputs + (k * L.N + at) * P : out;
            product(L.sgemm, n, P, D, cell_out, D, W_p, D, true, 0.0f, raw_out, P);
            if (L.has_proj_clip)
                for (int64_t j = 0; j < n * P; j += 8) {
                    int64_t w = n * P - j < 8 ? n * P - j : 8;
                    store(out + j, clip(load(raw_out + j, w), L.proj_clip), w);
                }
        }
    });
}

// The time loop of a layer's backward, over the buffers the forward saved. `gates` goes from the activations to
// the gradients of the gate inputs; `grad_outputs` (K, N, P) the gradients of the clipped outputs;
// `grad_projected` (K, N, P) <- those of the outputs before the clip; grad_hidden (K, B, P) and grad_memory
// (K, B, D) from the gradients of the final states to those of the states rows start from; scratch (K, B, D).
extern "C" void lstm_backward_sequence(
    const Layer* layer, float* gates, const float* memory0, const float* raw_cells, const float* cells,
    const float* cell_tanh, const float* raw_outputs, const float* grad_outputs, float* grad_projected,
    float* grad_hidden, float* grad_memory, float* scratch) {
    const Layer L = *layer;
    const int64_t D = L.D, P = L.P, G = 4 * L.D;
    for_each_direction(L.K, [&](int64_t k) {
        const float* W_h = L.state_weight + k * G * P;
        const float* W_p = L.projection_weight + k * P * D;
        float* grad_h = grad_hidden + k * L.B * P;
        float* grad_m = grad_memory + k * L.B * D;
        float* grad_cell_output = scratch + k * L.B * D;
        for (int64_t t = L.T - 1; t >= 0; --t) {
            const int64_t n = L.batch_sizes[t], at = L.offsets[t];
            if (n == 0) continue;
            const int64_t here = k * L.N + at;
            float* projected = grad_projected + here * P;
            for (int64_t j = 0; j < n * P; ++j) {
                float g = grad_outputs[here * P + j] + grad_h[j];
                if (L.has_proj_clip) {
                    float raw = raw_outputs[here * P + j];
                    g = g * ((raw < 0 ? -raw : raw) <= L.proj_clip ? 1.0f : 0.0f);
                }
                projected[j] = g;
            }
            product(L.sgemm, n, D, P, projected, P, W_p, D, false, 0.0f, grad_cell_output, D);
            float* step_gates = gates + here * G;
            const float* memory_in = t == 0 ? memory0 + k * L.B * D : cells + (k * L.N + L.offsets[t - 1]) * D;
            const float* raw = (L.has_cell_clip ? raw_cells : cells) + here * D;
            for_each_row(n, D, [&](int64_t r) {
                backward_row(D, step_gates + r * G, grad_cell_output + r * D, cell_tanh + (here + r) * D,
                             memory_in + r * D, raw + r * D, grad_m + r * D, L.has_cell_clip, L.cell_clip);
            });
            product(L.sgemm, n, P, G, step_gates, G, W_h, P, false, 0.0f, grad_h, P);
        }
    });
}

// Row-wise log-sum-exp of (rows x cols) row-major logits into totals (rows,): as torch.logsumexp, shifted by each
// row's maximum (by 0 where that is infinite), NaN kept.
extern "C" void logsumexp_rows(int64_t rows, int64_t cols, const float* logits, float* totals) {
    const int64_t body = cols - cols % 8;
    #pragma omp parallel for schedule(static) if (rows * cols >= 2 * MIN_CELLS_PER_THREAD)
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = logits + r * cols;
        v8 vmax = splat(-INFINITY);
        for (int64_t d = 0; d < body; d += 8) { v8 v = load(x + d, 8); vmax = v > vmax ? v : vmax; }
        float largest = -INFINITY;
        for (int j = 0; j < 8; ++j) largest = vmax[j] > largest ? vmax[j] : largest;
        for (int64_t d = body; d < cols; ++d) largest = x[d] > largest ? x[d] : largest;
        const float shift = largest == INFINITY || largest == -INFINITY ? 0.0f : largest;
        v8 vsum = splat(0.0f);
        for (int64_t d = 0; d < body; d += 8) vsum += vexp(load(x + d, 8) - splat(shift));
        float total = 0.0f;
        for (int j = 0; j < 8; ++j) total += vsum[j];
        for (int64_t d = body; d < cols; d += 8) {
            int64_t w = cols - d;
            v8 e = vexp(load(x + d, w) - splat(shift));
            for (int64_t j = 0; j < w; ++j) total += e[j];
        }
        totals[r] = logf(total) + shift;
    }
}

// The gradient of logsumexp_rows: out = exp(logits - totals) * grad, row by row (grad, totals: (rows,)).
extern "C" void logsumexp_rows_backward(int64_t rows, int64_t cols, const float* logits, const float* totals,
                                        const float* grad, float* out) {
    #pragma omp parallel for schedule(static) if (rows * cols >= 2 * MIN_CELLS_PER_THREAD)
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < cols; d += 8) {
            int64_t w = cols - d < 8 ? cols - d : 8;
            store(out + r * cols + d, vexp(load(logits + r * cols + d, w) - splat(totals[r])) * splat(grad[r]), w);
        }
}

// One Adagrad step as PyTorch's, in one pass: sum += g^2; param += -lr * (g / (sqrt(sum) + eps)). Blocks of
// zero gradient (rows of a word softmax a sampled softmax did not touch) are left as they are, as Adagrad would.
// The gradient is used times `scale` (a clipping factor, else 1), rounded to float32 as a separate multiplication.
extern "C" void adagrad_step(int64_t n, float* param, const float* grad, float* sum, float lr, float eps, float scale) {
    const int64_t block = 4096;
    #pragma omp parallel for schedule(static) if (n >= 8 * block)
    for (int64_t start = 0; start < n; start += block) {
        const int64_t end = start + block < n ? start + block : n;
        bool any = false;
        for (int64_t j = start; j < end; ++j) any |= grad[j] * scale != 0.0f;
        if (!any) continue;
        for (int64_t j = start; j < end; ++j) {
            const float g = grad[j] * scale;
            const float total = sum[j] + g * g;
            sum[j] = total;
            param[j] = param[j] + (-lr) * (g / (sqrtf(total) + eps));
        }
    }
}

// The character CNN's max over windows, for the filters of one width: products (U, T, F) of each word's T windows
// with F filters -> each word and filter's maximum (U, F) and the window it was taken at, the first of equal ones
// and NaN over any number, as torch.max.
extern "C" void window_max(int64_t U, int64_t T, int64_t F, const float* products, float* values, int64_t* windows) {
    #pragma omp parallel for schedule(static) if (U * T * F >= 2 * MIN_CELLS_PER_THREAD)
    for (int64_t u = 0; u < U; ++u) {
        const float* p = products + u * T * F;
        float* best = values + u * F;
        int64_t* at = windows + u * F;
        for (int64_t f = 0; f < F; ++f) { best[f] = p[f]; at[f] = 0; }
        for (int64_t t = 1; t < T; ++t)
            for (int64_t f = 0; f < F; ++f) {
                const float v = p[t * F + f];
                const bool take = v > best[f] || (v != v && best[f] == best[f]);
                best[f] = take ? v : best[f];
                at[f] = take ? t : at[f];
            }
    }
}

// Its gradient, which reaches only the window each maximum was taken at: the window at t of word u is the W x E
// values from chars[u, t] on (chars (U, L, E)), and weight (F, W, E) holds the filters in that order. grad (U, F)
// -> grad_weight (F, W, E), and added into grad_chars (U, L, E). Filters split over threads for the first, words
// for the second: no two threads write the same value.
extern "C" void window_max_backward(int64_t U, int64_t L, int64_t E, int64_t W, int64_t F, const float* chars,
                                    const float* weight, const int64_t* windows, const float* grad,
                                    float* grad_chars, float* grad_weight) {
    const int64_t K = W * E;
    const bool split = U * F * K >= 2 * MIN_CELLS_PER_THREAD;
    #pragma omp parallel for schedule(static) if (split)
    for (int64_t f = 0; f < F; ++f) {
        float* out = grad_weight + f * K;
        for (int64_t k = 0; k < K; ++k) out[k] = 0.0f;
        for (int64_t u = 0; u < U; ++u) {
            const float g = grad[u * F + f];
            const float* x = chars + (u * L + windows[u * F + f]) * E;
            for (int64_t k = 0; k < K; ++k) out[k] += g * x[k];
        }
    }
    #pragma omp parallel for schedule(static) if (split)
    for (int64_t u = 0; u < U; ++u)
        for (int64_t f = 0; f < F; ++f) {
            const float g = grad[u * F + f];
            const float* w = weight + f * K;
            float* out = grad_chars + (u * L + windows[u * F + f]) * E;
            for (int64_t k = 0; k < K; ++k) out[k] += g * w[k];
        }
}

// A 32-bit hash with good avalanche (Wellons' "lowbias32").
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

// Dropout as PyTorch's (out = x * scale where kept, x * 0 where dropped), the mask drawn from a counter-based
// generator: whether value i is kept depends only on (seed, i), kept where its hash is at least `threshold`
// (probability 1 - threshold / 2^32), so a backward regenerates the mask instead of storing it.
extern "C" void dropout(int64_t n, const float* x, float* out, uint64_t seed, uint32_t threshold, float scale) {
    const uint32_t low = (uint32_t)seed, high = (uint32_t)(seed >> 32);
    #pragma omp parallel for schedule(static) if (n >= 8 * MIN_CELLS_PER_THREAD)
    for (int64_t start = 0; start < n; start += 4096) {
        const int count = (int)(start + 4096 < n ? 4096 : n - start);
        const uint32_t first = (uint32_t)start, key = high ^ (uint32_t)(start >> 32) * 0x9e3779b9U;
        const float* in = x + start;
        float* to = out + start;
        // 32-bit lanes and a product with no branch: vectorizes.
        for (int j = 0; j < count; ++j)
            to[j] = in[j] * (mix32(mix32((first + (uint32_t)j) ^ low) ^ key) >= threshold ? scale : 0.0f);
    }
}
"""


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("K", "T", "B", "N", "D", "P")),
        *((name, ctypes.c_void_p) for name in ("batch_sizes", "offsets", "state_weight", "projection_weight")),
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
}


def _cache_folder() -> Path:
    return Path(os.environ.get("HF_ELMO_CACHE") or Path.home() / ".cache" / "hf_elmo") / "kernels"


def _processor_features() -> str:
    """What `-march=native` compiles for: a library built for one processor may not run on another."""
    try:
        return next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features"))
        )
    except (OSError, StopIteration):
        return platform.processor() + platform.machine()


def _build(compiler: str, target: Path) -> None:
    """Compiles the source into `target`, written whole or not at all (concurrent builds each rename their own)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as folder:
        source = Path(folder) / "cpu_kernels.cpp"
        source.write_text(_SOURCE)
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
        warnings.warn(
            f"hf_elmo's compiled CPU loops are not available ({error}): the LSTM, the sampled softmax, Adagrad and "
            "dropout run as PyTorch operations on CPUs, slower for small and mid-size models",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _load() -> tuple[ctypes.CDLL, int]:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise OSError("no C++ compiler found: set CXX or install g++ or clang++")
    sgemm = _sgemm_address()
    if sgemm is None:
        raise OSError("PyTorch's BLAS does not export sgemm_")
    key = hashlib.sha256("\0".join([_SOURCE, compiler, _processor_features()]).encode()).hexdigest()[:16]
    target = _cache_folder() / f"cpu_kernels_{key}.so"
    if not target.exists():
        _build(compiler, target)
    library = ctypes.CDLL(str(target))
    for name, argtypes in _FUNCTIONS.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None
    if not _products_are_right(library, sgemm):
        raise OSError("PyTorch's sgemm_ gave a wrong product through them")
    return library, sgemm


def loops_built() -> bool:
    """Whether the compiled loops are built and loaded here (they run on float32 CPU tensors)."""
    return _library() is not None


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


def _layer(batch_sizes, state_weight, projection_weight, batch_size, cell_clip, proj_clip):
    """The `Layer` the loops read, and the tensors it points into (to be kept alive for the call)."""
    library, sgemm = _library()
    K, gate_dim, P = state_weight.shape
    D = gate_dim // 4
    sizes = torch.tensor(batch_sizes, dtype=torch.int64)
    offsets = torch.cumsum(sizes, 0) - sizes
    state_pointer, projection_pointer = _pointers((state_weight, (K, 4 * D, P)), (projection_weight, (K, P, D)))
    layer = _Layer(
        K,
        len(batch_sizes),
        batch_size,
        int(sizes.sum()),
        D,
        P,
        sizes.data_ptr(),
        offsets.data_ptr(),
        state_pointer,
        projection_pointer,
        cell_clip is not None,
        proj_clip is not None,
        cell_clip or 0.0,
        proj_clip or 0.0,
        sgemm,
    )
    return library, layer, (sizes, offsets)


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
        state_weight `(K, 4D, P)`, projection_weight `(K, P, D)`: `W_h` and `W_p`, gates `[input, forget, cell,
            output]`.
        gates: `(K, N, 4D)`, the input products (bias included) <- `[sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)]`.
        hidden0 `(K, B, P)`, memory0 `(K, B, D)`: the states rows start from.
        raw_cells, cells, cell_tanh, cell_outputs: with `save` (for a backward), `(K, N, D)` <- each step's cell
            before and after the clip (`raw_cells` None without a clip), its tanh and the cell output; without,
            `(K, B, D)` one step's rows, `cells` holding `memory0` and left with each row's final cell, `raw_cells`
            None.
        raw_outputs: `(K, N, P)` <- the outputs before the clip (None without a clip or without saving).
        outputs: `(K, N, P)` <- each step's new hidden state.
    """
    K, _, P = state_weight.shape
    D, B, N = projection_weight.shape[2], hidden0.shape[1], gates.shape[1]
    library, layer, keep = _layer(batch_sizes, state_weight, projection_weight, B, cell_clip, proj_clip)
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
    K, _, P = state_weight.shape
    D, B, N = projection_weight.shape[2], grad_hidden.shape[1], gates.shape[1]
    library, layer, keep = _layer(batch_sizes, state_weight, projection_weight, B, cell_clip, proj_clip)
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
    def forward(ctx, chars: torch.Tensor, weight: torch.Tensor, num_windows: int) -> torch.Tensor:
        """`chars` `(U, num_windows + W - 1, E)` float32, `weight` `(F, E, W)` (a `Conv1d`'s) -> `(U, F)`."""
        num_filters, channels, width = weight.shape
        chars = chars.contiguous()
        # Windows and filters as (W, E): a window is then W x E consecutive values of its word's characters.
        kernel = weight.transpose(1, 2).reshape(num_filters, width * channels)
        windows = chars.unfold(1, width, 1).transpose(2, 3).reshape(-1, width * channels)  # (U T, W E)
        products = matmul_nt(windows, kernel)  # (U T, F)
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
        return grad_chars, grad_weight, None
