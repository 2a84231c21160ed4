"""A decoder's GEMMs at decoding's row counts, three ways: `F.linear`, oneDNN's packed weight, and the
streamed kernel's panels (`engine/streamed_gemm.py`), in float32 and bfloat16, at SmolLM2-135M's
projection shapes, with each weight read from memory as in a real pass (copies of it cycled, about
200 MB in all, so none stays in cache).

    python benchmarks/packed_gemm.py --rows 1,4,8,16,32,64 --dtype float32,bfloat16

Prints GFLOPS per shape and way, and the weight's bytes per second through the streamed kernel.
`engine/panel_rows.py` measures where the streamed kernel stops winning, per machine. Run it alone: two
torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specbatch.engine import onednn
from specbatch.engine.streamed_gemm import Panels

# SmolLM2-135M: fused q/k/v, attention output, gate (and up), down, the output layer
SHAPES = {"qkv": (960, 576), "out": (576, 576), "gate": (1536, 576), "down": (576, 1536), "lm_head": (49152, 576)}
STREAMED_BYTES = 200e6


def seconds_per_call(call: Callable[[int], object], copies: int, seconds: float = 0.3) -> float:
    """Mean time of `call(i)` cycling over the copies, after one untimed round."""
    for i in range(copies):
        call(i)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for i in range(copies):
            call(i)
        calls += copies
    return (time.perf_counter() - started) / calls


def timings(x: torch.Tensor, weights: list[torch.Tensor], packed: list[torch.Tensor] | None,
            panels: list[Panels] | None) -> list[float | None]:
    """Seconds per call of `F.linear`, oneDNN's packed GEMM and the streamed kernel (None where absent)."""
    copies = len(weights)
    return [seconds_per_call(lambda i: F.linear(x, weights[i]), copies),
            None if packed is None else seconds_per_call(
                lambda i: onednn.linear(x, packed[i], None), copies),
            None if panels is None else seconds_per_call(lambda i: panels[i].linear(x), copies)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16,32,64")
    parser.add_argument("--dtype", default="float32,bfloat16")
    args = parser.parse_args()
    print(f"{'dtype':9} {'shape':8} {'rows':>4} {'F.linear':>9} {'oneDNN':>9} {'streamed':>9} {'GB/s':>6}")
    for dtype in (getattr(torch, name) for name in args.dtype.split(",")):
        for name, (out_features, in_features) in SHAPES.items():
            size = out_features * in_features * dtype.itemsize
            copies = max(2, int(STREAMED_BYTES // size))
            weights = [torch.randn(out_features, in_features).to(dtype) for _ in range(copies)]
            packed = [onednn.pack(w) for w in weights] if onednn.packs(weights[0]) else None
            panels = [Panels(w, None) for w in weights] if Panels.packs(weights[0]) else None
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, in_features).to(dtype)
                flops = 2 * rows * out_features * in_features
                times = timings(x, weights, packed, panels)
                streamed = times[2]
                cells = [f"{flops / t / 1e9:9.0f}" if t else f"{'-':>9}" for t in times]
                rate = f"{size / streamed / 1e9:6.1f}" if streamed else f"{'-':>6}"
                print(f"{str(dtype).removeprefix('torch.'):9} {name:8} {rows:4} {' '.join(cells)} {rate}")


if __name__ == "__main__":
    main()
