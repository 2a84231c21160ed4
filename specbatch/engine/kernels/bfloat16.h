/* bfloat16 as raw 16-bit words: widened to float32 exactly, narrowed to nearest, ties to even (as
 * torch rounds), NaN kept quiet. Included by the kernels that read or write bfloat16. */
#ifndef SPECBATCH_BFLOAT16_H
#define SPECBATCH_BFLOAT16_H
#include <stdint.h>

static inline float widen(uint16_t bits) {
    union { uint32_t word; float value; } widened = {.word = (uint32_t)bits << 16};
    return widened.value;
}

static inline uint16_t narrow(float value) {
    union { float value; uint32_t word; } bits = {.value = value};
    if ((bits.word & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits.word >> 16) | 0x40u);  /* NaN */
    return (uint16_t)((bits.word + 0x7fffu + ((bits.word >> 16) & 1u)) >> 16);
}

/* the same on 16 words at once, bit for bit (the streamed GEMM's epilogue) */
typedef float bf16_floats __attribute__((vector_size(16 * sizeof(float)), aligned(4), may_alias));
typedef uint16_t bf16_words __attribute__((vector_size(16 * sizeof(uint16_t)), aligned(2), may_alias));
typedef uint32_t bf16_wide_words __attribute__((vector_size(16 * sizeof(uint32_t))));

static inline bf16_floats widen_16(const uint16_t *from) {
    return (bf16_floats)(__builtin_convertvector(*(const bf16_words *)from, bf16_wide_words) << 16);
}

static inline void narrow_16(uint16_t *to, bf16_floats value) {
    bf16_wide_words bits = (bf16_wide_words)value;
    bf16_wide_words rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16, quiet = (bits >> 16) | 0x40u;
    bf16_wide_words nan = (bf16_wide_words)((bits & 0x7fffffffu) > 0x7f800000u);
    *(bf16_words *)to = __builtin_convertvector((quiet & nan) | (rounded & ~nan), bf16_words);
}

#endif
