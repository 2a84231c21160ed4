"""The decode-shaped attention kernel (`kernels/paged_attention.c`), built with the machine's C
compiler on first use and loaded with ctypes.

Why a kernel: attention over a paged cache through SDPA has to gather each row's blocks into a
contiguous copy first, per layer and pass; for decode-shaped passes (a few verify positions per
row over a long context) that copy costs more than the attention itself. The kernel reads the
blocks in place, and gives a token the same bits whether its row decodes one position or verifies
several (its C file says how), so speculation changes nothing plain decoding computes. Rows of up
to `FEW_LANES` lanes (query positions x query heads per KV head) are laid across the head's
dimensions, longer ones across lanes, WIDTH lanes a task (`benchmarks/paged_attention_lanes.py`).
Prefill chunks run through it too: each task stops at the last position its lanes see, so a chunk
computes the causal half of its scores where SDPA under the pass's mask computes all of them
(SmolLM2's attention in a prefill pass, float32 / bfloat16: 4 rows x 160 tokens 75 / 84 ms through
SDPA, 63 / 72 here; 1 x 2,048 bfloat16 2,286 against 1,546; 32 rows x 24 after 512 positions, 505 / 387
against 377 / 368; 2 x 128 after 1,024, bfloat16, 177 against 201: one run each). Where no
compiler works, `load()` returns None and attention gathers (`paged_cache.attend`), as exact.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from specbatch.engine import c_library

SOURCE = Path(__file__).with_name("kernels") / "paged_attention.c"
# no fast math: the kernel's batch invariance rests on every sum keeping its order (it vectorises
# across lanes or dimensions without reassociating, and computes its own exponential); 512-bit vectors;
# compile flags only, never linked (`c_library`)
FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fPIC"]
_INT64 = ctypes.c_int64
_ARGS = ([ctypes.c_void_p] * 5 + [_INT64] * 2 + [ctypes.c_void_p] * 3 + [_INT64] * 7
         + [ctypes.c_double, _INT64, ctypes.c_int])
WIDTH = 16  # the kernel's vectors (float32 lanes); head and value sizes must be multiples of it
# by the pools' dtype, the queries' and outputs' too; bfloat16 sums in float32 (keys scored in pairs
# of dimensions by the CPU's bfloat16 dot product where heads are whole vectors of pairs, values
# widened) and its outputs are rounded once, in the kernel (a conversion each way around every
# layer's call cost a bfloat16 decode pass of SmolLM2 at 8 rows ~0.6 ms of ~18)
FUNCTIONS = {torch.float32: "paged_attention_f32", torch.float64: "paged_attention_f64",
             torch.bfloat16: "paged_attention_bf16"}
# lanes a row may bring to be laid across dimensions: past them the work goes across lanes, whose cost
# is flat up to WIDTH (`benchmarks/paged_attention_lanes.py`, SmolLM2's heads, 32 rows after 256
# positions, a layer, bfloat16, ms at 3 / 6 / 15 lanes: across dimensions 0.50 / 0.87 / -, across
# lanes - / - / 0.99; the gather 1.1-1.4)
FEW_LANES = 6


@cache
def load() -> ctypes.CDLL | None:
    """The built kernel library, or None where it cannot be built here (logged once)."""
    return c_library.load(SOURCE, FLAGS, dict.fromkeys(FUNCTIONS.values(), _ARGS), "SPECBATCH_PAGED_KERNEL")


def supports(query: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor) -> bool:
    """Whether the kernel serves these tensors (CPU, one dtype it reads, head and value sizes in whole
    vectors)."""
    return (query.device.type == "cpu" and key_pool.dtype in FUNCTIONS
            and query.dtype == key_pool.dtype == value_pool.dtype
            and query.shape[-1] % WIDTH == 0 and value_pool.shape[-1] % WIDTH == 0 and load() is not None)


def attend(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor, tables: torch.Tensor,
           rows: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """q: [tokens, heads, dim], each row's tokens together, any stride between tokens (a view into a
    fused QKV output is read in place); pools [kv_heads, positions, dim]; tables [rows, blocks]; rows:
    [3, rows] each row's first token, token count and first position. Returns [tokens, heads,
    value_dim] in the pools' dtype."""
    library = load()
    assert library is not None
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()
    out = q.new_empty(q.shape[0], q.shape[1], value_pool.shape[-1])
    getattr(library, FUNCTIONS[key_pool.dtype])(
        q.data_ptr(), key_pool.data_ptr(), value_pool.data_ptr(), out.data_ptr(), tables.data_ptr(),
        tables.shape[1], q.stride(0), rows[0].data_ptr(), rows[1].data_ptr(), rows[2].data_ptr(), rows.shape[1],
        q.shape[1], key_pool.shape[0], q.shape[2], value_pool.shape[-1], key_pool.shape[1], block_size, scale,
        FEW_LANES, torch.get_num_threads())
    return out
