"""Captured graphs for decode-shaped passes: the target's verify pass and the draft steps.

At the sizes speculative decoding drafts with, a pass costs its per-operator overhead, not its
arithmetic (the bundled target: 12 MFLOP in 5.2 ms eager at batch 1). `compile` runs those passes
through `torch.compile` (Inductor's fused kernels on a CPU); `cuda-graphs` adds CUDA graph replay
(`reduce-overhead`). Graphs are compiled with dynamic shapes, so the batch, query and KV lengths of
a pass are symbols, not a graph each. Passes are flat (`engine/forward.py`): the token count is
the symbol, and no row or token is padded; a warm-up runs one pass per bucket shape on scratch block
tables before the first round (`engine/build._warm_up`). CUDA graphs replay fixed shapes: there the
bucket set bounds how many are recorded. Greedy outputs are
checked against the target's own eager decoding (tests/test_graphs.py); fused kernels round
differently, as another batch shape does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from specbatch.sched.buckets import ShapeBucket, ShapeBuckets

GraphMode = Literal["eager", "compile", "cuda-graphs"]


def decode_step(model: torch.nn.Module, mode: GraphMode) -> Callable[..., Any]:
    """What runs the model's decode-shaped passes: the model itself, or its compiled form.

    Compiled once per loaded model (a worker's engines share it, and so its graphs)."""
    if mode == "eager":
        return model
    _configure_compiler()
    return torch.compile(model, dynamic=True, mode="reduce-overhead" if mode == "cuda-graphs" else None)


def _configure_compiler() -> None:
    """Process-wide compiler settings graph modes need. Without them a pass of 2 rows × 2 positions
    would tie the two sizes together (duck sizing) and compile again at 2 × 5; and the target and
    draft share one forward's code, whose graphs (2 per model, more with CUDA graphs' shapes) must
    not hit Dynamo's default limit of 8, past which it silently runs eagerly."""
    torch.fx.experimental._config.use_duck_shape = False
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def warm_shapes(buckets: ShapeBuckets, max_rows: int, max_query_len: int) -> list[tuple[int, int]]:
    """(rows, query length) of the passes to capture before the first round: the smallest and largest
    decode-shaped pass the job can run and every bucket between, one pass per padded shape."""
    rows = {1, max_rows, *(r for r in buckets.batch_rows if r <= max_rows)}
    query_lens = {1, max_query_len, *(q for q in buckets.query_len if q <= max_query_len)}
    fitted: dict[ShapeBucket, tuple[int, int]] = {}
    for shape in sorted((r, q) for r in rows for q in query_lens):
        fitted.setdefault(buckets.fit(*shape), shape)
    return sorted(fitted.values())


def use_compile_cache(directory: Path) -> None:
    """Keep Inductor's compiled kernels under `directory` (the job's), so a resumed job or another
    worker of the job loads them instead of compiling again."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory.resolve())
