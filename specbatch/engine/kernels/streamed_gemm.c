/* y = x·Wᵀ (+ bias), streaming the weight once from memory: every float32 pass, and bfloat16's few rows.
 *
 * At 1-16 rows a GEMM is a read of its weight: SmolLM2's ~125M weights are 500 MB in float32, about
 * 20 ms at this machine's bandwidth, yet oneDNN's packed GEMM spent 44 ms of an 8-row pass on them.
 * Here the weight is laid out once in panels of PANEL output columns, each panel's columns side by
 * side for every k (`pack_panels_*`), so a panel is one contiguous stream. A thread takes a share
 * of the panels; for each k it multiplies the panel's PANEL weights by each input row's x[m][k]
 * (broadcast) into ROW_TILE x PANEL accumulators held in registers: 3 weight loads and 8
 * broadcasts feed 24 fused multiply-adds, and the panel ahead is prefetched while they run: every
 * cache line of it, into L2 (`prefetch_step`).
 * At a prefill's hundreds of rows the same tile computes near the float32 peak: a panel (110-300 KB)
 * stays in cache while the tiles of a ROW_BLOCK of rows pass over it, and that block's x (at most
 * 0.8 MB) stays in cache for the next panel.
 *
 * Every output element is x[m]·W[n] summed over k in ascending order, one fused multiply-add at a
 * time, whatever the row count, the tile or the thread count: a row's result does not depend on
 * which other rows share the pass (batch invariant), so a token computes the same bits when its row
 * decodes one position or verifies several.
 *
 * bfloat16 (on CPUs with AVX512-BF16): panels hold k in pairs, [ceil(n / PANEL), k / 2, PANEL, 2],
 * and each pair of products is added to the float32 sum by one dot-product instruction (`vdpbf16ps`),
 * pairs in ascending k: again one order for every element.
 *
 * Post-ops (`op`): 0 none, 1 add `other` (a residual), 2 multiply by `other` (a gate), 3 SiLU, applied
 * to the float32 sum (plus bias), a vector at a time on whole panels (`post_op_vec`; at 32 bfloat16
 * rows the element-wise epilogue took 16-20% of the GEMM at k = 576, SiLU's libm exponential more).
 * float32 rounds as torch's separate ops do; bfloat16 rounds once, after the op, as oneDNN's fused
 * post-ops in the prefill passes do (rounding op by op instead made a tiny bfloat16 model's greedy
 * outputs match Hugging Face's less often: 5 of 16 against 8 or more, tests/test_low_precision.py).
 * Layouts contiguous: x and other [rows, k] / [rows, n], w [n, k], bias [n] or NULL, out [rows, n],
 * panels [ceil(n / PANEL), k, PANEL] (columns past n zero). Built by
 * specbatch/engine/streamed_gemm.py with vector extensions, so any target compiles it. */
#include <math.h>
#include <stdint.h>

#include "bfloat16.h"
#include "vector_expf.h"
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#define LANES 16
#define PANEL (3 * LANES)
#define ROW_TILE 8
#define PREFETCH_AHEAD 8192 /* bytes of the panel stream fetched ahead of the loads */

/* Fetches a k step's PANEL weights (192 bytes: three cache lines in float32, and in bfloat16's k pairs)
 * PREFETCH_AHEAD bytes ahead, into L2. One prefetch a step reached a third of the lines, leaving the
 * rest to the hardware's prefetcher; into L1 the prefetches filled its miss buffers ahead of the loads.
 * Every line into L2 took 3-35% off the GEMMs at 1-32 rows on an AMD EPYC (Zen 4), float32 and
 * bfloat16, and reached its memory's bandwidth at 8 float32 rows (benchmarks/streamed_gemm_ab.py). */
static inline void prefetch_step(const void *weights) {
    const char *ahead = (const char *)weights + PREFETCH_AHEAD;
    __builtin_prefetch(ahead, 0, 1);
    __builtin_prefetch(ahead + 64, 0, 1);
    __builtin_prefetch(ahead + 128, 0, 1);
}
#define ROW_BLOCK 128 /* rows per sweep over the panels (4,096 rows: 180-184 GFLOPS, 175 unblocked) */

typedef float vec __attribute__((vector_size(LANES * sizeof(float)), aligned(4), may_alias));

enum { OP_NONE = 0, OP_ADD = 1, OP_MUL = 2, OP_SILU = 3 };

static inline float post_op(float value, int op, float other) {
    switch (op) {
        case OP_ADD: return other + value;
        case OP_MUL: return value * other;
        case OP_SILU: return value / (1.0f + expf(-value));
        default: return value;
    }
}

/* w [n, k] into panels [ceil(n / PANEL), k, PANEL] */
void pack_panels_f32(const float *w, float *panels, int64_t n, int64_t k, int num_threads) {
    int64_t count = (n + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t panel = 0; panel < count; panel++)
        for (int64_t j = 0; j < PANEL; j++) {
            int64_t col = panel * PANEL + j;
            for (int64_t i = 0; i < k; i++)
                panels[(panel * k + i) * PANEL + j] = col < n ? w[col * k + i] : 0.0f;
        }
}

/* acc[m][0..3) += x[m][i] * panel[i][..] for i in [0, k), ROWS a constant so the accumulators stay in
 * registers; the sums stored to tile [ROWS][PANEL] */
#define PANEL_TILE(ROWS)                                                                                \
    static void panel_tile_##ROWS(const float *x, int64_t k, const float *panel, float *tile) {         \
        vec acc[ROWS][3];                                                                               \
        _Pragma("GCC unroll 8") for (int m = 0; m < ROWS; m++) acc[m][0] = acc[m][1] = acc[m][2] = (vec){0}; \
        for (int64_t i = 0; i < k; i++) {                                                               \
            const float *weights = panel + i * PANEL;                                                   \
            prefetch_step(weights);                                                                     \
            vec w0 = *(const vec *)weights, w1 = *(const vec *)(weights + LANES),                      \
                w2 = *(const vec *)(weights + 2 * LANES);                                               \
            _Pragma("GCC unroll 8") for (int m = 0; m < ROWS; m++) {                                    \
                float in = x[m * k + i];                                                                \
                acc[m][0] += w0 * in;                                                                   \
                acc[m][1] += w1 * in;                                                                   \
                acc[m][2] += w2 * in;                                                                   \
            }                                                                                           \
        }                                                                                               \
        memcpy(tile, acc, sizeof acc);                                                                  \
    }

PANEL_TILE(1) PANEL_TILE(2) PANEL_TILE(3) PANEL_TILE(4) PANEL_TILE(5) PANEL_TILE(6) PANEL_TILE(7) PANEL_TILE(8)

/* The post-ops on LANES sums at once: the same operations, in the same order, on each element as
 * `post_op` (SiLU's exponential gives libm's bits, `vector_expf.h`), so each output's bits are those
 * of the element-wise form, which cut-short panels still use. */
static inline vec post_op_vec(vec value, int op, vec other) {
    switch (op) {
        case OP_ADD: return other + value;
        case OP_MUL: return value * other;
        case OP_SILU: return value / (1.0f + (vec)expf_lanes_exact(-value));
        default: return value;
    }
}

static inline vec load_f32(const float *from) { return *(const vec *)from; }
static inline void store_f32(float *to, vec value) { *(vec *)to = value; }

typedef void (*panel_tile_fn)(const float *, int64_t, const float *, float *);
static const panel_tile_fn panel_tiles[ROW_TILE + 1] = {
    NULL, panel_tile_1, panel_tile_2, panel_tile_3, panel_tile_4, panel_tile_5, panel_tile_6, panel_tile_7,
    panel_tile_8};

/* out = op(x·Wᵀ + bias, other), T the element type, TILES the row tiles, WIDEN a T read as float32,
 * POST the post-op (and rounding) into T; LOAD, STORE the same LANES at a time, for whole panels */
#define STREAMED_GEMM(SUFFIX, T, TILES, WIDEN, POST, LOAD, STORE)                                       \
    void streamed_gemm_##SUFFIX(const T *x, const T *panels, const T *bias, const T *other, T *out,      \
                                int64_t rows, int64_t n, int64_t k, int op, int num_threads) {           \
        int64_t count = (n + PANEL - 1) / PANEL;                                                        \
        for (int64_t block = 0; block < rows; block += ROW_BLOCK) {                                     \
            int64_t block_end = rows - block < ROW_BLOCK ? rows : block + ROW_BLOCK;                    \
            _Pragma("omp parallel for schedule(static) num_threads(num_threads)")                       \
            for (int64_t panel = 0; panel < count; panel++) {                                           \
                int64_t first_col = panel * PANEL, width = n - first_col < PANEL ? n - first_col : PANEL; \
                float tile[ROW_TILE][PANEL];                                                            \
                for (int64_t first = block; first < block_end; first += ROW_TILE) {                     \
                    int height = block_end - first < ROW_TILE ? (int)(block_end - first) : ROW_TILE;    \
                    TILES[height](x + first * k, k, panels + panel * k * PANEL, &tile[0][0]);           \
                    if (width == PANEL) {                                                               \
                        for (int m = 0; m < height; m++)                                                \
                            for (int64_t j = 0; j < PANEL; j += LANES) {                                \
                                int64_t at = (first + m) * n + first_col + j;                           \
                                vec value = *(const vec *)&tile[m][j]                                   \
                                            + (bias != NULL ? LOAD(bias + first_col + j) : (vec){0});   \
                                vec with = other != NULL ? LOAD(other + at) : (vec){0};                 \
                                STORE(out + at, post_op_vec(value, op, with));                          \
                            }                                                                           \
                        continue;                                                                       \
                    }                                                                                   \
                    for (int m = 0; m < height; m++)                                                    \
                        for (int64_t j = 0; j < width; j++) {                                           \
                            int64_t at = (first + m) * n + first_col + j;                               \
                            float value = tile[m][j] + (bias != NULL ? WIDEN(bias[first_col + j]) : 0.0f); \
                            out[at] = POST(value, op, other != NULL ? other[at] : 0);                   \
                        }                                                                               \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }

static inline float as_float(float value) { return value; }

STREAMED_GEMM(f32, float, panel_tiles, as_float, post_op, load_f32, store_f32)

/* bfloat16 */

/* whether the bfloat16 kernel runs on the dot-product instruction here (else it is not worth calling) */
int streamed_bf16_supported(void) {
#if defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

/* w [n, k] (k even) into panels [ceil(n / PANEL), k / 2, PANEL, 2] */
void pack_panels_bf16(const uint16_t *w, uint16_t *panels, int64_t n, int64_t k, int num_threads) {
    int64_t count = (n + PANEL - 1) / PANEL, pairs = k / 2;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t panel = 0; panel < count; panel++)
        for (int64_t j = 0; j < PANEL; j++) {
            int64_t col = panel * PANEL + j;
            for (int64_t i = 0; i < pairs; i++)
                for (int t = 0; t < 2; t++)
                    panels[((panel * pairs + i) * PANEL + j) * 2 + t] = col < n ? w[col * k + 2 * i + t] : 0;
        }
}

#if defined(__AVX512BF16__)
#define PANEL_TILE_BF16(ROWS)                                                                           \
    static void panel_tile_bf16_##ROWS(const uint16_t *x, int64_t k, const uint16_t *panel, float *tile) { \
        __m512 acc[ROWS][3];                                                                            \
        _Pragma("GCC unroll 8") for (int m = 0; m < ROWS; m++)                                          \
            acc[m][0] = acc[m][1] = acc[m][2] = _mm512_setzero_ps();                                    \
        for (int64_t i = 0; i < k / 2; i++) {                                                           \
            const uint16_t *weights = panel + i * PANEL * 2;                                            \
            prefetch_step(weights);                                                                     \
            __m512bh w0 = (__m512bh)_mm512_loadu_si512(weights),                                        \
                     w1 = (__m512bh)_mm512_loadu_si512(weights + 2 * LANES),                            \
                     w2 = (__m512bh)_mm512_loadu_si512(weights + 4 * LANES);                            \
            _Pragma("GCC unroll 8") for (int m = 0; m < ROWS; m++) {                                    \
                int32_t pair;                                                                           \
                memcpy(&pair, x + m * k + 2 * i, sizeof pair);                                          \
                __m512bh in = (__m512bh)_mm512_set1_epi32(pair);                                        \
                acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, in);                                        \
                acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, in);                                        \
                acc[m][2] = _mm512_dpbf16_ps(acc[m][2], w2, in);                                        \
            }                                                                                           \
        }                                                                                               \
        memcpy(tile, acc, sizeof acc);                                                                  \
    }
#else /* never called where unsupported (`streamed_bf16_supported`); written plainly to stay correct */
#define PANEL_TILE_BF16(ROWS)                                                                           \
    static void panel_tile_bf16_##ROWS(const uint16_t *x, int64_t k, const uint16_t *panel, float *tile) { \
        for (int m = 0; m < ROWS; m++)                                                                  \
            for (int j = 0; j < PANEL; j++) {                                                           \
                float sum = 0;                                                                          \
                for (int64_t i = 0; i < k / 2; i++) {                                                   \
                    const uint16_t *pair = panel + (i * PANEL + j) * 2;                                 \
                    sum += widen(pair[0]) * widen(x[m * k + 2 * i]) + widen(pair[1]) * widen(x[m * k + 2 * i + 1]); \
                }                                                                                       \
                tile[m * PANEL + j] = sum;                                                              \
            }                                                                                           \
    }
#endif

PANEL_TILE_BF16(1) PANEL_TILE_BF16(2) PANEL_TILE_BF16(3) PANEL_TILE_BF16(4)
PANEL_TILE_BF16(5) PANEL_TILE_BF16(6) PANEL_TILE_BF16(7) PANEL_TILE_BF16(8)

typedef void (*panel_tile_bf16_fn)(const uint16_t *, int64_t, const uint16_t *, float *);
static const panel_tile_bf16_fn panel_tiles_bf16[ROW_TILE + 1] = {
    NULL, panel_tile_bf16_1, panel_tile_bf16_2, panel_tile_bf16_3, panel_tile_bf16_4, panel_tile_bf16_5,
    panel_tile_bf16_6, panel_tile_bf16_7, panel_tile_bf16_8};

static inline uint16_t post_op_bf16(float value, int op, uint16_t other) {
    return narrow(post_op(value, op, widen(other)));
}

static inline vec load_bf16(const uint16_t *from) { return (vec)widen_16(from); }
static inline void store_bf16(uint16_t *to, vec value) { narrow_16(to, (bf16_floats)value); }

STREAMED_GEMM(bf16, uint16_t, panel_tiles_bf16, widen, post_op_bf16, load_bf16, store_bf16)
