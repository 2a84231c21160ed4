"""Greedy tokens from a verify pass's logits: the C argmax (`engine/argmax.py`) against torch's
`max(dim=-1).indices`, alternated in one process on the logits of real passes (rows x query positions
after a context of --context), the tokens checked equal; beside them the pass that made the logits,
so each side's share of a round shows. Run it alone: two torch processes on two cores slow each other
several times over.

    python benchmarks/greedy_tokens_ab.py --model smollm2-135m --dtype bfloat16,float32 --rows 1,8,32 --query 1,5
    python benchmarks/greedy_tokens_ab.py --model specbatch/models/demo/target
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from layer_loop_ab import native_paged_model, pass_arguments  # this folder's: run as a script

from specbatch.engine.argmax import greedy_tokens
from specbatch.engine.forward import PagedModel


def median_ms(repeats: int, run: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(*args)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def torch_tokens(logits: torch.Tensor) -> list[int]:
    return logits.max(dim=-1).indices.tolist()


def verify_logits(paged: PagedModel, tables: list[list[int]], starts: list[int], chunks: list[list[int]],
                  vocab: int) -> torch.Tensor:
    """One verify pass's logits over the vocabulary (the model's output layer may be padded past it)."""
    logits, _ = paged.forward(tables, starts, chunks)
    assert logits is not None
    return logits[:, :vocab]


def main() -> None:
    parser = pass_arguments(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    rows_list, queries = [int(rows) for rows in args.rows.split(",")], [int(q) for q in args.query.split(",")]
    print(f"{'dtype':9} {'rows':>4} {'query':>6} {'pass ms':>8} {'torch ms':>9} {'kernel ms':>10} {'ratio':>6} "
          f"{'torch share':>11}")
    for dtype_name in args.dtype.split(","):
        paged, _, vocab = native_paged_model(args.model, getattr(torch, dtype_name), max(rows_list),
                                             args.context + max(queries))
        for rows in rows_list:
            tables = paged.scratch_tables(rows, args.context + max(queries))
            prompt = [[11 + (7 * position + row) % 500 for position in range(args.context)] for row in range(rows)]
            paged.forward(tables, [0] * rows, prompt, keep_logits=False)
            for query in queries:
                chunks = [[17 + row] * query for row in range(rows)]
                starts = [args.context] * rows
                logits = verify_logits(paged, tables, starts, chunks, vocab)
                assert greedy_tokens(logits) == torch_tokens(logits), "the kernel chose another token"
                pass_ms = median_ms(args.repeats, verify_logits, paged, tables, starts, chunks, vocab)
                torch_ms, kernel_ms = [], []
                for _ in range(args.repeats):  # alternated: the same machine state for both
                    torch_ms.append(median_ms(1, torch_tokens, logits))
                    kernel_ms.append(median_ms(1, greedy_tokens, logits))
                t, k = statistics.median(torch_ms), statistics.median(kernel_ms)
                print(f"{dtype_name:9} {rows:4} {query:6} {pass_ms:8.2f} {t:9.3f} {k:10.3f} {k / t:6.3f} "
                      f"{t / (pass_ms + t):11.1%}", flush=True)


if __name__ == "__main__":
    main()
