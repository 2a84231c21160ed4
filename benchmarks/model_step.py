"""One model step, side by side: transformers' modeling code and the native Llama step
(`engine/native_llama.py`) over the same paged cache, at a dtype, for decode-shaped passes
(rows x verify positions after a context), and the machine's GEMM peak at that dtype
(`specbatch/engine/gemm_peak.py`, cached per machine).

    python benchmarks/model_step.py --model smollm2-135m --dtype float32,bfloat16 --rows 1,8,32 --query 1,5

Prints per pass: milliseconds (median of --repeats), tokens/s, and model FLOP utilisation
(tokens/s x 2 x parameters / the measured GEMM peak), and native / transformers. Run it alone: two
torch processes on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specbatch.engine.forward import PagedModel
from specbatch.engine.gemm_peak import gemm_peak, mfu
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.loading import kv_shape
from specbatch.engine.native_llama import NativeLlama
from specbatch.engine.paged_cache import ATTENTION_NAME, PagedKVCache

BLOCK = 16


def time_pass(model: PagedModel, rows: int, query_len: int, context: int, repeats: int) -> float:
    tables = model.scratch_tables(rows, context + query_len)
    chunks = [[17] * query_len for _ in range(rows)]
    model.forward(tables, [0] * rows, [[11] * context for _ in range(rows)], keep_logits=False)  # the context
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        model.forward(tables, [context] * rows, chunks)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--query", default="1,5")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    path = model_dir(args.model)
    print(f"{'dtype':9} {'rows':>4} {'query':>5} {'hf ms':>8} {'native ms':>9} {'native/hf':>9} "
          f"{'tok/s':>8} {'MFU':>6}")
    for dtype_name in args.dtype.split(","):
        dtype = getattr(torch, dtype_name)
        peak = gemm_peak(dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTENTION_NAME).eval()
        params = sum(p.numel() for p in model.parameters())
        shape = kv_shape(model)
        rows_max = max(int(r) for r in args.rows.split(","))
        num_blocks = rows_max * -(-(args.context + 16) // BLOCK)
        cache = PagedKVCache(shape.num_layers, num_blocks, BLOCK, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
        hf, native = PagedModel(model, cache), PagedModel(model, cache, native=NativeLlama(model))
        for rows in map(int, args.rows.split(",")):
            for query_len in map(int, args.query.split(",")):
                hf_ms = time_pass(hf, rows, query_len, args.context, args.repeats)
                native_ms = time_pass(native, rows, query_len, args.context, args.repeats)
                tokens_per_s = rows * query_len / native_ms * 1000
                utilisation = mfu(tokens_per_s, params, peak.gflops)
                print(f"{dtype_name:9} {rows:4} {query_len:5} {hf_ms:8.1f} {native_ms:9.1f} {native_ms / hf_ms:9.2f} "
                      f"{tokens_per_s:8.0f} {utilisation:6.1%}")
        print(f"{dtype_name}: {peak.describe()}, {params / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
