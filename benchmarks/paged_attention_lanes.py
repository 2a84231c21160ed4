"""Attention over the paged cache per layer: the in-place kernel against a gather and SDPA, by query
positions per row, for a dtype, at a model's head shape. The kernel's time grows with lanes (query
positions x query heads per KV head), the gather's barely; `engine/paged_kernel.FEW_LANES` is
where the kernel's two layouts cross.

    python benchmarks/paged_attention_lanes.py --rows 32 --context 256 --query 1,2,3,5 --dtype float32,bfloat16

`--layers 30 --shuffle` reads a model's worth of KV from memory, as a pass does (one layer's pools
stay in cache across repeats), with blocks anywhere in the pool, as after rows free and take them.
`--against OLD/paged_attention.c` (another version of the kernel saved beside its `bfloat16.h`, with
this tree's call signature: from 857eeb9 on) times that build instead of the gather, the two called
alternately in one process, and prints the largest difference between their outputs.

Run it alone: two torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import torch

from specbatch.engine import c_library, paged_cache, paged_kernel
from specbatch.engine.paged_cache import build_layout


def time_layers(q: torch.Tensor, pools: list[tuple[torch.Tensor, torch.Tensor]], layout: paged_cache.PassLayout,
                kernel: bool | ctypes.CDLL, repeats: int) -> tuple[float, torch.Tensor]:
    """Milliseconds for every layer's attention, through the kernel (this tree's, or the library
    given) or gathered for SDPA, and the last layer's output."""
    supports, load = paged_kernel.supports, paged_kernel.load
    if kernel is False:
        paged_kernel.supports = lambda *tensors: False
    elif kernel is not True:
        paged_kernel.load = lambda: kernel  # type: ignore[assignment]  # the library given
    try:
        for keys, values in pools[:3]:
            paged_cache.attend(q, keys, values, layout, 0.125)
        started = time.perf_counter()
        for _ in range(repeats):
            for keys, values in pools:
                out = paged_cache.attend(q, keys, values, layout, 0.125)
        return (time.perf_counter() - started) / repeats * 1000, out
    finally:
        paged_kernel.supports, paged_kernel.load = supports, load


def best_of_alternations(q: torch.Tensor, pools: list[tuple[torch.Tensor, torch.Tensor]],
                         layout: paged_cache.PassLayout, other: bool | ctypes.CDLL,
                         repeats: int) -> tuple[float, float, float]:
    """(this kernel's ms, the other's, their outputs' largest difference), best of 5 alternations."""
    mine, theirs = [], []
    for _ in range(5):
        ms, out = time_layers(q, pools, layout, True, repeats)
        other_ms, other_out = time_layers(q, pools, layout, other, repeats)
        mine.append(ms)
        theirs.append(other_ms)
    return min(mine), min(theirs), float((out.double() - other_out.double()).abs().max())


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
    parser.add_argument("--against", type=Path, help="another version of kernels/paged_attention.c, timed instead "
                        "of the gather")
    args = parser.parse_args()
    other: bool | ctypes.CDLL = False
    if args.against:
        built = c_library.load(args.against, paged_kernel.FLAGS,
                               dict.fromkeys(paged_kernel.FUNCTIONS.values(), paged_kernel._ARGS), "-")
        assert built is not None, f"{args.against} did not build"
        other = built
    name = "against" if args.against else "gather"
    longest = max(16, *map(int, args.query.split(",")))
    per_row = -(-(args.context + longest) // args.block)
    order = (torch.randperm(args.rows * per_row, generator=torch.Generator().manual_seed(0)) if args.shuffle
             else torch.arange(args.rows * per_row))
    tables = order.view(args.rows, per_row).tolist()
    print(f"{'dtype':9} {'query':>5} {'lanes':>5} {'kernel ms':>9} {name + ' ms':>10} {'kernel/' + name:>14} "
          f"{'max diff':>9}")
    for dtype in (getattr(torch, name) for name in args.dtype.split(",")):
        pool = (args.kv_heads, args.rows * per_row * args.block, args.head_dim)
        pools = [(torch.randn(pool).to(dtype), torch.randn(pool).to(dtype)) for _ in range(args.layers)]
        for query_len in map(int, args.query.split(",")):
            layout = build_layout(tables, [args.context] * args.rows, [query_len] * args.rows, args.block,
                                  torch.device("cpu"))
            q = torch.randn(args.rows * query_len, args.heads, args.head_dim).to(dtype)
            kernel, baseline, difference = best_of_alternations(q, pools, layout, other, args.repeats)
            lanes = query_len * args.heads // args.kv_heads
            print(f"{str(dtype).removeprefix('torch.'):9} {query_len:5} {lanes:5} {kernel:9.2f} {baseline:10.2f} "
                  f"{kernel / baseline:14.2f} {difference:9.2g}")


if __name__ == "__main__":
    main()
