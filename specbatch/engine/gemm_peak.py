"""The machine's matrix-multiply peak at a dtype, and model FLOP utilisation against it (issue 41).

    MFU = tokens/s × 2 × parameters ÷ GEMM peak

A decoder token costs about two FLOPs per weight (a multiply and an add), so MFU says how much of the
machine's matrix units a decoding run keeps busy, whatever the model's size (attention over the
context is left out, as is usual: it is small at a bench's short contexts). The peak is
measured rather than read off a datasheet, since what is reached here (AMX or not, threads, the
BLAS torch was built with) is what an engine can reach: a square 2048 product, best of a few, by
torch's matmul and, on a CPU, by the GEMMs the engine itself runs (the streamed kernel's panels,
oneDNN's packed bfloat16 weight), whichever is fastest (2-3 s on a 2-core CPU). Torch's matmul
alone is not the machine's peak: on an AMD EPYC (Zen 5) its float32 product ran at 163-204 GFLOPS
where the streamed kernel ran the same product at 396-459, so MFU against it read 149%. It is
cached per machine, device, dtype, threads, torch version and kernel sources in
`$SPECBATCH_CACHE_DIR/gemm/`, so every bench after the first reads it back instead of measuring.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specbatch.engine import c_library, onednn
from specbatch.engine.gguf_models import cache_root
from specbatch.engine.host import measured_once
from specbatch.engine.streamed_gemm import Panels

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
    """GFLOPS of the fastest of `repeats` square products, each way the engine may run one (`products`)."""
    x = torch.randn(size, size, dtype=dtype, device=device)
    weight = torch.randn(size, size, dtype=dtype, device=device)
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    best = float("inf")
    for product in products(weight):
        product(x)  # untimed: warms the library up
        synchronize()
        for _ in range(repeats):
            started = time.perf_counter()
            product(x)
            synchronize()  # a CUDA matmul returns at launch: time its end
            best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def products(weight: torch.Tensor) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """x·Wᵀ by torch's matmul and by each of the engine's own GEMMs that takes `weight` here."""
    ways: list[Callable[[torch.Tensor], torch.Tensor]] = [lambda x: x @ weight.T]
    if Panels.packs(weight):
        ways.append(Panels(weight, None).linear)
    if onednn.packs(weight):
        packed = onednn.pack(weight)
        ways.append(lambda x: onednn.linear(x, packed, None))
    return ways


def gemm_peak(dtype: torch.dtype, device: str = "cpu", directory: Path | None = None) -> GemmPeak:
    """The peak at `dtype` on `device`: read from the cache where this machine measured it, else measured
    (about a second) and cached."""
    what = "\n".join(["gemm peak", str(torch.device(device)), dtype_name(dtype), str(torch.get_num_threads()),
                      torch.__version__, str(SIZE), c_library.sources_digest()])
    gflops, cached = measured_once(directory or cache_root() / "gemm", what, lambda: measure_gflops(dtype, device))
    return GemmPeak(gflops, dtype, SIZE, cached)
