"""RMSNorm and rotary embedding in one pass each (`kernels/norm_rotary.c`), for the native step on a CPU.

torch runs a bfloat16 RMSNorm as eight operators (a conversion, squares, a mean, a root, two products,
a conversion back, the weight) and rotary as six, each a pass over the activations and a dispatch:
SmolLM2 in bfloat16 spent 11% of a 2,048-token prefill pass in RMSNorm alone (`torch.profiler`).
These round exactly as the Hugging Face code does in bfloat16, and rotary in float32; RMSNorm's sum
of squares in float32 is added in another order, as another reduction would (tests/test_fused_ops.py).
Where the library cannot be built, or a tensor is not one it takes (another dtype or device, not
contiguous), the callers run torch.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from specbatch.engine import c_library

SOURCE = Path(__file__).with_name("kernels") / "norm_rotary.c"
# products and sums not fused into FMAs (torch rounds each); the sum of squares may be reassociated
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-math-errno",
         "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-fopenmp", "-fPIC"]
MAX_DIM = 1024  # rotary's per-head buffer
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_INT64, _POINTER = ctypes.c_int64, ctypes.c_void_p


_NORM_ARGS = [_POINTER] * 3 + [_INT64] * 2 + [ctypes.c_double, ctypes.c_int]
_ROTARY_ARGS = [_POINTER, _INT64] + [_POINTER] * 2 + [_INT64] * 3 + [ctypes.c_int]
_ROTARY_WRITE_ARGS = ([_POINTER, _INT64, _POINTER, _INT64] + [_POINTER] * 2 + [_INT64] * 5 + [_POINTER] * 3
                      + [_INT64, ctypes.c_int])


@cache
def load() -> ctypes.CDLL | None:
    signatures = {f"{op}_{suffix}": args for suffix in _SUFFIX.values()
                  for op, args in (("rms_norm", _NORM_ARGS), ("rotary", _ROTARY_ARGS),
                                   ("rotary_write", _ROTARY_WRITE_ARGS))}
    return c_library.load(SOURCE, FLAGS, signatures, "SPECBATCH_FUSED_OPS")


def _serves(*tensors: torch.Tensor) -> bool:
    dtype = tensors[0].dtype
    return (dtype in _SUFFIX and all(t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()
                                     for t in tensors) and load() is not None)


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """Hugging Face's Llama RMSNorm of `hidden` [..., dim], or None where torch must run it."""
    if not _serves(hidden, weight):
        return None
    out = torch.empty_like(hidden)
    dim = hidden.shape[-1]
    getattr(load(), f"rms_norm_{_SUFFIX[hidden.dtype]}")(
        hidden.data_ptr(), weight.data_ptr(), out.data_ptr(), hidden.numel() // dim, dim, eps,
        torch.get_num_threads())
    return out


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotary embedding applied to x [tokens, heads, dim] in place with cos, sin [tokens, dim], as
    `apply_rotary_pos_emb`; x's heads contiguous within a token, tokens any stride apart (a view into
    a fused QKV output). False (x untouched) where torch must run it."""
    tokens, heads, dim = x.shape
    if not (x.stride(2) == 1 and x.stride(1) == dim and dim <= MAX_DIM and x.device.type == "cpu"
            and x.dtype == cos.dtype and _serves(cos, sin)):
        return False
    getattr(load(), f"rotary_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), tokens, heads, dim, torch.get_num_threads())
    return True


def rotate_and_write_(qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                      slots: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor) -> bool:
    """Rotary on qk [tokens, num_heads + kv_heads, dim]: the queries in place, the keys straight into
    `key_pool` [kv_heads, positions, dim] at `slots` [tokens], with v [tokens, kv_heads, value_dim]
    copied into `value_pool` there: a layer's rotary and cache write (`PagedKVCache.write`) in one
    pass instead of three operators. Each as `rotate_` lays them out; the pools contiguous, of qk's
    dtype. False (nothing done) where torch must run it."""
    tokens, heads, dim = qk.shape
    value_dim = v.shape[-1]
    if not (qk.stride(2) == 1 and qk.stride(1) == dim and v.stride(2) == 1 and v.stride(1) == value_dim
            and dim <= MAX_DIM and qk.device.type == "cpu" and v.dtype == qk.dtype == cos.dtype
            and slots.dtype == torch.int64 and slots.is_contiguous() and _serves(cos, sin, key_pool, value_pool)):
        return False
    getattr(load(), f"rotary_write_{_SUFFIX[qk.dtype]}")(
        qk.data_ptr(), qk.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(), sin.data_ptr(), tokens, num_heads,
        heads - num_heads, dim, value_dim, slots.data_ptr(), key_pool.data_ptr(), value_pool.data_ptr(),
        key_pool.shape[1], torch.get_num_threads())
    return True
