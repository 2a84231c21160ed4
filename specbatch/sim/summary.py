"""What a simulated job came to: counts of every outcome, wall time, throughput and latency.

Collected while the simulation runs (one pass, no re-read of the Parquet tables), with the same
definitions as `sql/views.sql`: queue_s = admitted − arrival, ttft_s = first token − arrival,
completion_s = finished − arrival, over completed requests; wall_s = the union of the workers'
[first round start, last round end] spans. Warmup requests count everywhere except the latency
figures; quantiles interpolate linearly, as DuckDB's quantile_cont.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbatch.core import Row, Status

LATENCY_METRICS = ("queue_s", "ttft_s", "completion_s")


@dataclass(frozen=True)
class LatencyStats:
    count: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None

    @classmethod
    def of(cls, values: Seq[float]) -> LatencyStats:
        if not len(values):
            return cls(0, None, None, None, None, None)
        x = np.frombuffer(values, dtype=float) if isinstance(values, array) else np.asarray(values, dtype=float)
        p50, p90, p99 = (float(q) for q in np.quantile(x, [0.5, 0.9, 0.99]))
        return cls(len(x), float(x.mean()), p50, p90, p99, float(x.max()))


@dataclass
class SimSummary:
    job_dir: str
    num_requests: int
    num_completed: int
    num_dropped: int
    num_cancelled: int
    num_warmup: int  # of all statuses; left out of `latency` only
    reasons: dict[str, int]  # drop_reason of dropped and cancelled requests
    num_rounds: int
    num_committed_tokens: int  # output tokens of every request (completed or cancelled)
    wall_s: float
    committed_tokens_per_s: float | None
    latency: dict[str, LatencyStats]  # completed, non-warmup requests
    host_s: float  # real seconds the simulation took
    peak_rss_mb: float  # the process's peak resident memory so far

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def num_accounted(self) -> int:
        return self.num_completed + self.num_dropped + self.num_cancelled


@dataclass
class SummaryCollector:
    num_requests: int
    num_warmup: int
    statuses: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    num_committed_tokens: int = 0
    num_accounted: int = 0  # completed + dropped + cancelled so far
    samples: dict[str, array] = field(default_factory=lambda: {m: array("d") for m in LATENCY_METRICS})

    def add(self, row: Row, is_warmup: bool) -> None:
        self.statuses[row.status] += 1
        self.num_accounted += 1
        self.num_committed_tokens += row.num_output_tokens
        if row.status is not Status.COMPLETED:
            self.reasons[row.drop_reason or "unspecified"] += 1
            return
        if is_warmup:
            return
        if row.admitted_s is not None:
            self.samples["queue_s"].append(row.admitted_s - row.arrival_s)
        if row.first_token_s is not None:
            self.samples["ttft_s"].append(row.first_token_s - row.arrival_s)
        assert row.finished_s is not None  # every accounted row has finished
        self.samples["completion_s"].append(row.finished_s - row.arrival_s)

    def summary(self, job_dir: Path, workers: list, host_s: float, peak_rss_mb: float) -> SimSummary:
        spans = [(w.first_round_s, w.last_round_end_s) for w in workers if w.first_round_s is not None]
        wall_s = union_length(spans)
        return SimSummary(
            job_dir=str(job_dir),
            num_requests=self.num_requests,
            num_completed=self.statuses[Status.COMPLETED],
            num_dropped=self.statuses[Status.DROPPED],
            num_cancelled=self.statuses[Status.CANCELLED],
            num_warmup=self.num_warmup,
            reasons=dict(sorted(self.reasons.items())),
            num_rounds=sum(w.engine.num_rounds for w in workers),
            num_committed_tokens=self.num_committed_tokens,
            wall_s=wall_s,
            committed_tokens_per_s=self.num_committed_tokens / wall_s if wall_s > 0 else None,
            latency={m: LatencyStats.of(v) for m, v in self.samples.items()},
            host_s=host_s,
            peak_rss_mb=peak_rss_mb,
        )


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of closed intervals."""
    total, end = 0.0, -float("inf")
    for start, stop in sorted(spans):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
