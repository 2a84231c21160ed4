"""Where a round's time goes, on whatever device the config names: the cost of one target pass and
one draft step by rows and query positions (host time to return, and time until the device is
done), then each drafter's engine run split into its recorded phases per round.

    python benchmarks/round_phases.py [--set models.device=cuda] [--batch 1,128] [--prompts 64] [--json F]

A pass whose host time is close to its synced time is paid in the host's Python and kernel
launches, not in the device's arithmetic: there, a verify position more is nearly free and a
draft step costs what a target pass's launches cost, per layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specbatch.config import load_config
from specbatch.engine.build import hf_backend
from specbatch.engine.forward import PagedModel
from specbatch.lab.bench import load_models_for, run_engine
from specbatch.lab.prompts import heldout_prompts

CONFIGS = (("none", "fixed:0"), ("ngram", "fixed:4"), ("draft", "fixed:2"), ("eagle", "fixed:2"),
           ("eagle", "adaptive"))


def pass_ms(model: PagedModel, rows: int, query_len: int, context: int, repeats: int = 20) -> tuple[float, float]:
    """Median (host ms, synced ms) of one decode-shaped pass of `rows` rows at KV length `context`."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    tables, starts = model.scratch_tables(rows, context + query_len), [context] * rows
    chunks = [[1] * query_len] * rows
    host, synced = [], []
    for _ in range(repeats + 3):
        sync()
        started = time.perf_counter()
        model.forward(tables, starts, chunks, last_only=query_len == 1)
        returned = time.perf_counter()
        sync()
        host.append((returned - started) * 1000)
        synced.append((time.perf_counter() - started) * 1000)
    return statistics.median(host[3:]), statistics.median(synced[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config key=value")
    parser.add_argument("--batch", default="1,128", help="batch rows, comma-separated")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    report: dict = {"passes": [], "runs": []}
    base = load_config(None, [*args.overrides, f"scheduler.max_batch_rows={max(batches)}", "drafter.kind=draft"])
    models = load_models_for(base, ["draft", *(drafter for drafter, _ in CONFIGS)])
    backend, _ = hf_backend(base, models)
    draft = backend.drafter.draft  # type: ignore[attr-defined]  # a DraftModelDrafter: drafter.kind=draft
    print("pass                      rows  q  host ms  synced ms")
    for name, model, query_lens in (("target", backend.target, (1, 3, 5)), ("draft step", draft, (1,))):
        for rows in batches:
            for query_len in query_lens:
                host, synced = pass_ms(model, rows, query_len, context=160)
                report["passes"].append({"model": name, "rows": rows, "query_len": query_len, "host_ms": host,
                                         "synced_ms": synced})
                print(f"{name:24s} {rows:5d} {query_len:2d} {host:8.2f} {synced:10.2f}")
    del backend
    prompts = heldout_prompts(models.tokenizer, args.prompts, 128)
    phases = ("plan_ms", "prefill_ms", "draft_ms", "verify_ms", "commit_ms")
    print("\nrun                       rows  tok/s  rounds  tok/round  wall/round  " + "  ".join(phases))
    for rows in batches:
        for drafter, lookahead in CONFIGS:
            config = load_config(None, [*args.overrides, f"scheduler.max_batch_rows={rows}",
                                        f"drafter.kind={drafter}", f"scheduler.lookahead={lookahead}"])
            run_engine(config, models, prompts[: max(rows, 4)])  # warm the allocator and kernels
            run = run_engine(config, models, prompts)
            rounds = run.recorder.rounds
            tokens = sum(len(row.output_ids) for row in run.rows)
            means = {phase: sum(getattr(r, phase) for r in rounds) / len(rounds) for phase in phases}
            entry = {"drafter": drafter, "lookahead": lookahead, "rows": rows, "tokens_per_s": tokens / run.wall_s,
                     "rounds": len(rounds), "wall_ms_per_round": run.wall_s * 1000 / len(rounds), **means}
            report["runs"].append(entry)
            print(f"{drafter + ' ' + lookahead:24s} {rows:5d} {entry['tokens_per_s']:6.0f} {len(rounds):7d} "
                  f"{tokens / len(rounds):10.2f} {entry['wall_ms_per_round']:11.2f}  "
                  + "  ".join(f"{means[p]:{len(p)}.2f}" for p in phases))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
