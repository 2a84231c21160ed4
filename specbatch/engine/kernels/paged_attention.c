/* Attention of a flat pass's decode-shaped rows straight over the paged KV pools: each row reads
 * its blocks through its block table once per KV head, for all its query positions and all the
 * query heads sharing that KV head, so no row's KV is copied first.
 *
 * Layouts (contiguous): q [tokens, heads, dim], out [tokens, heads, value_dim] and the pools
 * [kv_heads, positions, dim]; q, out and the pools all float32 or all float64, or q and out float32
 * over bfloat16 pools (read as raw 16-bit words, widened to float32 exactly); tables [rows,
 * table_stride] block ids. Row r's tokens
 * are row_first[r] .. + row_tokens[r] - 1, at positions row_start[r] ..; token i of the row sees
 * positions 0 .. row_start[r] + i (causal). Two passes per row and KV head: every lane's scores
 * (lane = query position x query head), then the weighted values; each key and value is read once.
 * Positions are walked block by block, so finding a position's slot costs no division.
 * Built by specbatch/engine/paged_kernel.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_DIM 256
#define MAX_LANES 64

#define DEFINE_KERNEL(NAME, QT, KT, LOAD, EXP)                                                           \
void NAME(const QT *q, const KT *k_pool, const KT *v_pool, QT *out, const int64_t *tables,              \
          int64_t table_stride, const int64_t *row_first, const int64_t *row_tokens,                      \
          const int64_t *row_start, int64_t num_rows, int64_t num_heads, int64_t num_kv_heads,            \
          int64_t head_dim, int64_t value_dim, int64_t pool_positions, int64_t block_size, double scale,  \
          int num_threads) {                                                                             \
    int64_t group = num_heads / num_kv_heads;                                                            \
    _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)")                 \
    for (int64_t r = 0; r < num_rows; r++) {                                                             \
        for (int64_t kh = 0; kh < num_kv_heads; kh++) {                                                  \
            int64_t lanes = row_tokens[r] * group, start = row_start[r], end = start + row_tokens[r];    \
            const int64_t *table = tables + r * table_stride;                                            \
            QT *scores = malloc(sizeof(QT) * lanes * end);                                               \
            const QT *lane_q[MAX_LANES];                                                                 \
            QT *lane_out[MAX_LANES];                                                                     \
            for (int64_t lane = 0; lane < lanes; lane++) {                                               \
                int64_t at = (row_first[r] + lane / group) * num_heads + kh * group + lane % group;      \
                lane_q[lane] = q + at * head_dim;                                                        \
                lane_out[lane] = out + at * value_dim;                                                   \
                for (int64_t d = 0; d < value_dim; d++) lane_out[lane][d] = 0;                           \
            }                                                                                            \
            /* pass 1: every lane's scores, reading each key once for all lanes */                       \
            for (int64_t first = 0; first < end; first += block_size) {                                  \
                int64_t count = end - first < block_size ? end - first : block_size;                     \
                const KT *kp = k_pool + (kh * pool_positions + table[first / block_size] * block_size) * head_dim; \
                for (int64_t i = 0; i < count; i++, kp += head_dim) {                                    \
                    QT key[MAX_DIM];                                                                     \
                    for (int64_t d = 0; d < head_dim; d++) key[d] = LOAD(kp[d]);                         \
                    for (int64_t lane = 0; lane < lanes; lane++) {                                       \
                        const QT *qh = lane_q[lane];                                                     \
                        QT score = 0;                                                                    \
                        for (int64_t d = 0; d < head_dim; d++) score += qh[d] * key[d];                  \
                        scores[lane * end + first + i] = score * (QT)scale;                              \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
            /* softmax per lane over the positions its token sees (0 .. start + token) */                \
            for (int64_t lane = 0; lane < lanes; lane++) {                                               \
                int64_t seen = start + lane / group + 1;                                                 \
                QT *row = scores + lane * end, high = row[0], total = 0; /* no infinities: fast-math */  \
                for (int64_t p = 0; p < seen; p++) high = row[p] > high ? row[p] : high;                 \
                for (int64_t p = 0; p < seen; p++) { row[p] = EXP(row[p] - high); total += row[p]; }     \
                for (int64_t p = 0; p < seen; p++) row[p] /= total;                                      \
                for (int64_t p = seen; p < end; p++) row[p] = 0;                                         \
            }                                                                                            \
            /* pass 2: each lane's weighted values, reading each value once for all lanes */             \
            for (int64_t first = 0; first < end; first += block_size) {                                  \
                int64_t count = end - first < block_size ? end - first : block_size;                     \
                const KT *vp = v_pool + (kh * pool_positions + table[first / block_size] * block_size) * value_dim; \
                for (int64_t i = 0; i < count; i++, vp += value_dim) {                                   \
                    QT value[MAX_DIM];                                                                   \
                    for (int64_t d = 0; d < value_dim; d++) value[d] = LOAD(vp[d]);                      \
                    for (int64_t lane = 0; lane < lanes; lane++) {                                       \
                        QT weight = scores[lane * end + first + i], *oh = lane_out[lane];                \
                        for (int64_t d = 0; d < value_dim; d++) oh[d] += weight * value[d];              \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
            free(scores);                                                                                \
        }                                                                                                \
    }                                                                                                    \
}

#define AS_IS(x) (x)

/* bfloat16 is float32's upper half: widening is a shift, exact */
static inline float bf16_to_float(uint16_t bits) {
    union { uint32_t word; float value; } widened = {.word = (uint32_t)bits << 16};
    return widened.value;
}

DEFINE_KERNEL(paged_attention_f32, float, float, AS_IS, expf)
DEFINE_KERNEL(paged_attention_f64, double, double, AS_IS, exp)
DEFINE_KERNEL(paged_attention_bf16, float, uint16_t, bf16_to_float, expf)
