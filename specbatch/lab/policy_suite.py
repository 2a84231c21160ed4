"""The policy benchmark suite (`specbatch bench --suite policies`): lookahead × order policies on
one model pair, over a code + prose mix of held-out prompts arriving all at once, in one process.

Models load once. A short calibration sweep first fits the round-time cost model on this machine
(`CostModel.fit` over its rounds); every suite run then schedules with that model, and its error on
the suite's own rounds (which it never saw) is the reported held-out MAPE. Each run reports
throughput and latency *and* the work behind them, apart (`bench.Work`): target rows per committed
token (prefill chunks and 1 + k per verified row, drafts included) and, counted apart, padded rows.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console

from specbatch.config import JobConfig, LookaheadSpec
from specbatch.core import Row
from specbatch.engine.build import Models, load_models
from specbatch.lab.bench import Work, print_rows, run_engine
from specbatch.lab.prompts import BenchPrompt, heldout_prompts
from specbatch.loop import MemoryRecorder
from specbatch.sched.costmodel import CostModel

log = logging.getLogger(__name__)

DEFAULT_LOOKAHEADS = ("none", "fixed:1", "fixed:2", "fixed:3", "fixed:4", "fixed:5", "adaptive")
DEFAULT_ORDERS = ("fcfs", "sjf", "laps-sd", "specbatch")
CALIBRATION_LOOKAHEADS = ("none", "fixed:1", "fixed:4")
# wall: elapsed time. process: this process's CPU time, which on a shared machine leaves out the time
# other processes take from it; with one torch thread it is the engine's own elapsed compute time.
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def variant(config: JobConfig, lookahead: str, order: str, **scheduler: object) -> JobConfig:
    """`none` is the drafter switched off (plain decoding on the same path)."""
    drafter = config.drafter.model_copy(update={"kind": "none" if lookahead == "none" else "draft"})
    spec = LookaheadSpec.parse("fixed:0" if lookahead == "none" else lookahead)
    updates = {"lookahead": spec, "order": order, **scheduler}
    return config.model_copy(update={"drafter": drafter, "scheduler": config.scheduler.model_copy(update=updates)})


def run_once(config: JobConfig, models: Models, prompts: list[BenchPrompt], name: str,
             clock: str = "wall") -> tuple[dict, MemoryRecorder]:
    """One engine over all prompts at once; returns its metrics and its records. Every time the
    engine records (arrivals, finishes, round_ms) is read from `clock` (see CLOCKS)."""
    rows, recorder, wall_s, *_ = run_engine(config, models, prompts, CLOCKS[clock])
    return summarize(name, config, recorder, rows, wall_s), recorder


def summarize(name: str, config: JobConfig, recorder: MemoryRecorder, rows: list[Row], wall_s: float) -> dict:
    rounds = recorder.rounds
    work = Work.of_rounds(rounds)
    completion = sorted(row.finished_s - row.arrival_s for row in rows if row.finished_s is not None)
    return {
        "name": name,
        "lookahead": "none" if config.drafter.kind == "none" else str(config.scheduler.lookahead),
        "order": config.scheduler.order,
        "tokens_per_s": work.num_committed / wall_s,
        **work.rates(),
        "mean_k": work.num_proposed / max(work.num_decode_rows, 1),
        "mean_completion_s": sum(completion) / max(len(completion), 1),
        "p99_completion_s": _quantile(completion, 0.99),
        "wall_s": wall_s,
        "num_committed": work.num_committed,
        "plan_share": sum(r.plan_ms for r in rounds) / max(sum(r.round_ms for r in rounds), 1e-9),
        "num_preemptions": sum(q.num_preemptions for q in recorder.requests),
        "num_rounds": len(rounds),
    }


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    position = q * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def rounds_table(recorders: list[MemoryRecorder]) -> pa.Table:
    """The `rounds` columns CostModel.fit reads, from in-memory records."""
    names = ("num_target_passes", "num_target_rows", "num_padded_target_rows", "num_draft_passes",
             "num_draft_rows", "num_padded_draft_rows", "num_kv_tokens_read", "num_wide_kv_tokens_read",
             "num_lookup_rows", "num_indexed_tokens", "round_ms")
    rounds = [r for recorder in recorders for r in recorder.rounds]
    return pa.table({name: [getattr(r, name) for r in rounds] for name in names})


def mape(model: CostModel, table: pa.Table) -> float:
    """Mean absolute percentage error of a model's round-time predictions on a rounds table."""
    measured = np.asarray(table.column("round_ms").to_pylist(), dtype=float)
    errors = np.abs(model.predict_rounds(table) - measured) / np.maximum(measured, 1e-9)
    return float(errors.mean()) if len(errors) else 0.0


def cross_validated_mape(recorders: list[MemoryRecorder]) -> float | None:
    """Two folds by run (even / odd runs): fit on one, MAPE on the other, averaged over rounds."""
    folds = [recorders[0::2], recorders[1::2]]
    if not all(fold and sum(len(r.rounds) for r in fold) >= 2 for fold in folds):
        return None
    errors = [(mape(CostModel.fit(rounds_table(train)), rounds_table(test)), sum(len(r.rounds) for r in test))
              for train, test in (folds, folds[::-1])]
    return sum(e * n for e, n in errors) / sum(n for _, n in errors)


def calibrate(config: JobConfig, models: Models, prompts: list[BenchPrompt], max_new_tokens: int = 128,
              clock: str = "wall") -> CostModel:
    """Fit the cost model on runs over the suite's own shapes (batch sizes, k, KV lengths), budgets
    cut to max_new_tokens to keep it short."""
    short = [replace(p, max_new_tokens=min(p.max_new_tokens, max_new_tokens)) for p in prompts]
    recorders = [run_once(variant(config, lookahead, "fcfs"), models, short, f"calibrate {lookahead}", clock)[1]
                 for lookahead in CALIBRATION_LOOKAHEADS]
    return CostModel.fit(rounds_table(recorders), source="bench_policies calibration sweep")


def run_policy_suite(config: JobConfig, prompts: list[BenchPrompt] | None = None, json_path: Path | None = None,
                     *, num_prompts: int = 64, max_new_tokens: int = 256,
                     lookaheads: tuple[str, ...] = DEFAULT_LOOKAHEADS, orders: tuple[str, ...] = DEFAULT_ORDERS,
                     repeats: int = 1, seed: int = 0,
                     clock: str = "wall", models: Models | None = None, console: Console | None = None) -> dict:
    """Run every lookahead × order on one pair (loaded once), all requests at once; returns (and
    writes to json_path) {"results": [...], "cost_model": {...}, "goals": {...}} and prints a table.

    With repeats > 1 the grid runs that many times, every other pass in reverse (a machine whose
    speed drifts then biases no policy by its place in the grid), and each metric is the median.
    clock="process" times everything in this process's CPU time (use with models.num_threads=1): on
    a machine shared with other work, wall time measures the neighbours as much as the policies."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
    models = models or load_models(variant(config, "fixed:1", "fcfs"))
    prompts = prompts or heldout_prompts(models.tokenizer, num_prompts, max_new_tokens, seed=seed)
    run_once(variant(config, "fixed:2", "fcfs"), models, prompts[:4], "warm-up", clock)
    cost = calibrate(config, models, prompts, clock=clock)
    grid = [(lookahead, order) for lookahead in lookaheads for order in orders]
    runs: dict[tuple[str, str], list[dict]] = {cell: [] for cell in grid}
    recorders = []
    with tempfile.TemporaryDirectory() as tmp:
        cost_path = Path(tmp) / "cost_model.json"
        cost.save(cost_path)
        for repeat in range(repeats):
            for lookahead, order in grid if repeat % 2 == 0 else reversed(grid):
                name = f"{lookahead}/{order}"
                log.info("policy suite (pass %d/%d): %s", repeat + 1, repeats, name)
                summary, recorder = run_once(variant(config, lookahead, order, cost_model=str(cost_path)), models,
                                             prompts, name, clock)
                runs[(lookahead, order)].append(summary)
                recorders.append(recorder)
    results = [median_summary(runs[cell]) for cell in grid]
    suite_rounds = rounds_table(recorders)
    refit = CostModel.fit(suite_rounds, source="policy suite rounds (in-sample)")
    report = {
        "results": results,
        "cost_model": {"calibrated": {**cost.__dict__}, "mape_calibration": cost.mape,
                       "mape_heldout": mape(cost, suite_rounds), "mape_refit_in_sample": refit.mape,
                       "mape_cross_validated": cross_validated_mape(recorders), "refit": {**refit.__dict__}},
        "goals": goals(results),
        "setup": {"num_prompts": len(prompts), "max_new_tokens": max(p.max_new_tokens for p in prompts),
                  "max_batch_rows": config.scheduler.max_batch_rows,
                  "lookaheads": list(lookaheads), "orders": list(orders), "repeats": repeats, "seed": seed,
                  "clock": clock, "num_threads": config.models.num_threads},
    }
    if json_path is not None:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    print_table(report, console or Console(width=150))
    return report


def median_summary(summaries: list[dict]) -> dict:
    """Per metric, the median over the repeats that have it (names and labels from the first)."""
    merged = dict(summaries[0])
    for key in merged:
        values = [s[key] for s in summaries if isinstance(s[key], (int, float)) and not isinstance(s[key], bool)]
        if values:
            merged[key] = statistics.median(values)
    merged["num_repeats"] = len(summaries)
    return merged


def goals(results: list[dict]) -> dict:
    """The issue's goals: adaptive vs the best fixed k (tokens/s) per order; specbatch vs fcfs
    (mean and p99 completion) per lookahead."""
    by = {(r["lookahead"], r["order"]): r for r in results}
    out: dict[str, dict] = {"adaptive_over_best_fixed": {}, "specbatch_over_fcfs": {}}
    for order in {o for _, o in by}:
        fixed = [r["tokens_per_s"] for (la, o), r in by.items() if o == order and la.startswith("fixed:")]
        if fixed and ("adaptive", order) in by:
            out["adaptive_over_best_fixed"][order] = by[("adaptive", order)]["tokens_per_s"] / max(fixed)
    for lookahead in {la for la, _ in by}:
        if (lookahead, "specbatch") in by and (lookahead, "fcfs") in by:
            ours, base = by[(lookahead, "specbatch")], by[(lookahead, "fcfs")]
            out["specbatch_over_fcfs"][lookahead] = {
                "mean": ours["mean_completion_s"] / base["mean_completion_s"],
                "p99": ours["p99_completion_s"] / base["p99_completion_s"]}
    return out


COLUMNS = {"name": ("name", ""), "tokens_per_s": ("tokens/s", ".1f"),
           "target_rows_per_token": ("target rows/token", ".2f"), "padded_share": ("padded", ".1%"),
           "mean_k": ("mean k", ".2f"), "acceptance": ("accept", ".2f"), "mean_completion_s": ("mean s", ".2f"),
           "p99_completion_s": ("p99 s", ".2f"), "num_preemptions": ("preempt", ""), "plan_share": ("plan %", ".1%")}


def print_table(report: dict, console: Console) -> None:
    title = f"policy suite (all requests at once; {report['setup']['clock']} clock)"
    print_rows(console, title, report["results"], COLUMNS)
    cost = report["cost_model"]
    cv = cost["mape_cross_validated"]
    console.print(f"cost model MAPE: calibration {cost['mape_calibration']:.1%}, calibrated model on the suite "
                  f"{cost['mape_heldout']:.1%}, refit in-sample {cost['mape_refit_in_sample']:.1%}, "
                  f"2-fold by run {'n/a' if cv is None else f'{cv:.1%}'}")
    console.print(f"goals: {json.dumps(report['goals'], indent=1)}")
