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

#endif
