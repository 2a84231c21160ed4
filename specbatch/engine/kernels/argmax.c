/* Row-wise argmax of logits, as torch's `max(dim=-1).indices`: the first NaN where a row holds one,
 * else the first position of the row's largest value (-0.0 and 0.0 equal, as they compare).
 *
 * torch's reduction with indices reads ~0.7 GB/s here: 0.7 ms for 32 rows of SmolLM2's 49,152 logits,
 * 3.5 ms for 160 (a verify pass of 32 rows and 4 drafts), every round. This reads each row once:
 * blocks of BLOCK values reduced to their largest as ordered integers (a vectorised integer max; no
 * float comparison, so no fast-math flag can change it), remembering the first block that reached the
 * row's largest, then that block scanned for its first position. Two cases take the plain scan: a NaN
 * (the first NaN wins) and a largest value of zero (a -0.0 in an earlier block equals a later 0.0,
 * whose integer is larger). Layout: rows `row_stride` elements apart (logits sliced to the vocabulary),
 * each contiguous. Built by specbatch/engine/argmax.py. */
#include <stdint.h>

#define BLOCK 256

/* float bits as an integer that orders as the floats do (NaN aside; -0.0 below 0.0) */
static inline int32_t ordered(uint32_t bits) { return (int32_t)(bits ^ ((uint32_t)((int32_t)bits >> 31) >> 1)); }

static inline float from_bits(uint32_t bits) {
    union { uint32_t word; float value; } converted = {.word = bits};
    return converted.value;
}

static inline int is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

static inline uint32_t f32_bits(const float *row, int64_t j) {
    union { float value; uint32_t word; } converted = {.value = row[j]};
    return converted.word;
}

static inline uint32_t bf16_bits(const uint16_t *row, int64_t j) { return (uint32_t)row[j] << 16; }

/* One row's argmax; `BITS(row, j)` reads value j as float32 bits. */
#define ROW_ARGMAX(NAME, TYPE, BITS)                                                                    \
    static int64_t NAME(const TYPE *row, int64_t cols) {                                               \
        int32_t best = INT32_MIN;                                                                      \
        int64_t best_block = 0;                                                                        \
        int nan = 0;                                                                                   \
        for (int64_t base = 0; base < cols; base += BLOCK) {                                           \
            int64_t end = base + BLOCK < cols ? base + BLOCK : cols;                                   \
            int32_t block_best = INT32_MIN;                                                            \
            int block_nan = 0;                                                                         \
            for (int64_t j = base; j < end; j++) {                                                     \
                uint32_t bits = BITS(row, j);                                                          \
                int32_t key = ordered(bits);                                                           \
                block_best = key > block_best ? key : block_best;                                      \
                block_nan |= is_nan(bits);                                                             \
            }                                                                                          \
            nan |= block_nan;                                                                          \
            if (block_best > best) {                                                                   \
                best = block_best;                                                                     \
                best_block = base;                                                                     \
            }                                                                                          \
        }                                                                                              \
        if (nan) {                                                                                     \
            for (int64_t j = 0; j < cols; j++)                                                         \
                if (is_nan(BITS(row, j))) return j;                                                    \
        }                                                                                              \
        uint32_t best_bits = best >= 0 ? (uint32_t)best : (uint32_t)best ^ 0x7fffffffu;                \
        float largest = from_bits(best_bits);                                                          \
        int64_t start = largest == 0.0f ? 0 : best_block; /* a zero: the first of either sign */      \
        for (int64_t j = start; j < cols; j++)                                                         \
            if (from_bits(BITS(row, j)) == largest) return j;                                          \
        return 0; /* unreachable: the largest value is in the row */                                  \
    }

ROW_ARGMAX(row_argmax_f32, float, f32_bits)
ROW_ARGMAX(row_argmax_bf16, uint16_t, bf16_bits)

void argmax_f32(const float *x, int64_t rows, int64_t cols, int64_t row_stride, int64_t *out, int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > 1 && rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++) out[r] = row_argmax_f32(x + r * row_stride, cols);
}

void argmax_bf16(const uint16_t *x, int64_t rows, int64_t cols, int64_t row_stride, int64_t *out,
                 int num_threads) {
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > 1 && rows * cols >= 65536)
    for (int64_t r = 0; r < rows; r++) out[r] = row_argmax_bf16(x + r * row_stride, cols);
}
