"""A draft step's first pass, which catches each row's draft cache up on its lag, with the output
layer over every position (as before) against `last_only` (each row's last position), side by side.

The lags are the shapes a job meets: rows current (1 or 2 tokens), a comparison block after 3 plain
rounds (every row 4 behind, some that joined meanwhile whole prompts behind), and the first drafting
round after a long plain interval (every row its whole context behind). Run on a quiet machine:

    .venv/bin/python benchmarks/draft_catch_up.py [--repeats 9] [--json F]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from specbatch.config import load_config
from specbatch.engine.build import hf_backend, load_models
from specbatch.engine.forward import PagedModel


def lag_cases() -> dict[str, list[int]]:
    rng = random.Random(0)
    return {
        "1 row, lag 2": [2],
        "8 rows, lags 1|2": [1, 2] * 4,
        "64 rows, lags 1|2": [1, 2] * 32,
        "64 rows, lag 4": [4] * 64,
        "56 rows lag 4 + 8 joined (48-60)": [4] * 56 + [rng.randint(48, 60) for _ in range(8)],
        "64 rows, whole contexts (48-250)": [rng.randint(48, 250) for _ in range(64)],
    }


def every_position(draft: PagedModel, tables: list[list[int]], starts: list[int], chunks: list[list[int]]) -> None:
    logits, _ = draft.forward(tables, starts, chunks)
    assert logits is not None
    logits[torch.arange(len(chunks)), torch.tensor([len(chunk) - 1 for chunk in chunks])]


def last_only(draft: PagedModel, tables: list[list[int]], starts: list[int], chunks: list[list[int]]) -> None:
    draft.forward(tables, starts, chunks, last_only=True)


WAYS = {"every_position_ms": every_position, "last_only_ms": last_only}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = load_config(None, ["scheduler.max_batch_rows=64"])
    backend, _ = hf_backend(config, load_models(config))
    draft = backend.drafter.draft  # type: ignore[attr-defined]  # through the grammar's `ForcedDrafter`
    assert isinstance(draft, PagedModel)
    results = {}
    for label, lags in lag_cases().items():
        tables, starts = draft.scratch_tables(len(lags), 64 + max(lags)), [64] * len(lags)
        chunks = [[7] * lag for lag in lags]
        times: dict[str, list[float]] = {name: [] for name in WAYS}
        for way in WAYS.values():
            way(draft, tables, starts, chunks)
        for _ in range(args.repeats):  # alternating, so both meet the same machine
            for name, way in WAYS.items():
                started = time.perf_counter()
                way(draft, tables, starts, chunks)
                times[name].append((time.perf_counter() - started) * 1000)
        row = {name: statistics.median(values) for name, values in times.items()}
        row["ratio"] = row["every_position_ms"] / row["last_only_ms"]
        results[label] = {"real_positions": sum(lags), "padded_positions": len(lags) * max(lags), **row}
        print(f"{label:36} positions {sum(lags):5d} (padded {len(lags) * max(lags):5d})  every position "
              f"{row['every_position_ms']:7.2f} ms  last only {row['last_only_ms']:7.2f} ms  {row['ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
