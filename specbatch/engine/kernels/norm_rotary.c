/* RMSNorm and rotary embedding for the native step, each one pass over its rows where torch takes
 * five to eight (a conversion, squares, a mean, a root, products, and for rotary a negation, a
 * concatenation and three products and sums), each a separate pass and dispatch.
 *
 * They round exactly as the Hugging Face code they replace, op by op: in bfloat16 every product and
 * sum is computed in float32 and rounded to bfloat16 where torch's would be (to nearest, ties to
 * even); in float32 products and sums are not fused (built with -ffp-contract=off). Only RMSNorm's
 * sum of squares is reassociated (vectorised), as torch's own reduction is in its own order.
 * Layouts contiguous: x and out [rows, dim], weight [dim]; rotary's x [tokens, heads, dim] in place,
 * each token's heads contiguous, token_stride elements apart (queries and keys inside a fused QKV
 * output), cos and sin [tokens, dim]. Built by specbatch/engine/fused_ops.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bfloat16.h"

#define MAX_DIM 1024

static inline float round_bf16(float value) { return widen(narrow(value)); }

/* out = weight * (x * rsqrt(mean(x^2) + eps)), as transformers' LlamaRMSNorm in float32 */
void rms_norm_f32(const float *x, const float *weight, float *out, int64_t rows, int64_t dim, double eps,
                  int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * dim;
        float squares = 0;
        for (int64_t d = 0; d < dim; d++) squares += row[d] * row[d];
        float scale = 1.0f / sqrtf(squares / (float)dim + (float)eps);
        for (int64_t d = 0; d < dim; d++) out[r * dim + d] = weight[d] * (row[d] * scale);
    }
}

/* the same in bfloat16: normalised in float32, rounded, then times the weight, rounded */
void rms_norm_bf16(const uint16_t *x, const uint16_t *weight, uint16_t *out, int64_t rows, int64_t dim,
                   double eps, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = x + r * dim;
        float squares = 0;
        for (int64_t d = 0; d < dim; d++) squares += widen(row[d]) * widen(row[d]);
        float scale = 1.0f / sqrtf(squares / (float)dim + (float)eps);
        for (int64_t d = 0; d < dim; d++)
            out[r * dim + d] = narrow(widen(weight[d]) * round_bf16(widen(row[d]) * scale));
    }
}

/* to <- from * cos + rotate_half(from) * sin for one head, rotate_half(x) = (-x[half:], x[:half]);
 * `to` may be `from` (in place) */
static inline void rotate_head_f32(const float *from, float *to, const float *c, const float *s, int64_t dim) {
    int64_t half = dim / 2;
    float was[MAX_DIM];
    for (int64_t d = 0; d < dim; d++) was[d] = from[d];
    for (int64_t d = 0; d < half; d++) to[d] = was[d] * c[d] + (-was[d + half]) * s[d];
    for (int64_t d = half; d < dim; d++) to[d] = was[d] * c[d] + was[d - half] * s[d];
}

static inline void rotate_head_bf16(const uint16_t *from, uint16_t *to, const uint16_t *c, const uint16_t *s,
                                    int64_t dim) {
    int64_t half = dim / 2;
    float was[MAX_DIM];
    for (int64_t d = 0; d < dim; d++) was[d] = widen(from[d]);
    for (int64_t d = 0; d < dim; d++) {
        float rotated = d < half ? -was[d + half] : was[d - half];
        to[d] = narrow(round_bf16(was[d] * widen(c[d])) + round_bf16(rotated * widen(s[d])));
    }
}

/* x <- rotary(x) in place for x's `heads` heads of each token */
#define ROTARY(SUFFIX, T)                                                                                \
    void rotary_##SUFFIX(T *x, int64_t token_stride, const T *cos, const T *sin, int64_t tokens, int64_t heads, \
                         int64_t dim, int num_threads) {                                                 \
        _Pragma("omp parallel for collapse(2) schedule(static) num_threads(num_threads)")                \
        for (int64_t t = 0; t < tokens; t++)                                                             \
            for (int64_t h = 0; h < heads; h++) {                                                        \
                T *head = x + t * token_stride + h * dim;                                                \
                rotate_head_##SUFFIX(head, head, cos + t * dim, sin + t * dim, dim);                     \
            }                                                                                            \
    }

/* A layer's rotary and its KV write in one pass: qk's first q_heads heads rotated in place (the
 * queries), its next kv_heads rotated straight into the key pool at each token's slot, and v's heads
 * copied into the value pool there. Pools [kv_heads, pool_positions, dim or value_dim]; qk and v rows
 * token_stride and v_stride elements apart (views into a fused QKV output). */
#define ROTARY_WRITE(SUFFIX, T)                                                                          \
    void rotary_write_##SUFFIX(T *qk, int64_t token_stride, const T *v, int64_t v_stride, const T *cos,  \
                               const T *sin, int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t dim, \
                               int64_t value_dim, const int64_t *slots, T *key_pool, T *value_pool,     \
                               int64_t pool_positions, int num_threads) {                                \
        _Pragma("omp parallel for collapse(2) schedule(static) num_threads(num_threads)")                \
        for (int64_t t = 0; t < tokens; t++)                                                             \
            for (int64_t h = 0; h < q_heads + kv_heads; h++) {                                           \
                T *head = qk + t * token_stride + h * dim;                                               \
                const T *c = cos + t * dim, *s = sin + t * dim;                                          \
                if (h < q_heads) {                                                                       \
                    rotate_head_##SUFFIX(head, head, c, s, dim);                                         \
                    continue;                                                                            \
                }                                                                                        \
                int64_t kh = h - q_heads, at = kh * pool_positions + slots[t];                          \
                rotate_head_##SUFFIX(head, key_pool + at * dim, c, s, dim);                              \
                memcpy(value_pool + at * value_dim, v + t * v_stride + kh * value_dim, sizeof(T) * value_dim); \
            }                                                                                            \
    }

ROTARY(f32, float)
ROTARY(bf16, uint16_t)
ROTARY_WRITE(f32, float)
ROTARY_WRITE(bf16, uint16_t)
