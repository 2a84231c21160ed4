"""`kernels/vector_expf.h`: the vectorised exponential returns libm's `expf` bits for every float32,
checked exhaustively below 88 in magnitude (2.2 billion values, ~10 s in C) and on the values left
to `expf` itself (overflow, underflow, infinities, NaN). A table entry off by 2^-40 of itself flips
the rounding of a few float32 results in millions: the streamed GEMM's tests miss that, this does not."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from specbatch.engine.streamed_gemm import FLAGS, SOURCE

CHECK = r"""
#include <stdio.h>
#include "vector_expf.h"
int main(void) {
    long differ = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t word = 0; word < 0x42b00000u; word += EXPF_LANES) {
            expf_floats x;
            for (int j = 0; j < EXPF_LANES; j++) { uint32_t w = (sign << 31) | (word + j); memcpy(&x[j], &w, 4); }
            expf_floats e = expf_lanes_exact(x);
            for (int j = 0; j < EXPF_LANES; j++) { float want = expf(x[j]); differ += memcmp(&want, &e[j], 4) != 0; }
        }
    float odd[EXPF_LANES] = {88.0f, -88.0f, 100.0f, -104.0f, INFINITY, -INFINITY, NAN, 1.0f,
                             0.5f, -0.0f, 0.0f, 89.0f, -120.0f, 88.72f, -87.0f, 3.0f};
    expf_floats x;
    memcpy(&x, odd, sizeof odd);
    expf_floats e = expf_lanes_exact(x);
    for (int j = 0; j < EXPF_LANES; j++) { float want = expf(odd[j]); differ += memcmp(&want, &e[j], 4) != 0; }
    printf("%ld\n", differ);
    return 0;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler here")
def test_every_float32_gets_libms_expf_bits(tmp_path):
    source = tmp_path / "check.c"
    source.write_text(CHECK)
    flags = [flag for flag in FLAGS if flag not in ("-fopenmp", "-fPIC")]
    subprocess.run(["gcc", *flags, f"-I{SOURCE.parent}", "-o", str(tmp_path / "check"), str(source), "-lm"],
                   check=True, timeout=120)
    result = subprocess.run([str(tmp_path / "check")], check=True, capture_output=True, text=True, timeout=600)
    assert int(result.stdout) == 0
