"""Whole native passes with the weights' panels and the KV pools on 4 KB pages against the same on
transparent huge pages, in one process, alternated (specbatch turns huge pages on for torch's
allocations: `specbatch/__init__.py`). Run it with them off, so the first copy keeps 4 KB pages:

    THP_MEM_ALLOC_ENABLE=0 python benchmarks/huge_pages_ab.py --dtype bfloat16 --rows 1,8,32

Rows' blocks are shuffled across the pool, as after rows free and take them. Prints each median pass
time and huge ÷ 4 KB. Run it alone: two torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from specbatch.engine.forward import PagedModel
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.loading import kv_shape
from specbatch.engine.native_llama import NativeLlama
from specbatch.engine.paged_cache import ATTENTION_NAME, PagedKVCache

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
BLOCK = 16


def on_huge_pages(tensor: torch.Tensor, keep: list[torch.Tensor]) -> torch.Tensor:
    """A copy of `tensor` in memory madvised for huge pages before its first touch (`keep` holds the buffer)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = tensor.numel() * tensor.element_size()
    buffer = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
    offset = (-buffer.data_ptr()) % HUGE_PAGE
    assert libc.madvise(buffer.data_ptr() + offset, size, MADV_HUGEPAGE) == 0, "madvise failed"
    keep.append(buffer)
    return buffer[offset : offset + size].view(tensor.dtype).view(tensor.shape).copy_(tensor)


def build(model: PreTrainedModel, num_blocks: int, huge: bool, keep: list[torch.Tensor]) -> PagedModel:
    shape = kv_shape(model)
    dtype = next(model.parameters()).dtype
    cache = PagedKVCache(shape.num_layers, num_blocks, BLOCK, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
    native = NativeLlama(model)
    if huge:
        cache.keys = [on_huge_pages(pool, keep) for pool in cache.keys]
        cache.values = [on_huge_pages(pool, keep) for pool in cache.values]
        for layer in native.layers:
            for linear in (layer.qkv, layer.out, layer.gate, layer.up, layer.down):
                if linear.panels is not None:
                    linear.panels.data = on_huge_pages(linear.panels.data, keep)
        if native.lm_head.panels is not None:
            native.lm_head.panels.data = on_huge_pages(native.lm_head.panels.data, keep)
    return PagedModel(model, cache, native=native)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=22)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir(args.model), dtype=dtype,
                                                 attn_implementation=ATTENTION_NAME).eval()
    rows_list = [int(rows) for rows in args.rows.split(",")]
    per_row = -(-(args.context + BLOCK) // BLOCK)
    num_blocks = max(rows_list) * per_row
    keep: list[torch.Tensor] = []
    small, huge = build(model, num_blocks, False, keep), build(model, num_blocks, True, keep)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    for rows in rows_list:
        tables = [order[row * per_row : (row + 1) * per_row] for row in range(rows)]
        times: dict[str, list[float]] = {"4 KB": [], "huge": []}
        for step in (small, huge):
            step.forward(tables, [0] * rows, [[11] * args.context for _ in range(rows)], keep_logits=False)
        for _ in range(args.repeats + 3):
            for name, step in (("4 KB", small), ("huge", huge)):
                started = time.perf_counter()
                step.forward(tables, [args.context] * rows, [[17]] * rows)
                times[name].append(time.perf_counter() - started)
        ms = {name: statistics.median(values[3:]) * 1000 for name, values in times.items()}
        print(f"{args.dtype} {rows:3d} rows: 4 KB pages {ms['4 KB']:7.2f} ms, huge {ms['huge']:7.2f} ms, "
              f"huge / 4 KB {ms['huge'] / ms['4 KB']:.3f}")


if __name__ == "__main__":
    main()
