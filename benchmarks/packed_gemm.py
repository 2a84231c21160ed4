"""A decoder's GEMMs at decoding's row counts: `F.linear` against weights packed once for oneDNN
(`engine/packed_linear.py`), in float32 and bfloat16, at SmolLM2-135M's projection shapes.

    python benchmarks/packed_gemm.py --rows 1,8,32,160 --dtype float32,bfloat16

Prints GFLOPS per shape (the weight stays hot in cache here, so a real pass, which streams every
weight from memory once, runs slower). Run it alone: two torch processes on two cores slow each
other several times over.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from specbatch.engine.packed_linear import PackedLinear, packs

# SmolLM2-135M: fused q/k/v, attention output, fused gate/up, down, the output layer
SHAPES = {"qkv": (960, 576), "out": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "lm_head": (49152, 576)}


def gflops(fn, args: tuple, flops: int, seconds: float = 0.2) -> float:
    """Throughput of `fn(*args)` over about `seconds` after a few untimed calls."""
    for _ in range(3):
        fn(*args)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn(*args)
        calls += 1
    return flops * calls / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,160")
    parser.add_argument("--dtype", default="float32,bfloat16")
    args = parser.parse_args()
    print(f"{'dtype':9} {'shape':8} {'rows':>4} {'F.linear':>9} {'packed':>9} {'packed/F.linear':>15}")
    for dtype in (getattr(torch, name) for name in args.dtype.split(",")):
        for name, (out_features, in_features) in SHAPES.items():
            weight = torch.randn(out_features, in_features).to(dtype)
            linear = PackedLinear(weight)
            if not packs(weight):
                print(f"{name}: {dtype} weights are not packed here")
                continue
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, in_features).to(dtype)
                flops = 2 * rows * out_features * in_features
                plain = gflops(F.linear, (x, weight), flops)
                # the packed weight whatever the size (`PackedLinear` keeps small float32 GEMMs on F.linear)
                packed = gflops(torch.ops.mkldnn._linear_pointwise, (x, linear.packed, None, "none", [], ""), flops)
                print(f"{str(dtype).removeprefix('torch.'):9} {name:8} {rows:4} {plain:9.0f} {packed:9.0f} "
                      f"{packed / plain:15.2f}")


if __name__ == "__main__":
    main()
