// Compiled loops for float32 on CPUs; hf_elmo/cpu_kernels.py builds and loads them (its docstring says how).
#include <stdint.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>

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

// Products with few rows (an LSTM step's), on AVX-512 machines: C (rows x cols) = A (rows x inner) B^T + beta C,
// B (cols x inner) row-major given as `packed` panels, (ceil(cols / PANEL), inner, PANEL) with zeros past `cols`.
// Each panel streams from memory once per product while a block of rows of A accumulates against it in registers:
// with few rows the BLAS's product is bound by reading B, and on some processors it leaves AVX-512 unused.
#if defined(__AVX512F__)
typedef float v16 __attribute__((vector_size(64)));
enum { PANEL_VECTORS = 4, PANEL = 16 * PANEL_VECTORS, ROW_BLOCK = 6 };
// Sums of this many products are kept in registers, and those sums added up after: a float32 sum's rounding error
// grows with the number of terms in one chain.
enum { INNER_BLOCK = 128 };
// More rows than this go to the BLAS, whose blocking serves them better.
enum { PACKED_MAX_ROWS = 64 };

template <int NA>
static inline void panel_rows(int64_t inner, const float* a, int64_t lda, const float* panel, float beta, float* c,
                              int64_t ldc, int64_t width) {
    v16 total[NA][PANEL_VECTORS];
    for (int i = 0; i < NA; ++i) for (int j = 0; j < PANEL_VECTORS; ++j) total[i][j] = (v16){};
    for (int64_t start = 0; start < inner; start += INNER_BLOCK) {
        const int64_t end = start + INNER_BLOCK < inner ? start + INNER_BLOCK : inner;
        v16 sum[NA][PANEL_VECTORS];
        for (int i = 0; i < NA; ++i) for (int j = 0; j < PANEL_VECTORS; ++j) sum[i][j] = (v16){};
        for (int64_t p = start; p < end; ++p) {
            v16 b[PANEL_VECTORS];
            memcpy(b, panel + p * PANEL, sizeof b);
            for (int i = 0; i < NA; ++i) {
                const float x = a[i * lda + p];
                for (int j = 0; j < PANEL_VECTORS; ++j) sum[i][j] += x * b[j];
            }
        }
        for (int i = 0; i < NA; ++i) for (int j = 0; j < PANEL_VECTORS; ++j) total[i][j] += sum[i][j];
    }
    for (int i = 0; i < NA; ++i) {
        float out[PANEL];
        memcpy(out, total[i], sizeof out);
        float* row = c + i * ldc;
        if (beta == 0.0f) for (int64_t l = 0; l < width; ++l) row[l] = out[l];
        else for (int64_t l = 0; l < width; ++l) row[l] += out[l];
    }
}

// B (cols x inner) row-major -> `packed`, (ceil(cols / PANEL), inner, PANEL) floats (`packed_panel_width`).
extern "C" void pack_panels(int64_t cols, int64_t inner, const float* b, float* packed) {
    const int64_t panels = (cols + PANEL - 1) / PANEL;
    for (int64_t q = 0; q < panels; ++q)
        for (int64_t p = 0; p < inner; ++p)
            for (int64_t l = 0; l < PANEL; ++l) {
                const int64_t col = q * PANEL + l;
                packed[(q * inner + p) * PANEL + l] = col < cols ? b[col * inner + p] : 0.0f;
            }
}

static void packed_product(int64_t rows, int64_t cols, int64_t inner, const float* a, int64_t lda,
                           const float* packed, float beta, float* c, int64_t ldc) {
    const int64_t panels = (cols + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static) if (panels >= 8 && rows * cols * inner >= (1 << 22) && !in_parallel())
    for (int64_t q = 0; q < panels; ++q) {
        const float* panel = packed + q * inner * PANEL;
        const int64_t width = cols - q * PANEL < PANEL ? cols - q * PANEL : PANEL;
        float* cq = c + q * PANEL;
        int64_t r = 0;
        for (; r + ROW_BLOCK <= rows; r += ROW_BLOCK)
            panel_rows<ROW_BLOCK>(inner, a + r * lda, lda, panel, beta, cq + r * ldc, ldc, width);
        const float* ar = a + r * lda;
        float* cr = cq + r * ldc;
        switch (rows - r) {
            case 1: panel_rows<1>(inner, ar, lda, panel, beta, cr, ldc, width); break;
            case 2: panel_rows<2>(inner, ar, lda, panel, beta, cr, ldc, width); break;
            case 3: panel_rows<3>(inner, ar, lda, panel, beta, cr, ldc, width); break;
            case 4: panel_rows<4>(inner, ar, lda, panel, beta, cr, ldc, width); break;
            case 5: panel_rows<5>(inner, ar, lda, panel, beta, cr, ldc, width); break;
        }
    }
}
#else
enum { PANEL = 0, PACKED_MAX_ROWS = 0 };
extern "C" void pack_panels(int64_t, int64_t, const float*, float*) {}
static void packed_product(int64_t, int64_t, int64_t, const float*, int64_t, const float*, float, float*, int64_t) {}
#endif

// The packed products' panel width and the most rows a step forms through them; 0 where the build has none.
extern "C" int64_t packed_panel_width() { return PANEL; }
extern "C" int64_t packed_max_rows() { return PACKED_MAX_ROWS; }

// A product of few rows through `packed` where there is one, else through the BLAS (B^T given row-major as `b`).
static inline void step_product(sgemm_t sgemm, const float* packed, int64_t rows, int64_t cols, int64_t inner,
                                const float* a, const float* b, float beta, float* c) {
    if (packed != 0 && rows <= PACKED_MAX_ROWS) packed_product(rows, cols, inner, a, inner, packed, beta, c, cols);
    else product(sgemm, rows, cols, inner, a, inner, b, inner, true, beta, c, cols);
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
    const float* state_weight[2];      // per direction (4D, P)
    const float* projection_weight[2]; // per direction (P, D)
    const float* packed_state[2];      // per direction, W_h's panels for steps of few rows (inference), or null
    const float* packed_projection[2]; // W_p's
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
        const float* W_h = L.state_weight[k];
        const float* W_p = L.projection_weight[k];
        const int64_t rows_k = save ? L.N : L.B;  // rows of a direction in the cell buffers
        const float* packed_h = L.packed_state[k];
        const float* packed_p = L.packed_projection[k];
        for (int64_t t = 0; t < L.T; ++t) {
            const int64_t n = L.batch_sizes[t], at = L.offsets[t], here = save ? at : 0;
            if (n == 0) continue;
            float* step_gates = gates + (k * L.N + at) * G;
            const float* hidden_in = t == 0 ? hidden0 + k * L.B * P : outputs + (k * L.N + L.offsets[t - 1]) * P;
            step_product(L.sgemm, packed_h, n, G, P, hidden_in, W_h, 1.0f, step_gates);
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
            step_product(L.sgemm, packed_p, n, P, D, cell_out, W_p, 0.0f, raw_out);
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
        const float* W_h = L.state_weight[k];
        const float* W_p = L.projection_weight[k];
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
