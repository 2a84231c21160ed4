"""`models.dtype: auto`: the dtype a job runs at, chosen for this machine and fixed in the manifest.

bfloat16 where the matrix units have it and measure faster than float32 (on this 2-core AVX-512 /
AMX machine the 2048³ GEMM peak measured ~2,100-2,600 GFLOPS in bfloat16 against ~370 in float32;
a CPU without AVX512-BF16 or AMX runs bfloat16 GEMMs slower than float32), else float32. A job
resolves it once, when its manifest is written: a resume on another machine keeps the dtype its
first outputs were made at, since the dtype changes outputs.
"""

from __future__ import annotations

from functools import cache

import torch

from specbatch.engine.gemm_peak import gemm_peak

AUTO = "auto"
BF16_MIN_GAIN = 1.2  # bfloat16's measured GEMM peak over float32's needed to pick it


def concrete_dtype(name: str, device: str) -> str:
    """`name`, or for "auto" the dtype this machine runs fastest (see the module's docstring)."""
    return name if name != AUTO else _fastest(device)


@cache
def _fastest(device: str) -> str:
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return "float32"
    bf16, fp32 = gemm_peak(torch.bfloat16, device), gemm_peak(torch.float32, device)
    return "bfloat16" if bf16.gflops >= BF16_MIN_GAIN * fp32.gflops else "float32"
