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

/* x <- x * cos + rotate_half(x) * sin, in place, rotate_half(x) = (-x[half:], x[:half]) */
void rotary_f32(float *x, int64_t token_stride, const float *cos, const float *sin, int64_t tokens, int64_t heads, int64_t dim,
                int num_threads) {
    int64_t half = dim / 2;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + t * token_stride + h * dim, was[MAX_DIM];
            const float *c = cos + t * dim, *s = sin + t * dim;
            for (int64_t d = 0; d < dim; d++) was[d] = v[d];
            for (int64_t d = 0; d < half; d++) v[d] = was[d] * c[d] + (-was[d + half]) * s[d];
            for (int64_t d = half; d < dim; d++) v[d] = was[d] * c[d] + was[d - half] * s[d];
        }
    }
}

void rotary_bf16(uint16_t *x, int64_t token_stride, const uint16_t *cos, const uint16_t *sin, int64_t tokens, int64_t heads,
                 int64_t dim, int num_threads) {
    int64_t half = dim / 2;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *v = x + t * token_stride + h * dim;
            const uint16_t *c = cos + t * dim, *s = sin + t * dim;
            float was[MAX_DIM];
            for (int64_t d = 0; d < dim; d++) was[d] = widen(v[d]);
            for (int64_t d = 0; d < dim; d++) {
                float rotated = d < half ? -was[d + half] : was[d - half];
                v[d] = narrow(round_bf16(was[d] * widen(c[d])) + round_bf16(rotated * widen(s[d])));
            }
        }
    }
}
