"""Attention over the paged cache per layer: the in-place kernel against a gather and SDPA, by query
positions per row, for a dtype, at a model's head shape. The kernel's time grows with lanes (query
positions x query heads per KV head), the gather's barely; `engine/paged_kernel.FEW_LANES` is
where the kernel's two layouts cross.

    python benchmarks/paged_attention_lanes.py --rows 32 --context 256 --query 1,2,3,5 --dtype float32,bfloat16

`--layers 30 --shuffle` reads a model's worth of KV from memory, as a pass does (one layer's pools
stay in cache across repeats), with blocks anywhere in the pool, as after rows free and take them.

Run it alone: two torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import time

import torch

from specbatch.engine import paged_cache, paged_kernel
from specbatch.engine.paged_cache import build_layout


def time_layers(q: torch.Tensor, pools: list[tuple[torch.Tensor, torch.Tensor]], layout: paged_cache.PassLayout,
                kernel: bool, repeats: int) -> float:
    """Milliseconds for every layer's attention, through the kernel or gathered for SDPA."""
    supports = paged_kernel.supports
    if not kernel:
        paged_kernel.supports = lambda *tensors: False
    try:
        for keys, values in pools[:3]:
            paged_cache.attend(q, keys, values, layout, 0.125)
        started = time.perf_counter()
        for _ in range(repeats):
            for keys, values in pools:
                paged_cache.attend(q, keys, values, layout, 0.125)
        return (time.perf_counter() - started) / repeats * 1000
    finally:
        paged_kernel.supports = supports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--query", default="1,2,3,5")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--heads", type=int, default=9)  # SmolLM2-135M
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--layers", type=int, default=1, help="pools of as many layers, read in turn")
    parser.add_argument("--shuffle", action="store_true", help="rows' blocks anywhere in the pool, not in order")
    args = parser.parse_args()
    longest = max(16, *map(int, args.query.split(",")))
    per_row = -(-(args.context + longest) // args.block)
    order = (torch.randperm(args.rows * per_row, generator=torch.Generator().manual_seed(0)) if args.shuffle
             else torch.arange(args.rows * per_row))
    tables = order.view(args.rows, per_row).tolist()
    print(f"{'dtype':9} {'query':>5} {'lanes':>5} {'kernel ms':>9} {'gather ms':>9} {'kernel/gather':>13}")
    for dtype in (getattr(torch, name) for name in args.dtype.split(",")):
        pool = (args.kv_heads, args.rows * per_row * args.block, args.head_dim)
        pools = [(torch.randn(pool).to(dtype), torch.randn(pool).to(dtype)) for _ in range(args.layers)]
        for query_len in map(int, args.query.split(",")):
            layout = build_layout(tables, [args.context] * args.rows, [query_len] * args.rows, args.block,
                                  torch.device("cpu"))
            q = torch.randn(args.rows * query_len, args.heads, args.head_dim).to(dtype)
            kernel = time_layers(q, pools, layout, True, args.repeats)
            gather = time_layers(q, pools, layout, False, args.repeats)
            lanes = query_len * args.heads // args.kv_heads
            print(f"{str(dtype).removeprefix('torch.'):9} {query_len:5} {lanes:5} {kernel:9.2f} {gather:9.2f} "
                  f"{kernel / gather:13.2f}")


if __name__ == "__main__":
    main()
