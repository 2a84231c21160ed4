"""The GEMM that streams its weight once (`kernels/streamed_gemm.c`): every float32 pass on a CPU, and
bfloat16's decoding rows.

At decoding's row counts a GEMM is a read of its weight, and oneDNN's packed GEMM reached about
half of this machine's memory bandwidth there (the C file has the figures); at a prefill's hundreds
of rows `F.linear` re-blocks the weight on every call, where the kernel keeps each panel in cache
while the rows pass over it. The kernel reads a copy of the weight laid out in panels (`Panels`), so
each panel is one contiguous stream. Where the library cannot be built, or the tensors are not ones
it takes (another dtype or device, not contiguous), nothing is packed and the caller runs oneDNN or
`F.linear`.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from specbatch.engine import c_library

SOURCE = Path(__file__).with_name("kernels") / "streamed_gemm.c"
# the sums are fused multiply-adds in ascending k; the post-ops single operations; 512-bit vectors
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fopenmp", "-fPIC"]
PANEL = 48  # output columns a panel holds (the C file's PANEL)
OPS = {"none": 0, "add": 1, "mul": 2, "silu": 3}
_INT64, _POINTER = ctypes.c_int64, ctypes.c_void_p
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_SIGNATURES = {
    **{f"pack_panels_{suffix}": [_POINTER] * 2 + [_INT64] * 2 + [ctypes.c_int] for suffix in _SUFFIX.values()},
    **{f"streamed_gemm_{suffix}": [_POINTER] * 5 + [_INT64] * 3 + [ctypes.c_int] * 2 for suffix in _SUFFIX.values()},
}


@cache
def load() -> ctypes.CDLL | None:
    library = c_library.load(SOURCE, FLAGS, _SIGNATURES, "SPECBATCH_STREAMED_GEMM")
    if library is not None:
        library.streamed_bf16_supported.restype = ctypes.c_int
    return library


def serves(dtype: torch.dtype) -> bool:
    """Whether the kernel runs `dtype` here: float32 wherever it builds, bfloat16 where the CPU has
    AVX512-BF16's dot-product instruction."""
    library = load()
    if library is None or dtype not in _SUFFIX:
        return False
    return dtype == torch.float32 or bool(library.streamed_bf16_supported())


class Panels:
    """A weight [out, in] laid out once for the kernel (a second copy of it), with its bias."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        assert self.packs(weight)
        self.dtype = weight.dtype
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        count = -(-self.out_features // PANEL)
        # float32: [panels, in, PANEL]; bfloat16: [panels, in / 2, PANEL, 2], the same numel
        self.data = torch.empty(count, self.in_features, PANEL, dtype=weight.dtype)
        self._suffix = _SUFFIX[weight.dtype]
        getattr(load(), f"pack_panels_{self._suffix}")(
            weight.detach().contiguous().data_ptr(), self.data.data_ptr(), self.out_features, self.in_features,
            torch.get_num_threads())

    @staticmethod
    def packs(weight: torch.Tensor) -> bool:
        """Whether `weight` can be laid out for the kernel here (a CPU weight of a dtype it `serves`;
        in bfloat16 an even number of input features, read in pairs)."""
        return (weight.device.type == "cpu" and weight.dim() == 2 and serves(weight.dtype)
                and (weight.dtype == torch.float32 or weight.shape[1] % 2 == 0))

    def takes(self, x: torch.Tensor) -> bool:
        """Whether the kernel takes `x` (or a post-op's other operand) as it is."""
        return x.dtype == self.dtype and x.dim() == 2 and x.device.type == "cpu" and x.is_contiguous()

    def linear(self, x: torch.Tensor, op: str = "none", other: torch.Tensor | None = None) -> torch.Tensor:
        """op(x·Wᵀ + b[, other]) for x [rows, in] and other [rows, out], both as `takes` says."""
        out = x.new_empty(x.shape[0], self.out_features)
        library = load()
        assert library is not None
        getattr(library, f"streamed_gemm_{self._suffix}")(
            x.data_ptr(), self.data.data_ptr(), 0 if self.bias is None else self.bias.data_ptr(),
            0 if other is None else other.data_ptr(), out.data_ptr(), x.shape[0], self.out_features,
            self.in_features, OPS[op], torch.get_num_threads())
        return out
