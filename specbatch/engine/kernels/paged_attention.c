/* Attention of a flat pass's decode-shaped rows straight over the paged KV pools: each row reads
 * its blocks through its block table once per KV head, for all its query positions and all the
 * query heads sharing that KV head, so no row's KV is copied first.
 *
 * Layouts: q [tokens, heads, dim], its tokens q_stride elements apart (a view into a fused QKV
 * output), each token's heads contiguous; out [tokens, heads, value_dim] and the pools [kv_heads,
 * positions, dim] contiguous; q, out and the pools all of one dtype, float32, float64 or bfloat16
 * (raw 16-bit words, widened to float32 exactly, the outputs rounded to nearest as torch rounds: no
 * conversions around the call); tables [rows, table_stride] block ids. Row r's tokens are
 * row_first[r] .. + row_tokens[r] - 1, at positions row_start[r] ..; token i of the row sees
 * positions 0 .. row_start[r] + i (causal). head_dim and value_dim are multiples of WIDTH.
 *
 * A lane is one query position x one query head. Two ways to lay the work on vectors of WIDTH:
 * - across dimensions (`few`), for rows of few lanes (plain decoding: 1 position x the query heads
 *   of a KV head): a score is WIDTH partial dot products summed by a fixed tree;
 * - across lanes (`wide`), for verify rows: a key element is broadcast against WIDTH lanes' query
 *   elements, so a row of 5 positions x 3 heads costs what one of 1 x 3 does. The WIDTH partial
 *   sums are kept apart and summed by the same tree.
 * Both give every lane the same operations in the same order (partial c sums dimensions c, c +
 * WIDTH, ... ascending; scores, weights and values summed over positions ascending; no fast math,
 * so nothing is reassociated; a position a lane does not see adds an exact zero; the exponential
 * written here, the same on every element), so a token's attention is bit for bit the same in a
 * decoding row and in a verify row of any length: speculation keeps plain decoding's results.
 * Two passes per task (a row's KV head and WIDTH of its lanes): the scores at every position its
 * lanes see (a block widened at a time), then the weighted values (`few` reads them where they lie,
 * each value vector once for three lanes). A task stops at its last lane's
 * last position, so a prefill chunk's tasks compute the causal half of its scores; the positions
 * skipped would only have added exact zeros to every sum. Built by specbatch/engine/paged_kernel.py. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bfloat16.h"
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#define WIDTH 16
/* value dimensions accumulated at once in `wide`: independent sums in registers, enough to cover
 * the multiply-add's latency, each position's weights loaded once for all of them */
#define VALUE_STEP 16

typedef float f32xW __attribute__((vector_size(WIDTH * sizeof(float))));
typedef double f64xW __attribute__((vector_size(WIDTH * sizeof(double))));
typedef int32_t i32xW __attribute__((vector_size(WIDTH * sizeof(int32_t))));
typedef int64_t i64xW __attribute__((vector_size(WIDTH * sizeof(int64_t))));

/* the sum of WIDTH partials P(0) .. P(15), as a vector's halves are added down to one element */
#define TREE(P) (((((P(0) + P(8)) + (P(4) + P(12))) + ((P(2) + P(10)) + (P(6) + P(14)))) +               \
                  (((P(1) + P(9)) + (P(5) + P(13))) + ((P(3) + P(11)) + (P(7) + P(15))))))

/* e^x on a vector of float32, within a few ulp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two
 * parts), e^r by its Taylor series to r^7 (the next term < 5e-9 relative), 2^n put in the exponent */
static inline f32xW exp_f32(f32xW x) {
    const f32xW low = x * 0 - 87.0f, high = x * 0 + 88.0f;
    x = (f32xW)(((i32xW)x & (x > low)) | ((i32xW)low & ~(x > low)));
    x = (f32xW)(((i32xW)x & (x < high)) | ((i32xW)high & ~(x < high)));
    f32xW t = x * 1.44269504f + 0.5f;
    i32xW n = __builtin_convertvector(t, i32xW); /* toward zero; one less where that rounded up */
    n += (i32xW)(__builtin_convertvector(n, f32xW) > t);
    f32xW whole = __builtin_convertvector(n, f32xW);
    f32xW r = x - whole * 0.693359375f + whole * 2.12194440e-4f;
    f32xW p = x * 0 + 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * (f32xW)((n + 127) << 23);
}

/* float64 lanes (tests, references) take libm's exp, one lane at a time, the same for each */
static inline f64xW exp_f64(f64xW x) {
    for (int l = 0; l < WIDTH; l++) x[l] = exp(x[l]);
    return x;
}

#define PARTIAL(c) partial[c]

/* WIDTH consecutive elements of a pool as one vector, widened exactly: `few` reads values where they
 * lie, in order (a copy of the block first was a store and a load of every element) */
typedef float f32xW_unaligned __attribute__((vector_size(WIDTH * sizeof(float)), aligned(4), may_alias));
typedef double f64xW_unaligned __attribute__((vector_size(WIDTH * sizeof(double)), aligned(8), may_alias));
static inline f32xW vload_f32(const float *from) { return *(const f32xW_unaligned *)from; }
static inline f64xW vload_f64(const double *from) { return *(const f64xW_unaligned *)from; }
static inline f32xW vload_bf16(const uint16_t *from) { return (f32xW)widen_16(from); }

/* bfloat16 keys scored in pairs of dimensions: each float32 element adds the products of a pair of
 * bfloat16s (the odd one's, then the even one's; both exact in float32), by the CPU's dot-product
 * instruction where it has one, else as written here. Half the multiply-adds of widening the keys
 * to float32 first, and no widening; both layouts score this way, so a token's scores keep their
 * bits in any row (the float32 sum orders differ from the widened ones', as another kernel's would). */
typedef uint32_t u32xW __attribute__((vector_size(WIDTH * sizeof(uint32_t))));
typedef uint32_t u32xW_unaligned __attribute__((vector_size(WIDTH * sizeof(uint32_t)), aligned(2), may_alias));
static inline f32xW dot_pairs(f32xW sum, u32xW a, u32xW b) {
#if defined(__AVX512BF16__)
    return (f32xW)_mm512_dpbf16_ps((__m512)sum, (__m512bh)a, (__m512bh)b);
#else
    sum += (f32xW)(a & 0xffff0000u) * (f32xW)(b & 0xffff0000u);
    return sum + (f32xW)(a << 16) * (f32xW)(b << 16);
#endif
}

/* TREE on each of 16 vectors at once, as a vector's halves are added down to one element: element i
 * of the result is the sum of s[i]'s elements in TREE's order (each level adds element c to element
 * c + 8, 4, 2, 1), but two vectors' halves share one addition at each level: 15 additions and 30
 * shuffles for 16 sums, against 64 and 64 one vector at a time (decoding's attention at 32 rows:
 * 0.88-0.98 of the time). The levels interleave the vectors, so result element i comes from
 * s[BIT_REVERSED[i]]: the caller puts key BIT_REVERSED[j] in s[j] and reads key i at element i. */
static const int BIT_REVERSED[WIDTH] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
#define LEVEL_8(a, b) (__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) + \
                       __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#define LEVEL_4(a, b) (__builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) + \
                       __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))
#define LEVEL_2(a, b) (__builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) + \
                       __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))
#define LEVEL_1(a, b) (__builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) + \
                       __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))
#define HALVES_16(s) ({                                                                                  \
    __typeof__((s)[0]) e0 = LEVEL_4(LEVEL_8((s)[0], (s)[1]), LEVEL_8((s)[2], (s)[3]));                   \
    __typeof__((s)[0]) e1 = LEVEL_4(LEVEL_8((s)[4], (s)[5]), LEVEL_8((s)[6], (s)[7]));                   \
    __typeof__((s)[0]) e2 = LEVEL_4(LEVEL_8((s)[8], (s)[9]), LEVEL_8((s)[10], (s)[11]));                 \
    __typeof__((s)[0]) e3 = LEVEL_4(LEVEL_8((s)[12], (s)[13]), LEVEL_8((s)[14], (s)[15]));               \
    LEVEL_1(LEVEL_2(e0, e1), LEVEL_2(e2, e3));                                                           \
})

/* asks for the block of `w` holding position `first` (if any) to be on its way to the second-level
 * cache, unless it follows the block before it in the pool: blocks lie anywhere in the pool, so the
 * hardware's prefetcher finds a block after a jump only after its first lines, but it streams
 * through blocks laid end to end better than requests of ours beside it. Into L2, not L1: a block's
 * 64 line requests at once filled L1's few miss buffers and stalled (decoding's attention, 32 rows,
 * 30 layers of SmolLM2's KV, float32: 21-31 ms -> 16-25 ms, blocks in order or shuffled). A statement,
 * not a function: gcc takes a function that only prefetches for one without effects and drops its calls */
#define PREFETCH(w, pool, first, dim)                                                                    \
    if ((first) < (w)->end && ((first) < (w)->block_size                                                 \
                               || (w)->table[(first) / (w)->block_size] != (w)->table[(first) / (w)->block_size - 1] + 1)) { \
        int64_t count_ = (w)->end - (first) < (w)->block_size ? (w)->end - (first) : (w)->block_size;    \
        const char *from_ = (const char *)((pool) + (w)->table[(first) / (w)->block_size] * (w)->block_size * (dim)); \
        for (int64_t byte_ = 0; byte_ < (int64_t)sizeof(*(pool)) * count_ * (dim); byte_ += 64)          \
            __builtin_prefetch(from_ + byte_, 0, 1);                                                     \
    }

#define DEFINE_KERNEL(NAME, QT, VT, IT, KT, LOAD, VLOAD, STORE, PAIRED, EXP, LOWEST)                     \
typedef struct {                                                                                         \
    const KT *q;                                                                                         \
    KT *out;                                                                                             \
    const KT *k_pool, *v_pool; /* this KV head's */                                                      \
    const int64_t *table;                                                                                \
    int64_t start, end, lanes, head_dim, value_dim, block_size;                                          \
    QT scale;                                                                                            \
    int64_t q_at[WIDTH], at[WIDTH]; /* each lane's (token, head) in q, its row in out */                 \
    IT seen;           /* a lane sees positions 0 .. seen - 1; padding lanes none */                      \
    VT *scores;        /* scores, then weights: `wide` [end] vectors of lanes, `few` per lane */         \
    VT *qt, *acc;      /* [head_dim], [value_dim] vectors of scratch */                                  \
    QT *block;         /* [block_size, dim] one block of keys or values, widened */                      \
} NAME##_chunk;                                                                                          \
                                                                                                         \
/* the block holding position `first` in a pool; `count` its positions in use */                         \
static const KT *NAME##_block(const NAME##_chunk *w, const KT *pool, int64_t first, int64_t dim,         \
                               int64_t *count) {                                                         \
    *count = w->end - first < w->block_size ? w->end - first : w->block_size;                            \
    return pool + w->table[first / w->block_size] * w->block_size * dim;                                 \
}                                                                                                        \
                                                                                                         \
/* `size` elements of a block widened to QT, into w->block */                                            \
static void NAME##_widen(const NAME##_chunk *w, const KT *from, int64_t size) {                          \
    for (int64_t i = 0; i < size; i++) w->block[i] = LOAD(from[i]);                                      \
}                                                                                                        \
                                                                                                         \
/* `wide`'s scores -> weights, softmax per lane over the positions it sees (all lanes see those before  \
 * `start`); returns each lane's sum of weights (`few` does the same per lane, across positions) */      \
static VT NAME##_softmax(const NAME##_chunk *w) {                                                        \
    VT high = w->scores[0] * 0 + LOWEST, total = high * 0;                                               \
    for (int64_t p = 0; p < w->end; p++) {                                                               \
        IT larger = w->scores[p] > high;                                                                 \
        if (p >= w->start) larger &= w->seen > (__typeof__(w->seen[0]))p;                                \
        high = (VT)(((IT)w->scores[p] & larger) | ((IT)high & ~larger));                                 \
    }                                                                                                    \
    for (int64_t p = 0; p < w->end; p++) {                                                               \
        VT weight = EXP(w->scores[p] - high);                                                            \
        if (p >= w->start) weight = (VT)((IT)weight & (w->seen > (__typeof__(w->seen[0]))p));            \
        w->scores[p] = weight;                                                                           \
        total += weight;                                                                                 \
    }                                                                                                    \
    return total;                                                                                        \
}                                                                                                        \
                                                                                                         \
/* across lanes: vector element l is lane l throughout */                                                \
static void NAME##_wide(NAME##_chunk *w) {                                                               \
    int64_t head_dim = w->head_dim, value_dim = w->value_dim;                                            \
    VT *qt = w->qt, *acc = w->acc;                                                                       \
    int paired = PAIRED && head_dim % (2 * WIDTH) == 0;                                                  \
    u32xW *pairs = (u32xW *)w->qt; /* paired: [head_dim / 2] vectors of lanes' pairs of dimensions */   \
    memset(qt, 0, sizeof(VT) * head_dim);                                                                \
    for (int64_t l = 0; l < w->lanes; l++)                                                               \
        for (int64_t d = 0; d < head_dim; d++)                                                           \
            if (paired)                                                                                  \
                pairs[d / 2][l] |= (uint32_t)((const uint16_t *)w->q)[w->q_at[l] + d] << (d % 2 * 16);  \
            else                                                                                         \
                qt[d][l] = LOAD(w->q[w->q_at[l] + d]);                                                   \
    for (int64_t first = 0; first < w->end; first += w->block_size) {                                    \
        int64_t count;                                                                                   \
        const KT *keys = NAME##_block(w, w->k_pool, first, head_dim, &count);                            \
        if (!paired) NAME##_widen(w, keys, count * head_dim);                                            \
        PREFETCH(w, w->k_pool, first + w->block_size, head_dim)                                          \
        PREFETCH(w, w->k_pool, first + 2 * w->block_size, head_dim) /* asked twice: once was 1-8% slower */ \
        PREFETCH(w, w->v_pool, first, value_dim)                                                         \
        for (int64_t i = 0; i < count; i++) { /* a key's WIDTH partial sums, in registers */             \
            if (paired) {                                                                                \
                const uint32_t *key = (const uint32_t *)(keys + i * head_dim);                           \
                f32xW partial[WIDTH];                                                                    \
                for (int64_t c = 0; c < WIDTH; c++) partial[c] = (f32xW){0};                             \
                for (int64_t m = 0; m < head_dim / 2; m += WIDTH)                                        \
                    for (int64_t c = 0; c < WIDTH; c++)                                                  \
                        partial[c] = dot_pairs(partial[c], pairs[m + c], (u32xW){0} + key[m + c]);       \
                w->scores[first + i] = __builtin_convertvector(TREE(PARTIAL) * (float)w->scale, VT);     \
            } else {                                                                                     \
                const QT *key = w->block + i * head_dim;                                                 \
                VT partial[WIDTH];                                                                       \
                for (int64_t c = 0; c < WIDTH; c++) partial[c] = qt[0] * 0;                              \
                for (int64_t m = 0; m < head_dim; m += WIDTH)                                            \
                    for (int64_t c = 0; c < WIDTH; c++) partial[c] += qt[m + c] * key[m + c];            \
                w->scores[first + i] = TREE(PARTIAL) * w->scale;                                         \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    VT total = NAME##_softmax(w);                                                                        \
    memset(acc, 0, sizeof(VT) * value_dim);                                                              \
    for (int64_t first = 0; first < w->end; first += w->block_size) {                                    \
        int64_t count;                                                                                   \
        const KT *values = NAME##_block(w, w->v_pool, first, value_dim, &count);                         \
        NAME##_widen(w, values, count * value_dim);                                                      \
        const VT *weights = w->scores + first;                                                           \
        for (int64_t d0 = 0; d0 < value_dim; d0 += VALUE_STEP) {                                         \
            VT sum[VALUE_STEP];                                                                          \
            for (int64_t dd = 0; dd < VALUE_STEP; dd++) sum[dd] = acc[d0 + dd];                          \
            for (int64_t i = 0; i < count; i++)                                                          \
                for (int64_t dd = 0; dd < VALUE_STEP; dd++) sum[dd] += weights[i] * w->block[i * value_dim + d0 + dd]; \
            for (int64_t dd = 0; dd < VALUE_STEP; dd++) acc[d0 + dd] = sum[dd];                          \
        }                                                                                                \
    }                                                                                                    \
    for (int64_t d = 0; d < value_dim; d++) acc[d] /= total;                                             \
    for (int64_t l = 0; l < w->lanes; l++)                                                               \
        for (int64_t d = 0; d < value_dim; d++) w->out[w->at[l] * value_dim + d] = STORE(acc[d][l]);     \
}                                                                                                        \
                                                                                                         \
/* across dimensions: vector element c is dimension c (mod WIDTH) of one lane; each lane's scores     \
 * and weights together ([lanes, end rounded up to WIDTH] in `scores`), the softmax across positions */ \
static void NAME##_few(NAME##_chunk *w) {                                                                \
    int64_t head_dim = w->head_dim, value_dim = w->value_dim, end = w->end;                              \
    int64_t chunks = head_dim / WIDTH, value_chunks = value_dim / WIDTH, stride = (end + WIDTH - 1) / WIDTH; \
    VT *qv = w->qt, *acc = w->acc; /* [lanes, chunks], [lanes, value_chunks] */                           \
    QT *scores = (QT *)w->scores;                                                                        \
    int paired = PAIRED && head_dim % (2 * WIDTH) == 0;                                                  \
    for (int64_t l = 0; l < w->lanes; l++) /* paired: each lane's bfloat16s as they are */               \
        for (int64_t d = 0; d < head_dim; d++)                                                           \
            if (paired)                                                                                  \
                ((uint16_t *)(qv + l * chunks / 2))[d] = ((const uint16_t *)w->q)[w->q_at[l] + d];       \
            else                                                                                         \
                ((QT *)(qv + l * chunks))[d] = LOAD(w->q[w->q_at[l] + d]);                               \
    for (int64_t first = 0; first < end; first += w->block_size) {                                       \
        int64_t count;                                                                                   \
        const KT *block = NAME##_block(w, w->k_pool, first, head_dim, &count);                           \
        if (!paired) NAME##_widen(w, block, count * head_dim);                                           \
        PREFETCH(w, w->k_pool, first + w->block_size, head_dim)                                          \
        PREFETCH(w, w->k_pool, first + 2 * w->block_size, head_dim) /* asked twice: once was 1-8% slower */ \
        PREFETCH(w, w->v_pool, first, value_dim)                                                         \
        /* the next values block too: decoding's attention in bfloat16 0.93-0.94 of the time (32 x 256 and  \
         * 8 x 512 positions, 30 layers, shuffled), float32 unchanged; across lanes float32 lost 3-4% */  \
        PREFETCH(w, w->v_pool, first + w->block_size, value_dim)                                         \
        for (int64_t i = 0; i < count; i += WIDTH) { /* WIDTH keys a lane, their sums halved at once */   \
            int64_t keys = count - i < WIDTH ? count - i : WIDTH;                                        \
            for (int64_t l = 0; l < w->lanes; l++) {                                                     \
                QT *to = scores + l * stride * WIDTH + first + i;                                        \
                if (paired) {                                                                            \
                    f32xW s[WIDTH];                                                                      \
                    for (int64_t j = 0; j < WIDTH; j++) s[j] = (f32xW){0};                               \
                    for (int64_t m = 0; m < chunks / 2; m++) {                                           \
                        u32xW part = ((const u32xW *)(qv + l * chunks / 2))[m];                          \
                        const uint16_t *key = (const uint16_t *)(block + i * head_dim) + m * 2 * WIDTH;  \
                        for (int64_t j = 0; j < WIDTH; j++)                                              \
                            if (BIT_REVERSED[j] < keys)                                                  \
                                s[j] = dot_pairs(s[j], part,                                             \
                                                 *(const u32xW_unaligned *)(key + BIT_REVERSED[j] * head_dim)); \
                    }                                                                                    \
                    f32xW scored = HALVES_16(s) * (float)w->scale;                                       \
                    for (int64_t j = 0; j < keys; j++) to[j] = scored[j];                                \
                } else {                                                                                 \
                    VT s[WIDTH];                                                                         \
                    for (int64_t j = 0; j < WIDTH; j++) s[j] = qv[0] * 0;                                \
                    for (int64_t m = 0; m < chunks; m++) {                                               \
                        VT part = qv[l * chunks + m];                                                    \
                        const VT *key = (const VT *)(w->block + i * head_dim) + m;                       \
                        for (int64_t j = 0; j < WIDTH; j++)                                              \
                            if (BIT_REVERSED[j] < keys) s[j] += part * key[BIT_REVERSED[j] * chunks];     \
                    }                                                                                    \
                    VT scored = HALVES_16(s) * w->scale;                                                 \
                    for (int64_t j = 0; j < keys; j++) to[j] = scored[j];                                \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    QT total[WIDTH] = {0};                                                                               \
    for (int64_t l = 0; l < w->lanes; l++) {                                                             \
        QT *lane = scores + l * stride * WIDTH, high = LOWEST;                                           \
        int64_t seen = w->seen[l], p = 0;                                                                \
        VT most = (VT){0} + LOWEST; /* the max, in any order: exact (qv may hold bfloat16 pairs) */      \
        for (; p + WIDTH <= seen; p += WIDTH) {                                                          \
            VT x = ((VT *)lane)[p / WIDTH];                                                              \
            IT more = x > most;                                                                          \
            most = (VT)(((IT)x & more) | ((IT)most & ~more));                                            \
        }                                                                                                \
        for (int64_t c = 0; c < WIDTH; c++) high = most[c] > high ? most[c] : high;                      \
        for (; p < seen; p++) high = lane[p] > high ? lane[p] : high;                                    \
        for (int64_t v = 0; v < stride; v++) ((VT *)lane)[v] = EXP(((VT *)lane)[v] - high);              \
        for (p = seen; p < end; p++) lane[p] = 0;                                                        \
    }                                                                                                    \
    for (int64_t p = 0; p < end; p++) /* every lane's sum in order, the lanes' chains side by side */    \
        for (int64_t l = 0; l < w->lanes; l++) total[l] += scores[l * stride * WIDTH + p];               \
    memset(acc, 0, sizeof(VT) * w->lanes * value_chunks);                                                \
    for (int64_t first = 0; first < end; first += w->block_size) {                                       \
        int64_t count;                                                                                   \
        const KT *values = NAME##_block(w, w->v_pool, first, value_dim, &count);                         \
        int64_t l = 0;                                                                                   \
        for (; l + 3 <= w->lanes; l += 3) { /* three lanes' sums in registers: each value loaded once */ \
            const QT *wa = scores + l * stride * WIDTH + first, *wb = wa + stride * WIDTH, *wc = wb + stride * WIDTH; \
            VT *ta = acc + l * value_chunks, *tb = ta + value_chunks, *tc = tb + value_chunks;           \
            for (int64_t m = 0; m < value_chunks; m += 4) { /* a row's 4 vectors in order: one stream */ \
                int64_t last = value_chunks - 1; /* past it, the last vector again: summed alike, stored alike */ \
                int64_t m1 = m + 1 < last ? m + 1 : last, m2 = m + 2 < last ? m + 2 : last, m3 = m + 3 < last ? m + 3 : last; \
                VT a0 = ta[m], a1 = ta[m1], a2 = ta[m2], a3 = ta[m3];                                    \
                VT b0 = tb[m], b1 = tb[m1], b2 = tb[m2], b3 = tb[m3];                                    \
                VT c0 = tc[m], c1 = tc[m1], c2 = tc[m2], c3 = tc[m3];                                    \
                for (int64_t i = 0; i < count; i++) {                                                    \
                    const KT *row = values + i * value_dim;                                              \
                    VT v0 = VLOAD(row + m * WIDTH), v1 = VLOAD(row + m1 * WIDTH);                        \
                    VT v2 = VLOAD(row + m2 * WIDTH), v3 = VLOAD(row + m3 * WIDTH);                       \
                    a0 += wa[i] * v0, a1 += wa[i] * v1, a2 += wa[i] * v2, a3 += wa[i] * v3;              \
                    b0 += wb[i] * v0, b1 += wb[i] * v1, b2 += wb[i] * v2, b3 += wb[i] * v3;              \
                    c0 += wc[i] * v0, c1 += wc[i] * v1, c2 += wc[i] * v2, c3 += wc[i] * v3;              \
                }                                                                                        \
                ta[m3] = a3, ta[m2] = a2, ta[m1] = a1, ta[m] = a0;                                       \
                tb[m3] = b3, tb[m2] = b2, tb[m1] = b1, tb[m] = b0;                                       \
                tc[m3] = c3, tc[m2] = c2, tc[m1] = c1, tc[m] = c0;                                       \
            }                                                                                            \
        }                                                                                                \
        for (; l < w->lanes; l++) { /* a lane's sums in registers across the block */                   \
            const QT *weight = scores + l * stride * WIDTH + first;                                      \
            VT *to = acc + l * value_chunks;                                                             \
            int64_t m = 0;                                                                               \
            for (; m + 4 <= value_chunks; m += 4) {                                                      \
                VT s0 = to[m], s1 = to[m + 1], s2 = to[m + 2], s3 = to[m + 3];                           \
                for (int64_t i = 0; i < count; i++) {                                                    \
                    const KT *value = values + i * value_dim + m * WIDTH;                                \
                    s0 += weight[i] * VLOAD(value);                                                      \
                    s1 += weight[i] * VLOAD(value + WIDTH);                                              \
                    s2 += weight[i] * VLOAD(value + 2 * WIDTH);                                          \
                    s3 += weight[i] * VLOAD(value + 3 * WIDTH);                                          \
                }                                                                                        \
                to[m] = s0, to[m + 1] = s1, to[m + 2] = s2, to[m + 3] = s3;                              \
            }                                                                                            \
            for (; m < value_chunks; m++) {                                                              \
                VT sum = to[m];                                                                          \
                for (int64_t i = 0; i < count; i++) sum += weight[i] * VLOAD(values + i * value_dim + m * WIDTH); \
                to[m] = sum;                                                                             \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    for (int64_t l = 0; l < w->lanes; l++)                                                               \
        for (int64_t d = 0; d < value_dim; d++)                                                          \
            w->out[w->at[l] * value_dim + d] = STORE(acc[l * value_chunks + d / WIDTH][d % WIDTH] / total[l]); \
}                                                                                                        \
                                                                                                         \
void NAME(const KT *q, const KT *k_pool, const KT *v_pool, KT *out, const int64_t *tables,              \
          int64_t table_stride, int64_t q_stride, const int64_t *row_first, const int64_t *row_tokens,   \
          const int64_t *row_start, int64_t num_rows, int64_t num_heads, int64_t num_kv_heads,            \
          int64_t head_dim, int64_t value_dim, int64_t pool_positions, int64_t block_size, double scale,  \
          int64_t few_lanes, int num_threads) {                                                          \
    int64_t group = num_heads / num_kv_heads, most_lanes = 0;                                           \
    for (int64_t r = 0; r < num_rows; r++)                                                               \
        most_lanes = row_tokens[r] * group > most_lanes ? row_tokens[r] * group : most_lanes;            \
    int64_t chunks = (most_lanes + WIDTH - 1) / WIDTH; /* a row's lanes, WIDTH at a time */              \
    int64_t widest = head_dim > value_dim ? head_dim : value_dim;                                        \
    /* every (row, KV head, chunk of lanes) its own task: a prefill chunk's lanes spread over threads */ \
    _Pragma("omp parallel for collapse(3) schedule(dynamic, 1) num_threads(num_threads)")                 \
    for (int64_t r = 0; r < num_rows; r++) {                                                             \
        for (int64_t kh = 0; kh < num_kv_heads; kh++) {                                                  \
            for (int64_t chunk = 0; chunk < chunks; chunk++) {                                           \
                int64_t lanes = row_tokens[r] * group, lane0 = chunk * WIDTH;                            \
                if (lane0 >= lanes) continue;                                                            \
                int64_t count = lanes - lane0 < WIDTH ? lanes - lane0 : WIDTH;                           \
                /* positions past the chunk's last lane's are seen by none of its lanes: they would    \
                 * only add exact zeros, so the chunk stops there (a prefill's causal half) */           \
                int64_t end = row_start[r] + (lane0 + count - 1) / group + 1;                            \
                /* one allocation, the vectors first (aligned): qt, acc, scores, then the widened block */ \
                size_t vectors = head_dim + value_dim + end + WIDTH; /* scores: `few` rounds each lane's up */ \
                size_t bytes = sizeof(VT) * vectors + sizeof(QT) * block_size * widest;                  \
                VT *work = aligned_alloc(sizeof(VT), (bytes + sizeof(VT) - 1) / sizeof(VT) * sizeof(VT)); \
                NAME##_chunk w = {.q = q, .out = out, .k_pool = k_pool + kh * pool_positions * head_dim, \
                                  .v_pool = v_pool + kh * pool_positions * value_dim,                    \
                                  .table = tables + r * table_stride, .start = row_start[r], .end = end, \
                                  .lanes = count, .head_dim = head_dim, .value_dim = value_dim,          \
                                  .block_size = block_size, .scale = (QT)scale, .seen = {0},             \
                                  .scores = work + head_dim + value_dim, .qt = work, .acc = work + head_dim, \
                                  .block = (QT *)(work + vectors)};                                      \
                for (int64_t l = 0; l < w.lanes; l++) {                                                  \
                    int64_t lane = lane0 + l;                                                            \
                    w.q_at[l] = (row_first[r] + lane / group) * q_stride + (kh * group + lane % group) * head_dim; \
                    w.at[l] = (row_first[r] + lane / group) * num_heads + kh * group + lane % group;     \
                    w.seen[l] = row_start[r] + lane / group + 1;                                         \
                }                                                                                        \
                if (w.lanes <= few_lanes)                                                                \
                    NAME##_few(&w);                                                                      \
                else                                                                                     \
                    NAME##_wide(&w);                                                                     \
                free(work);                                                                              \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
}

#define AS_IS(x) (x)

DEFINE_KERNEL(paged_attention_f32, float, f32xW, i32xW, float, AS_IS, vload_f32, AS_IS, 0, exp_f32, -FLT_MAX)
DEFINE_KERNEL(paged_attention_f64, double, f64xW, i64xW, double, AS_IS, vload_f64, AS_IS, 0, exp_f64, -DBL_MAX)
DEFINE_KERNEL(paged_attention_bf16, float, f32xW, i32xW, uint16_t, widen, vload_bf16, narrow, 1, exp_f32,
              -FLT_MAX)
