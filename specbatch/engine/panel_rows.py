"""How many rows the streamed GEMM serves at a dtype on this machine: measured once, cached.

Where the panels (`engine/streamed_gemm.py`) stop beating the GEMM library depends on the CPU, not
on the model. On an Intel Xeon with AMX, float32 `F.linear` matched the panels at 128 rows and
oneDNN's bfloat16 GEMM on AMX passed them from 8; on an AMD EPYC (Zen 4) the float32 panels were
1.05-2.1x `F.linear` at every count from 64 to 1,024 rows, since `F.linear` re-blocks a weight that a
pass never finds in cache (`benchmarks/packed_gemm.py`). So each machine measures it: at 1, 2, 4,
... 512 rows, the panels against the library (`F.linear` in float32, oneDNN's packed GEMM in
bfloat16 where it runs) on weights cycled out of cache, both ways best of three, interleaved; the
bound is the last count before the library first wins by 5% (no bound if it never does up to 512
rows). Each side runs the plain product and the SiLU-fused one (`POST_OPS`), the cheapest and the
dearest of a layer's post-ops: the panels' SiLU is libm's exponential, bit for bit, where oneDNN's is
its own, so at 512-2,048 bfloat16 rows the panels came within 2-8% of oneDNN's plain product but
ran its SiLU-fused one at 0.75-0.83 of its speed (AMD EPYC, Zen 4), and the plain product alone, or
both with a margin of a tenth, set no bound up to 512 rows. 2-4 s per dtype, once: cached per machine,
dtype, threads, torch version and kernel sources in `$SPECBATCH_CACHE_DIR/gemm/` (a changed kernel is
measured again).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import cache, partial
from pathlib import Path

import torch
import torch.nn.functional as F

from specbatch.engine import c_library, onednn
from specbatch.engine.gguf_models import cache_root
from specbatch.engine.host import measured_once
from specbatch.engine.streamed_gemm import Panels

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SHAPE = (1536, 768)  # out, in: a small decoder's projection
MARGIN = 1.05  # the library's lead that ends the panels' range: a near tie is noise, not a loss
CYCLED_BYTES = 64 << 20  # weights cycled per call, past a server's last-level cache
POST_OPS = ("none", "silu")
ROUNDS = 3


@cache
def panel_rows(dtype: torch.dtype, directory: Path | None = None) -> float:
    """The most rows the panels serve at `dtype` here (math.inf: every count; 0: none): read back where
    this machine measured it, else measured and cached."""
    if not Panels.packs(torch.empty(0, 2, dtype=dtype)):
        return 0
    what = "\n".join(["panel rows", str(dtype), str(torch.get_num_threads()), torch.__version__, str(ROWS),
                      str(SHAPE), str(POST_OPS), c_library.sources_digest()])
    return measured_once(directory or cache_root() / "gemm", what, lambda: measure_panel_rows(dtype))[0]


def measure_panel_rows(dtype: torch.dtype) -> float:
    """The last of `ROWS` before the library's GEMM first beats the panels by `MARGIN` over `POST_OPS`
    (math.inf if it never does by the last)."""
    generator = torch.Generator().manual_seed(0)
    copies = max(2, -(-CYCLED_BYTES // (SHAPE[0] * SHAPE[1] * dtype.itemsize)))
    weights = [torch.randn(SHAPE, generator=generator).to(dtype) for _ in range(copies)]
    panels = [Panels(weight, None) for weight in weights]
    packed = [onednn.pack(weight) for weight in weights] if onednn.packs(weights[0]) else None
    bound = 0
    for rows in ROWS:
        x = torch.randn(rows, SHAPE[1], generator=generator).to(dtype)
        streamed = [partial(panel.linear, x, op) for panel in panels for op in POST_OPS]
        library = ([partial(onednn.linear, x, weight, None, op) for weight in packed for op in POST_OPS]
                   if packed is not None
                   else [partial(_unfused, x, weight, op) for weight in weights for op in POST_OPS])
        streamed_s = library_s = math.inf
        for _ in range(ROUNDS):  # interleaved: a drift in the machine's speed falls on both
            streamed_s, library_s = min(streamed_s, _cycle(streamed)), min(library_s, _cycle(library))
        if library_s * MARGIN < streamed_s:
            return bound
        bound = rows
    return math.inf


def _unfused(x: torch.Tensor, weight: torch.Tensor, op: str) -> torch.Tensor:
    """What `PackedLinear` runs past the panels' rows where no library fuses the post-op."""
    product = F.linear(x, weight)
    return F.silu(product) if op == "silu" else product


def _cycle(calls: Sequence[Callable[[], object]]) -> float:
    """Seconds for one call on each copy in turn."""
    started = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - started
