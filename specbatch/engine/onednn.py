"""oneDNN's packed GEMM, which torch ships but does not name publicly: bfloat16 weights reordered once
into oneDNN's blocked layout (run on AMX where the CPU has it), with an elementwise post-op fused."""

from __future__ import annotations

import torch

# the post-ops a fused call names: unary as oneDNN's attribute, binary as its operator
_UNARY = {"none": "none", "silu": "swish"}


def packs(weight: torch.Tensor) -> bool:
    """Whether oneDNN runs this weight packed here (bfloat16 on a CPU with its instructions)."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout (a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, op: str = "none",
           other: torch.Tensor | None = None) -> torch.Tensor:
    """op(x·Wᵀ + b[, other]) for op none, silu (unary) or add, mul (with `other`)."""
    if op in _UNARY:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, _UNARY[op], [], "")
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, bias, op)
