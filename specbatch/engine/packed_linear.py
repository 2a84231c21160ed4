"""Linear layers whose weights are laid out once for the CPU's GEMM.

`F.linear` on a CPU hands the weight to the GEMM library in PyTorch's row-major layout, and the
library re-blocks it for its micro-kernel on every call, reading it from memory again each time (a
pass's weights never stay in cache). So a weight is laid out once:
- in panels for the streamed kernel (`engine/streamed_gemm.py`), float32 and, on CPUs with
  AVX512-BF16, bfloat16, up to the rows where the library's GEMM overtakes it on this machine
  (`engine/panel_rows.py`, measured once). At decoding's few rows a GEMM is a read of its weight,
  and the kernel reads it once at close to the memory's bandwidth; at a prefill's hundreds of rows
  it keeps each panel in cache while the rows pass over it.
- bfloat16, where the CPU has it: also in oneDNN's blocked layout, for the rows past the panels'
  (on AMX at 8 rows 255-466 GFLOPS against `F.linear`'s 145-228; at 32 rows 792-1,240 against
  533-722). float32 past the panels' rows runs `F.linear`.
Inductor's weight freezing does the same packing; doing it here keeps the step eager, with nothing
to compile or warm up per shape.

The laid-out copy is a second copy of the weight (the model's own stays, for transformers' code
paths). Elsewhere (a GPU, float64, float16, a build without a C compiler or oneDNN, a CPU without
bfloat16 instructions) a layer is plain `F.linear` on the model's weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specbatch.engine import onednn
from specbatch.engine.panel_rows import panel_rows
from specbatch.engine.streamed_gemm import Panels


def packs(weight: torch.Tensor) -> bool:
    """Whether this weight is laid out for a CPU GEMM here (in panels, and in bfloat16 for oneDNN too)."""
    return Panels.packs(weight) or onednn.packs(weight)


class PackedLinear:
    """y = x·Wᵀ + b through the laid-out weight where `packs` says so, else `F.linear`; `add`, `mul`
    and `silu` fuse the elementwise step that follows into the GEMM (the streamed kernel's or
    oneDNN's post-ops), saving a pass over the output. In float32 the fused add and multiply round
    as the separate ops do; SiLU may differ in the last bit (another exponential); in bfloat16 the
    post-op applies before the output's one rounding, streamed and oneDNN alike."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.panels = Panels(self.weight, self.bias) if Panels.packs(self.weight) else None
        self.packed = onednn.pack(self.weight) if onednn.packs(self.weight) else None
        if self.panels is not None:
            panel_rows(self.weight.dtype)  # measured at load, where a machine first meets it, not in a timed pass

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether `x` goes through a laid-out weight, with the post-ops fused (else `F.linear`)."""
        return self._streaming(x) is not None or (self.packed is not None and x.dtype == self.weight.dtype)

    def _streaming(self, x: torch.Tensor) -> Panels | None:
        """The panels `x` streams through, if the kernel takes it at its dtype's row count."""
        if self.panels is not None and self.panels.takes(x) and x.shape[0] <= panel_rows(x.dtype):
            return self.panels
        return None

    def _fused(self, x: torch.Tensor, op: str, other: torch.Tensor | None = None) -> torch.Tensor | None:
        """op(x·Wᵀ + b[, other]) through a laid-out weight, or None where `x` takes `F.linear`; the
        route is chosen once per call."""
        if (panels := self._streaming(x)) is not None:
            return panels.linear(x, op, None if other is None else other.contiguous())
        if self.packed is None or x.dtype != self.weight.dtype:
            return None
        return onednn.linear(x, self.packed, self.bias, op, other)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (fused := self._fused(x, "none")) is not None:
            return fused
        return F.linear(x, self.weight, self.bias)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """other + x·Wᵀ + b (a residual connection)."""
        if (fused := self._fused(x, "add", other)) is not None:
            return fused
        return other + F.linear(x, self.weight, self.bias)

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x·Wᵀ + b) · other, elementwise (a gated unit's up projection times its gate)."""
        if (fused := self._fused(x, "mul", other)) is not None:
            return fused
        return F.linear(x, self.weight, self.bias) * other

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(x·Wᵀ + b)."""
        if (fused := self._fused(x, "silu")) is not None:
            return fused
        return F.silu(F.linear(x, self.weight, self.bias))
