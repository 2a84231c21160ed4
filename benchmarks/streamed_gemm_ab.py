"""Two builds of the streamed GEMM side by side: this tree's `kernels/streamed_gemm.c` against
another version of it (`--against`, e.g. `git show REV:specbatch/engine/kernels/streamed_gemm.c`
saved beside its `bfloat16.h`), at SmolLM2-135M's projection shapes, weights cycled out of cache,
the two called alternately in one process so a drift in the machine's speed falls on both.

    python benchmarks/streamed_gemm_ab.py --against /tmp/old/streamed_gemm.c --rows 1,8,32 --dtype float32,bfloat16 \
        [--op add]

Prints GFLOPS of each (best of 5 alternations) and new ÷ old time; a layout or rounding change that
makes the outputs differ is flagged. Run it alone: two torch processes on two cores slow each other.
"""

from __future__ import annotations

import argparse
import ctypes
from collections.abc import Callable
from pathlib import Path

import torch
from packed_gemm import seconds_per_call  # this folder's: run as a script

from specbatch.engine import c_library, streamed_gemm
from specbatch.engine.streamed_gemm import FLAGS, SOURCE, Panels

SHAPES = {"qkv": (960, 576), "out": (576, 576), "gate": (1536, 576), "down": (576, 1536), "lm_head": (49152, 576)}
CYCLED_BYTES = 200e6
OPS = ("none", "add", "mul", "silu")  # the kernel's post-op codes, in order


def library(source: Path) -> ctypes.CDLL:
    built = c_library.build(source, FLAGS)
    assert built is not None, f"{source} did not build"
    for name, argtypes in streamed_gemm._SIGNATURES.items():
        function = getattr(built, name)
        function.argtypes, function.restype = argtypes, None
    return built


def gemm_call(gemm: Callable[..., None], x: torch.Tensor, panels: list[torch.Tensor], out: torch.Tensor,
              op: int, other: torch.Tensor) -> Callable[[int], None]:
    """One call of a build's kernel on copy i of the weight, with post-op `op` (`other` its operand)."""
    rows, (n, k), threads = x.shape[0], out.shape[1:] + x.shape[1:], torch.get_num_threads()
    return lambda i: gemm(x.data_ptr(), panels[i].data_ptr(), 0, other.data_ptr(), out.data_ptr(), rows, n, k, op,
                          threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, required=True, help="the other streamed_gemm.c")
    parser.add_argument("--rows", default="1,4,8,32,64,256")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--op", choices=OPS, default="none", help="the post-op fused into the GEMM")
    args = parser.parse_args()
    old, new = library(args.against), library(SOURCE)
    print(f"{'dtype':9} {'shape':8} {'rows':>4} {'old GFLOPS':>10} {'new GFLOPS':>10} {'new/old time':>12}")
    for dtype in (getattr(torch, name) for name in args.dtype.split(",")):
        suffix = "f32" if dtype == torch.float32 else "bf16"
        for shape in args.shapes.split(","):
            n, k = SHAPES[shape]
            copies = max(1, int(CYCLED_BYTES // (n * k * dtype.itemsize)))
            panels = [Panels(torch.randn(n, k).to(dtype), None).data for _ in range(copies)]
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, k).to(dtype)
                outs = [torch.empty(rows, n, dtype=dtype) for _ in range(2)]
                other = torch.randn(rows, n).to(dtype)
                best = [float("inf")] * 2
                for _ in range(5):
                    for j, built in enumerate((old, new)):
                        gemm = getattr(built, f"streamed_gemm_{suffix}")
                        call = gemm_call(gemm, x, panels, outs[j], OPS.index(args.op), other)
                        best[j] = min(best[j], seconds_per_call(call, copies, seconds=0.15))
                gflops = [2 * rows * n * k / seconds / 1e9 for seconds in best]
                flag = "" if torch.equal(outs[0], outs[1]) else "  outputs differ"
                print(f"{str(dtype).removeprefix('torch.'):9} {shape:8} {rows:4} {gflops[0]:10.1f} {gflops[1]:10.1f} "
                      f"{best[1] / best[0]:12.3f}{flag}", flush=True)


if __name__ == "__main__":
    main()
