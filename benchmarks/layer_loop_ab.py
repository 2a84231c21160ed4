"""The native step's layers in one C call (`engine/layer_loop.py`) against the same kernels driven from
Python, alternated pass by pass in one process, with the outputs checked bit for bit.

Decode-shaped passes (rows x query positions after a context of --context) and, with --prefill, whole
prompts of that length; prints the median ms of each side and their ratio. Run it alone: two torch
processes on two cores slow each other several times over.

    python benchmarks/layer_loop_ab.py --model smollm2-135m --dtype bfloat16,float32 --rows 1,8,32 --query 1,5
    python benchmarks/layer_loop_ab.py --model specbatch/models/demo/target
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM

from specbatch.engine.forward import PagedModel
from specbatch.engine.gguf_models import model_dir
from specbatch.engine.loading import kv_shape
from specbatch.engine.native_llama import NativeLlama
from specbatch.engine.paged_cache import ATTENTION_NAME, PagedKVCache

BLOCK = 16


def side_by_side(model: PagedModel, native: NativeLlama, tables: list[list[int]], starts: list[int],
                 chunks: list[list[int]], repeats: int) -> tuple[float, float]:
    """Median ms of a pass through the C loop and through the Python loop, alternated; the logits equal."""
    loop = native.loop
    times: dict[bool, list[float]] = {True: [], False: []}
    logits: dict[bool, torch.Tensor] = {}
    for index in range(2 * repeats + 2):
        through_c = index % 2 == 0
        native.loop = loop if through_c else None
        started = time.perf_counter()
        output, _ = model.forward(tables, starts, chunks, last_only=True)
        assert output is not None
        logits[through_c] = output
        if index >= 2:  # the first of each side warms up
            times[through_c].append(time.perf_counter() - started)
    native.loop = loop
    assert torch.equal(logits[True], logits[False]), "the C loop changed a pass's logits"
    return statistics.median(times[True]) * 1000, statistics.median(times[False]) * 1000


def pass_arguments(description: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark over decode-shaped passes of one model: which model and dtypes, the
    rows × query positions, the context before them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m", help="a model name the engine resolves, or a directory")
    parser.add_argument("--dtype", default="bfloat16,float32")
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--query", default="1,5")
    parser.add_argument("--context", type=int, default=256)
    return parser


class NativePagedModel(NamedTuple):
    paged: PagedModel
    native: NativeLlama
    vocab_size: int  # the logits' columns past it are the output layer's padding


def native_paged_model(name: str, dtype: torch.dtype, max_rows: int, max_positions: int) -> NativePagedModel:
    """The model (`name`: one the engine resolves, or a directory) on its native step over a paged cache
    with room for `max_rows` rows of `max_positions` positions."""
    path = Path(name) if Path(name).is_dir() else model_dir(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTENTION_NAME).eval()
    shape = kv_shape(model)
    num_blocks = max_rows * -(-max_positions // BLOCK)
    cache = PagedKVCache(shape.num_layers, num_blocks, BLOCK, shape.num_kv_heads, shape.head_dim, dtype, "cpu")
    native = NativeLlama(model)
    return NativePagedModel(PagedModel(model, cache, native=native), native, model.config.vocab_size)


def main() -> None:
    parser = pass_arguments(__doc__.splitlines()[0])
    parser.add_argument("--prefill", action="store_true", help="also whole prompts of --context tokens")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    rows_list = [int(rows) for rows in args.rows.split(",")]
    print(f"{'dtype':9} {'rows':>4} {'query':>6} {'python ms':>10} {'C loop ms':>10} {'ratio':>6}")
    for dtype_name in args.dtype.split(","):
        paged, native, _ = native_paged_model(args.model, getattr(torch, dtype_name), max(rows_list), args.context + 16)
        if native.loop is None:
            print(f"{dtype_name}: the C loop does not serve this model here")
            continue
        for rows in rows_list:
            tables = paged.scratch_tables(rows, args.context + max(int(q) for q in args.query.split(",")))
            prompt = [[11 + position % 50 for position in range(args.context)] for _ in range(rows)]
            paged.forward(tables, [0] * rows, prompt, keep_logits=False)
            shapes = [(str(query), [args.context] * rows, [[17] * int(query)] * rows)
                      for query in args.query.split(",")]
            if args.prefill:
                shapes.append(("prompt", [0] * rows, prompt))
            for label, starts, chunks in shapes:
                c_ms, python_ms = side_by_side(paged, native, tables, starts, chunks, args.repeats)
                print(f"{dtype_name:9} {rows:4} {label:>6} {python_ms:10.2f} {c_ms:10.2f} {c_ms / python_ms:6.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
