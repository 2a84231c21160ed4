"""The native step's decoder layers in one C call (`kernels/layer_loop.c`), where every layer's kernels
run on a CPU.

Driven from Python, a layer's nine kernel calls cost about 100 µs beyond the kernels themselves
(checks, `data_ptr` lookups, allocations, ctypes crossings): a quarter of SmolLM2's bfloat16 decoding
pass at 1 row. The C loop calls the same kernels with the same arguments in the same order, so its
outputs are the Python loop's bit for bit; it serves a pass only where each of them would run (every
GEMM streamed at the pass's row count, attention through the paged kernel, no per-head norms), and
the caller runs the Python loop otherwise. `SPECBATCH_LAYER_LOOP=0` turns it off.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specbatch.engine import c_library, fused_ops, paged_kernel, streamed_gemm
from specbatch.engine.packed_linear import PackedLinear
from specbatch.engine.panel_rows import panel_rows

if TYPE_CHECKING:
    from specbatch.engine.native_llama import _Layer
    from specbatch.engine.paged_cache import PagedKVCache, PassLayout

SOURCE = Path(__file__).with_name("kernels") / "layer_loop.c"
FLAGS = ["-O2", "-fPIC"]  # it only calls the kernels, each built with its own flags
LAYER_POINTERS = 11  # the C file's per-layer pointers: 9 weights (two biases may be null), 2 pools
_INT64, _POINTER = ctypes.c_int64, ctypes.c_void_p
_ARGS = ([_POINTER] * 5 + [_INT64] * 2 + [_POINTER] * 6 + [_INT64, _POINTER] + [_INT64] * 11
         + [ctypes.c_double] * 2 + [ctypes.c_int])
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


@cache
def load() -> ctypes.CDLL | None:
    return c_library.load(SOURCE, FLAGS, {"decoder_layers": _ARGS}, "SPECBATCH_LAYER_LOOP")


def _address(library: ctypes.CDLL | None, name: str) -> int:
    """Where a loaded kernel's function lies, for the C loop to call."""
    assert library is not None
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0


class LayerLoop:
    """The layers' weights as the C loop reads them (their pointers, taken once), and the kernels it calls."""

    def __init__(self, layers: Sequence[_Layer], dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, scale: float) -> None:
        self.dtype = dtype
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.eps, self.scale = eps, scale
        self.hidden_size, self.intermediate = layers[0].qkv.weight.shape[1], layers[0].gate.weight.shape[0]
        suffix = _SUFFIX[dtype]
        norms, gemms, attention = fused_ops.load(), streamed_gemm.load(), paged_kernel.load()
        self.kernels = [_address(norms, f"rms_norm_{suffix}"), _address(gemms, f"streamed_gemm_{suffix}"),
                        _address(norms, f"rotary_write_{suffix}"), _address(attention, paged_kernel.FUNCTIONS[dtype])]
        # the norms' tensors held here, so a parameter whose `.data` were swapped could not free what the C
        # loop reads (the panels are the layers' own copies, held by them)
        self._norms = [norm.detach() for layer in layers for norm in (layer.input_norm, layer.post_norm)]
        self.weights = [[layer.input_norm.data_ptr(), *_panels(layer.qkv), *_panels(layer.out),
                         layer.post_norm.data_ptr(), _panels(layer.gate)[0], _panels(layer.up)[0],
                         _panels(layer.down)[0]] for layer in layers]
        self._table: tuple[tuple[int, ...], torch.Tensor] | None = None  # the last pools' pointers, and the table

    @staticmethod
    def serves(layers: Sequence[_Layer], dtype: torch.dtype, head_dim: int) -> bool:
        """Whether every layer's kernels run here at `dtype`: its libraries built, every GEMM laid out in
        panels, heads the attention kernel and rotary take, no per-head norms (Qwen3's run in torch)."""
        return (dtype in _SUFFIX and head_dim % paged_kernel.WIDTH == 0 and head_dim <= fused_ops.MAX_DIM
                and None not in (load(), fused_ops.load(), paged_kernel.load(), streamed_gemm.load())
                and all(_layer_serves(layer, dtype) for layer in layers))

    def takes(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache) -> bool:
        """Whether this pass runs here: every GEMM streams at its rows, the tensors as the kernels take them."""
        return (hidden.shape[0] <= panel_rows(self.dtype)
                and all(t.dtype == self.dtype and t.is_contiguous() for t in (hidden, cos, sin))
                and all(pool.dtype == self.dtype and pool.is_contiguous() and pool.shape[-1] == self.head_dim
                        for pool in (cache.keys[0], cache.values[0])))

    def run_(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache,
             layout: PassLayout, first: int, end: int) -> None:
        """Layers [first, end) over `hidden` [tokens, hidden], in place; cos, sin [tokens, head_dim]."""
        tokens = hidden.shape[0]
        q_dims, kv_dims = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        table = self._pointers(cache)
        scratch = hidden.new_empty(tokens * (2 * self.hidden_size + q_dims + 2 * kv_dims + q_dims
                                             + 2 * self.intermediate))
        tables, rows = layout.kernel_inputs()
        library = load()
        assert library is not None
        library.decoder_layers(
            *self.kernels, table.data_ptr(), first, end, hidden.data_ptr(), scratch.data_ptr(), cos.data_ptr(),
            sin.data_ptr(), layout.slot_mapping.data_ptr(), tables.data_ptr(), tables.shape[1], rows.data_ptr(),
            rows.shape[1], tokens, self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
            self.intermediate, cache.keys[0].shape[1], layout.block_size, paged_kernel.FEW_LANES,
            hidden.element_size(), self.eps, self.scale, torch.get_num_threads())

    def _pointers(self, cache: PagedKVCache) -> torch.Tensor:
        """Each layer's weight and pool pointers as the C loop reads them, rebuilt only when the pools
        change (a cache of its own per model: the target's and the draft's alternate)."""
        pools = tuple(pool.data_ptr() for pool in (*cache.keys, *cache.values))
        if self._table is None or self._table[0] != pools:
            num_layers = len(self.weights)
            self._table = pools, torch.tensor([[*weights, keys, values] for weights, keys, values
                                               in zip(self.weights, pools[:num_layers], pools[num_layers:],
                                                      strict=True)], dtype=torch.int64)
        return self._table[1]


def _layer_serves(layer: _Layer, dtype: torch.dtype) -> bool:
    """Every GEMM of the layer in panels (biases only on QKV and the output, as the C loop reads them),
    its norms of `dtype`, no per-head norms."""
    linears = (layer.qkv, layer.out, layer.gate, layer.up, layer.down)
    return (layer.q_norm is None and layer.k_norm is None and all(linear.panels is not None for linear in linears)
            and all(linear.bias is None for linear in (layer.gate, layer.up, layer.down))
            and all(norm.dtype == dtype and norm.is_contiguous() for norm in (layer.input_norm, layer.post_norm)))


def _panels(linear: PackedLinear) -> tuple[int, int]:
    """A laid-out linear's panels and bias pointers (0: no bias)."""
    assert linear.panels is not None
    bias = linear.panels.bias
    return linear.panels.data.data_ptr(), 0 if bias is None else bias.data_ptr()
