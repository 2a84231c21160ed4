"""Linear layers whose weights are reordered once into oneDNN's blocked layout, for the CPU.

`F.linear` on a CPU hands the weight to the GEMM library in PyTorch's row-major layout, and the
library re-blocks it for its micro-kernel on every call. For the small row counts of decoding that
re-blocking is a large share of the multiply: on this 2-core AVX-512/AMX machine, SmolLM2's
projections at 8 rows ran 51-114 GFLOPS in float32 through `F.linear` and 121-165 packed; at 32
rows 160-215 against 213-265; in bfloat16 (AMX) at 8 rows 145-228 against 255-466, at 32 rows
533-722 against 792-1,240 (`benchmarks/packed_gemm.py`, `benchmarks/results/issue41/`).
Inductor's weight freezing does the same packing; doing it here keeps the step eager, with nothing
to compile or warm up per shape.

The packed copy is a second copy of the weight (the model's own stays, for transformers' code
paths). Elsewhere (a GPU, float64, float16, a build without oneDNN, a CPU without bfloat16
instructions) a layer is plain `F.linear` on the model's weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# multiply-adds (rows x in x out) from which the packed weight is used: oneDNN's call costs ~20 µs where
# `F.linear`'s costs ~7 in float32, and MKL's small-row kernels are quick, so a smaller float32 GEMM
# keeps `F.linear` (µs plain / packed: the bundled target's 256 -> 768 at 8 rows, 1.6M, 16 / 25, at 32
# rows, 6.3M, 48 / 46; SmolLM2's 576 -> 960 at 8 rows, 4.4M, 69 / 46; its whole 8-row pass 55.9 ms with
# 8M as the bound, 47.7 with 4M, `benchmarks/model_step.py`). `F.linear` in bfloat16 costs 26-90 µs at
# any size, so there packed always (`benchmarks/packed_gemm.py`)
MIN_PACKED_MACS = {torch.float32: 1 << 22, torch.bfloat16: 0}


def packs(weight: torch.Tensor) -> bool:
    """Whether this weight is packed for oneDNN here (CPU, float32, or bfloat16 where the CPU has it)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear:
    """y = x·Wᵀ + b with W packed once where `packs` says so (used from `MIN_PACKED_MACS`), else
    `F.linear`; `add`, `mul` and `silu` fuse the elementwise step that follows into the GEMM (oneDNN
    post-ops), saving a pass over the output. In float32 the fused add and multiply round as the
    separate ops do; SiLU differs in the last bit (oneDNN's exponential); in bfloat16 the post-op
    applies before the output is rounded."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight) if packs(self.weight) else None
        self.min_rows = -(-MIN_PACKED_MACS.get(self.weight.dtype, 0) // self.weight.numel())  # ceil

    def uses_packed(self, x: torch.Tensor) -> bool:
        """Whether `x` goes through the packed weight (else `F.linear`)."""
        return self.packed is not None and x.dtype == self.weight.dtype and x.shape[0] >= self.min_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.uses_packed(x):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """other + x·Wᵀ + b (a residual connection)."""
        if not self.uses_packed(x):
            return other + F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, "add")

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x·Wᵀ + b) · other, elementwise (a gated unit's up projection times its gate)."""
        if not self.uses_packed(x):
            return F.linear(x, self.weight, self.bias) * other
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, "mul")

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(x·Wᵀ + b)."""
        if not self.uses_packed(x):
            return F.silu(F.linear(x, self.weight, self.bias))
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "swish", [], "")
