/* e^x on 16 float32 lanes, bit for bit what glibc's expf returns: its algorithm (from ARM's
 * optimized-routines), transcribed. x = (k + r) ln2 / 32 for an integer k, |r| <= 1/2, then
 * e^x = 2^(k/32) · 2^(r/32): 2^(k mod 32 / 32) from a table of 32 doubles (its exponent bits carry
 * k div 32), 2^(r/32) by a cubic, all in double precision and rounded once to float32. Every lane
 * computes what the scalar computes, so a fused SiLU keeps the bits of the element-wise form (and a
 * row's results do not depend on its neighbours). Checked against this machine's libm (glibc) on
 * every float32 below 88 in magnitude, all 2,237,661,184 equal; lanes past that (overflow,
 * underflow, infinities, NaN) are left to `expf` itself by the caller (`expf_lanes_exact`).
 * Included by the kernels that apply SiLU. */
#ifndef SPECBATCH_VECTOR_EXPF_H
#define SPECBATCH_VECTOR_EXPF_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXPF_LANES 16
typedef float expf_floats __attribute__((vector_size(EXPF_LANES * sizeof(float)), aligned(4), may_alias));
typedef uint32_t expf_words __attribute__((vector_size(EXPF_LANES * sizeof(uint32_t))));
typedef float expf_half_floats __attribute__((vector_size(EXPF_LANES / 2 * sizeof(float))));
typedef double expf_half_doubles __attribute__((vector_size(EXPF_LANES / 2 * sizeof(double))));
typedef uint64_t expf_half_words __attribute__((vector_size(EXPF_LANES / 2 * sizeof(uint64_t))));

/* 2^(i/32) rounded to the nearest double, less i << 47 (the k div 32 added back as exponent bits),
 * in four vectors of 8 for lookups by shuffle */
static const expf_half_words EXP2_BY_32[4] = {
    {0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
     0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1},
    {0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
     0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585},
    {0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
     0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d},
    {0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
     0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540}};

static inline expf_half_floats expf_half(expf_half_floats x) {
    const double n = 32, inv_ln2_n = 0x1.71547652b82fep+0 * n, shift = 0x1.8p+52;
    const double c0 = 0x1.c6af84b912394p-5 / n / n / n, c1 = 0x1.ebfce50fac4f3p-3 / n / n,
                 c2 = 0x1.62e42ff0c52d6p-1 / n;
    expf_half_doubles z = inv_ln2_n * __builtin_convertvector(x, expf_half_doubles);
    expf_half_doubles kd = z + shift; /* z rounded to the integer k, held in the low bits */
    expf_half_words k = (expf_half_words)kd, upper = -((k >> 4) & 1); /* entries 16-31 */
    kd -= shift;
    expf_half_doubles r = z - kd;
    expf_half_words table = (__builtin_shuffle(EXP2_BY_32[2], EXP2_BY_32[3], k) & upper)
                            | (__builtin_shuffle(EXP2_BY_32[0], EXP2_BY_32[1], k) & ~upper);
    expf_half_doubles scale = (expf_half_doubles)(table + (k << 47));
    expf_half_doubles cubic = c0 * r + c1, r2 = r * r, y = c2 * r + 1;
    y = cubic * r2 + y;
    return __builtin_convertvector(y * scale, expf_half_floats);
}

/* expf on every lane: vectorised where every |x| < 88, else lane by lane */
static inline expf_floats expf_lanes_exact(expf_floats x) {
    expf_words magnitude = (expf_words)x & 0x7fffffffu;
    int ordinary = 1;
    for (int j = 0; j < EXPF_LANES; j++) ordinary &= magnitude[j] < 0x42b00000u; /* 88.0f */
    if (!ordinary) {
        for (int j = 0; j < EXPF_LANES; j++) x[j] = expf(x[j]);
        return x;
    }
    expf_half_floats low, high;
    memcpy(&low, &x, sizeof low);
    memcpy(&high, (const char *)&x + sizeof low, sizeof high);
    low = expf_half(low), high = expf_half(high);
    memcpy(&x, &low, sizeof low);
    memcpy((char *)&x + sizeof low, &high, sizeof high);
    return x;
}

#endif
