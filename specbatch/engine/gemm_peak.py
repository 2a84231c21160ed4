"""The machine's matrix-multiply peak at a dtype, and model FLOP utilisation against it (issue 41).

    MFU = tokens/s × 2 × parameters ÷ GEMM peak

A decoder token costs about two FLOPs per weight (a multiply and an add), so MFU says how much of the
machine's matrix units a decoding run keeps busy, whatever the model's size (attention over the
context is left out, as is usual: it is small at a bench's short contexts). The peak is
measured rather than read off a datasheet, since what torch reaches here (AMX or not, threads, the
BLAS it was built with) is what an engine can reach: a square 2048 matmul, best of a few (about 1 s
on a 2-core CPU). It is cached per machine, device, dtype, threads and torch version in
`$SPECBATCH_CACHE_DIR/gemm/`, so every bench after the first reads it back instead of measuring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specbatch.engine.gguf_models import cache_root
from specbatch.engine.host import measured_once

SIZE = 2048  # large enough that a matmul's own overhead is noise next to its FLOPs
REPEATS = 5


@dataclass(frozen=True)
class GemmPeak:
    gflops: float
    dtype: torch.dtype
    size: int  # the side of the square matmul measured
    cached: bool  # read back from the cache, not measured by this call

    def describe(self) -> str:
        source = "cached" if self.cached else "measured"
        return f"{self.gflops:.0f} GFLOPS {dtype_name(self.dtype)} GEMM peak ({self.size}³, {source})"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mfu(tokens_per_s: float, num_params: int, peak_gflops: float) -> float:
    """Model FLOP utilisation: the share of the peak that `tokens_per_s` through `num_params` weights uses."""
    return tokens_per_s * 2 * num_params / (peak_gflops * 1e9)


def measure_gflops(dtype: torch.dtype, device: str = "cpu", size: int = SIZE, repeats: int = REPEATS) -> float:
    """GFLOPS of the fastest of `repeats` square matmuls (after an untimed one that warms the BLAS up)."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        synchronize()  # a CUDA matmul returns at launch: time its end
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def gemm_peak(dtype: torch.dtype, device: str = "cpu", directory: Path | None = None) -> GemmPeak:
    """The peak at `dtype` on `device`: read from the cache where this machine measured it, else measured
    (about a second) and cached."""
    what = "\n".join(["gemm peak", str(torch.device(device)), dtype_name(dtype), str(torch.get_num_threads()),
                      torch.__version__, str(SIZE)])
    gflops, cached = measured_once(directory or cache_root() / "gemm", what, lambda: measure_gflops(dtype, device))
    return GemmPeak(gflops, dtype, SIZE, cached)
