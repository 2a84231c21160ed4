"""Linear layers whose weights are laid out once for the CPU's GEMM.

`F.linear` on a CPU hands the weight to the GEMM library in PyTorch's row-major layout, and the
library re-blocks it for its micro-kernel on every call, reading it from memory again each time (a
pass's weights never stay in cache). So a weight is laid out once:
- float32: in panels for the streamed kernel (`engine/streamed_gemm.py`), at every row count. At
  decoding's few rows a GEMM is a read of its weight, and the kernel reads it once at close to the
  memory's bandwidth; at prefill's hundreds of rows each panel stays in cache while every row block
  passes over it, and the kernel computes near the machine's float32 peak, where `F.linear` lost a
  fifth to its re-blocking (`benchmarks/packed_gemm.py`).
- bfloat16, where the CPU has it: in panels up to `PANEL_ROWS` rows, and in oneDNN's blocked layout,
  run on AMX, past them (at 8 rows 255-466 GFLOPS against `F.linear`'s 145-228; at 32 rows
  792-1,240 against 533-722).
Inductor's weight freezing does the same packing; doing it here keeps the step eager, with nothing
to compile or warm up per shape.

The laid-out copy is a second copy of the weight (the model's own stays, for transformers' code
paths). Elsewhere (a GPU, float64, float16, a build without a C compiler or oneDNN, a CPU without
bfloat16 instructions) a layer is plain `F.linear` on the model's weight.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specbatch.engine.streamed_gemm import Panels

# the most rows the streamed kernel serves, by dtype. float32: every count. SmolLM2's projections,
# weights streamed from memory, GFLOPS streamed / `F.linear` at 64, 128, 256, 512 and 1,024 rows:
# 162-201 / 78-114, 166-202 / 108-149, 184-200 / 119-166, 179-201 / 138-160, 179-200 / 141-172
# (the output layer 103-176 / 56-131); a whole 160-token prefill pass 204 against 238-312 ms.
# bfloat16: AMX's GEMM computes faster than the dot products stream from about 8 rows (streamed ÷
# oneDNN at 1 / 4 / 8 / 16 rows: 1.30-1.85 / 1.06-1.47 / 0.85-1.27 / 0.45-0.69; the output layer
# 0.98 / 0.82 / 0.62 / 0.37); SmolLM2's whole bfloat16 pass, ms with 4 / 8 / 16 as the bound: 1 row x
# 5 positions 38.7-40.9 / 36.9-37.6 / 37.9-40.0, 2 x 5 41.3-42.2 / 41.7-43.1 / 49.7-51.1, 8 x 1
# 45.9-46.0 / 45.2-45.7 / 45.1-48.7 (`benchmarks/model_step.py`)
PANEL_ROWS = {torch.float32: math.inf, torch.bfloat16: 8}


def packs(weight: torch.Tensor) -> bool:
    """Whether this weight is laid out for a CPU GEMM here (in panels, and in bfloat16 for oneDNN too)."""
    return Panels.packs(weight) or onednn_packs(weight)


def onednn_packs(weight: torch.Tensor) -> bool:
    """Whether oneDNN runs this weight packed here (bfloat16 on a CPU with its instructions)."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear:
    """y = x·Wᵀ + b through the laid-out weight where `packs` says so, else `F.linear`; `add`, `mul`
    and `silu` fuse the elementwise step that follows into the GEMM (the streamed kernel's or
    oneDNN's post-ops), saving a pass over the output. In float32 the fused add and multiply round
    as the separate ops do; SiLU may differ in the last bit (another exponential); in bfloat16 the
    post-op applies before the output's one rounding, streamed and oneDNN alike."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.panels = Panels(self.weight, self.bias) if Panels.packs(self.weight) else None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight) if onednn_packs(self.weight) else None

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether `x` goes through a laid-out weight, with the post-ops fused (else `F.linear`)."""
        return self._streaming(x) is not None or (self.packed is not None and x.dtype == self.weight.dtype)

    def _streaming(self, x: torch.Tensor) -> Panels | None:
        """The panels `x` streams through, if the kernel takes it at its dtype's row count."""
        if self.panels is not None and x.shape[0] <= PANEL_ROWS.get(x.dtype, 0) and self.panels.takes(x):
            return self.panels
        return None

    def _fused(self, x: torch.Tensor, op: str, other: torch.Tensor | None = None) -> torch.Tensor | None:
        """op(x·Wᵀ + b[, other]) through a laid-out weight, or None where `x` takes `F.linear`; the
        route is chosen once per call."""
        if (panels := self._streaming(x)) is not None:
            return panels.linear(x, op, None if other is None else other.contiguous())
        if self.packed is None or x.dtype != self.weight.dtype:
            return None
        if op in ("none", "silu"):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "swish" if op == "silu" else "none",
                                                      [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, op)

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
