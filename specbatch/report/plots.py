"""PNG plots for `specbatch report`, drawn from query results (no figures computed here).

Uses `matplotlib.figure.Figure` directly (Agg canvas, no pyplot global state). An empty input still
gives a labelled plot that says what is missing, so a report never links a blank image.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from specbatch.storage import open_storage

if TYPE_CHECKING:
    from specbatch.report import QueryResult

    Results = dict[str, QueryResult]

COST_COLUMNS = (
    ("target_passes_per_1k", "target passes"),
    ("target_rows_per_1k", "target rows"),
    ("draft_rows_per_1k", "draft rows"),
    ("padded_target_rows_per_1k", "padded target rows"),
    ("padded_draft_rows_per_1k", "padded draft rows"),
)
LATENCY_METRICS = (
    ("ttft_s", "time to first token"),
    ("gap_per_token_s", "inter-token gap"),
    ("completion_s", "completion time"),
)


def _save(fig: Figure, path: Path) -> Path:
    """Written whole under a temporary name and renamed: a link planted at `path` is replaced, never
    followed out of the job directory."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    open_storage(path.parent).write_bytes(path.name, png.getvalue(), durable=False)
    return path


def _empty(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, fontsize=12)


def _num(values: Sequence[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def _by_job(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        jobs.setdefault(row["job_id"], []).append(row)
    return jobs


def throughput_vs_cost(results: Results, out_dir: Path) -> Path:
    rows = results["throughput_vs_cost"].records()
    fig = Figure(figsize=(11, 4.2))
    speed, cost = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    jobs = [r["job_id"] for r in rows]
    x = np.arange(len(jobs))
    bars = speed.bar(x, np.nan_to_num(_num([r["committed_tokens_per_s"] for r in rows])), color="tab:blue")
    for bar, row in zip(bars, rows, strict=True):
        if row["speedup"] is not None:
            top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
            speed.annotate(f"{float(row['speedup']):.2f}x", top, ha="center", va="bottom")
    speed.set(xticks=x, title="committed tokens/s (speedup vs baseline)", ylabel="tokens/s")
    speed.set_xticklabels(jobs, rotation=20, ha="right")
    width = 0.8 / len(COST_COLUMNS)
    for i, (column, label) in enumerate(COST_COLUMNS):
        offset = (i - len(COST_COLUMNS) / 2 + 0.5) * width
        cost.bar(x + offset, np.nan_to_num(_num([r[column] for r in rows])), width, label=label)
    cost.set(xticks=x, title="cost per 1,000 committed tokens", ylabel="count")
    cost.set_xticklabels(jobs, rotation=20, ha="right")
    cost.legend(fontsize=8)
    if all(r["committed_tokens_per_s"] is None for r in rows):
        _empty(speed, "committed tokens")
        _empty(cost, "committed tokens")
    return _save(fig, out_dir / "throughput_vs_cost.png")


def latency_cdf(results: Results, out_dir: Path) -> Path:
    samples = results["latency_samples"].rows
    fig = Figure(figsize=(12, 3.8))
    for ax, (metric, label) in zip(fig.subplots(1, len(LATENCY_METRICS)), LATENCY_METRICS, strict=True):
        values: dict[str, list[float]] = {}
        for job_id, name, value in samples:
            if name == metric:
                values.setdefault(job_id, []).append(value)
        for job_id, job_values in values.items():
            xs = np.sort(np.array(job_values) * 1000.0)
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=f"{job_id} (n={len(xs)})")
        ax.set(title=label, xlabel="ms", ylabel="fraction of samples", ylim=(0, 1.02))
        if values:
            ax.legend(fontsize=8)
        else:
            _empty(ax, "completed requests")
    return _save(fig, out_dir / "latency_cdf.png")


def acceptance_by_position(results: Results, out_dir: Path) -> Path:
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    jobs = _by_job(results["acceptance_by_position"].records())
    for job_id, rows in jobs.items():
        positions = [r["position"] for r in rows]
        rate, conditional = (_num([r[c] for r in rows]) for c in ("acceptance_rate", "conditional_rate"))
        ax.plot(positions, rate, "o-", label=f"{job_id}: accepted / proposed")
        ax.plot(positions, conditional, "x--", label=f"{job_id}: given j-1 accepted")
    ax.set(title="acceptance by draft position", xlabel="draft position j", ylabel="rate", ylim=(0, 1.05))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if jobs:
        ax.legend(fontsize=8)
    else:
        _empty(ax, "drafts proposed")
    return _save(fig, out_dir / "acceptance_by_position.png")


def round_timeline(results: Results, out_dir: Path) -> Path:
    jobs = _by_job(results["round_timeline"].records())
    fig = Figure(figsize=(11, 7))
    axes = fig.subplots(3, 1, sharex=True)
    panels = (("num_batch_rows", "batch rows"), ("mean_k", "mean k"), ("round_ms", "round ms"))
    for ax, (column, label) in zip(axes, panels, strict=True):
        for job_id, rows in jobs.items():
            xs = [r["round_number"] for r in rows]
            ax.plot(xs, _num([r[column] for r in rows]), ".-", ms=3, lw=0.6, label=job_id)
        ax.set_ylabel(label)
        if not jobs:
            _empty(ax, "rounds")
    axes[0].set_title("per-round timeline")
    axes[-1].set_xlabel("round, in start order over all workers (gaps between runs not shown)")
    if jobs:
        axes[0].legend(fontsize=8)
    return _save(fig, out_dir / "round_timeline.png")


def prefix_cache(results: Results, out_dir: Path) -> Path:
    """Prompt positions per job: copied from a shared prefix, computed, and padding in prefill passes."""
    rows = results["prefix_cache"].records()
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    jobs = [r["job_id"] for r in rows]
    bottom = np.zeros(len(rows))
    for column, label in (("num_reused_tokens", "copied (shared prefix)"), ("num_prefill_tokens", "computed")):
        values = np.nan_to_num(_num([r[column] for r in rows]))
        ax.bar(jobs, values, bottom=bottom, label=label)
        bottom += values
    ax.set(title="prompt positions: copied vs computed", ylabel="positions")
    if rows:
        ax.legend(fontsize=8)
        ax.tick_params(axis="x", labelrotation=20)
    else:
        _empty(ax, "requests")
    return _save(fig, out_dir / "prefix_cache.png")


PLOTS: tuple[Callable[[Results, Path], Path], ...] = (
    throughput_vs_cost,
    latency_cdf,
    acceptance_by_position,
    round_timeline,
    prefix_cache,
)
