"""Copying a prefix's KV from one slot to another against computing it: the choice behind prefix
reuse (`sched/prefix_cache.py`, docs/DESIGN.md §8).

For each prefix length, in one process, alternating: a prefill pass of that many tokens into a
slot (what a row without reuse computes), and `SlotCache.copy_slot` of the same positions from
that slot into another (what a hit costs). Prints ms each and the ratio.

    .venv/bin/python benchmarks/prefix_copy.py [--lengths 64,256,576] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbatch.config import load_config
from specbatch.engine.build import Models, hf_backend, load_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="64,256,576")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], help="config overrides (models.target=...)")
    args = parser.parse_args()
    config = load_config(None, ["scheduler.max_batch_rows=2", "drafter.kind=none", *args.set])
    models: Models = load_models(config)
    backend, _ = hf_backend(config, models)
    target = backend.target
    print(f"target {config.models.target}: {sum(p.numel() for p in models.target.parameters()) / 1e6:.1f}M "
          f"parameters, {target.cache.bytes_per_token} KV bytes a position, {torch.get_num_threads()} threads")
    print(f"{'tokens':>7} {'prefill ms':>11} {'copy ms':>8} {'prefill / copy':>15}")
    for length in map(int, args.lengths.split(",")):
        tokens = [list(range(3, 3 + length))]
        prefill, copy = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            target.forward([0], [0], tokens, keep_logits=False)
            prefill.append(time.perf_counter() - started)
            started = time.perf_counter()
            target.cache.copy_slot(0, 1, length)
            copy.append(time.perf_counter() - started)
        prefill_ms, copy_ms = statistics.median(prefill) * 1000, statistics.median(copy) * 1000
        print(f"{length:>7} {prefill_ms:>11.2f} {copy_ms:>8.3f} {prefill_ms / copy_ms:>15.0f}")


if __name__ == "__main__":
    main()
