/* y = x·Wᵀ (+ bias) for the few rows of a decoding pass, streaming the weight once from memory.
 *
 * At 1-16 rows a GEMM is a read of its weight: SmolLM2's ~125M weights are 500 MB in float32, about
 * 20 ms at this machine's bandwidth, yet oneDNN's packed GEMM spent 44 ms of an 8-row pass on them.
 * Here the weight is laid out once in panels of PANEL output columns, each panel's columns side by
 * side for every k (`pack_panels_*`), so a panel is one contiguous stream. A thread takes a share
 * of the panels; for each k it multiplies the panel's PANEL weights by each input row's x[m][k]
 * (broadcast) into ROW_TILE x PANEL accumulators held in registers: 3 weight loads and 8
 * broadcasts feed 24 fused multiply-adds, and the panel ahead is prefetched while they run.
 *
 * Every output element is x[m]·W[n] summed over k in ascending order, one fused multiply-add at a
 * time, whatever the row count, the tile or the thread count: a row's result does not depend on
 * which other rows share the pass (batch invariant), so a token computes the same bits when its row
 * decodes one position or verifies several.
 *
 * Post-ops (`op`): 0 none, 1 add `other` (a residual), 2 multiply by `other` (a gate), 3 SiLU; each
 * applied to the sum (plus bias) as its own rounded operation, as torch's separate ops round.
 * Layouts contiguous: x and other [rows, k] / [rows, n], w [n, k], bias [n] or NULL, out [rows, n],
 * panels [ceil(n / PANEL), k, PANEL] (columns past n zero). Built by
 * specbatch/engine/streamed_gemm.py with vector extensions, so any target compiles it. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define PANEL (3 * LANES)
#define ROW_TILE 8
#define PREFETCH_AHEAD 4096 /* bytes of the panel stream fetched ahead of the loads */

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
            __builtin_prefetch((const char *)weights + PREFETCH_AHEAD, 0, 3);                           \
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

typedef void (*panel_tile_fn)(const float *, int64_t, const float *, float *);
static const panel_tile_fn panel_tiles[ROW_TILE + 1] = {
    NULL, panel_tile_1, panel_tile_2, panel_tile_3, panel_tile_4, panel_tile_5, panel_tile_6, panel_tile_7,
    panel_tile_8};

void streamed_gemm_f32(const float *x, const float *panels, const float *bias, const float *other, float *out,
                       int64_t rows, int64_t n, int64_t k, int op, int num_threads) {
    int64_t count = (n + PANEL - 1) / PANEL;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t panel = 0; panel < count; panel++) {
        int64_t first_col = panel * PANEL, width = n - first_col < PANEL ? n - first_col : PANEL;
        float tile[ROW_TILE][PANEL];
        for (int64_t first = 0; first < rows; first += ROW_TILE) {
            int height = rows - first < ROW_TILE ? (int)(rows - first) : ROW_TILE;
            panel_tiles[height](x + first * k, k, panels + panel * k * PANEL, &tile[0][0]);
            for (int m = 0; m < height; m++)
                for (int64_t j = 0; j < width; j++) {
                    int64_t at = (first + m) * n + first_col + j;
                    float value = tile[m][j] + (bias != NULL ? bias[first_col + j] : 0.0f);
                    out[at] = post_op(value, op, other != NULL ? other[at] : 0.0f);
                }
        }
    }
}
