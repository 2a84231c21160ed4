"""`specbatch queue-lab`: the fluid backlog illustration of seed 000 (its last paragraph).

Work arrives at a constant rate λ and is completed at a constant rate μ while any is waiting:

    B(t) = max(0, B0 + (λ − μ)·t)

With λ = 4, μ = 3 a 4-unit backlog grows by 1 unit/s and never drains; with λ = 4, μ = 5 it
drains in B0 / (μ − λ) = 4 s. It shows offered work against completion capacity and nothing more:
no batches, token trees, priorities, admission or random arrivals, so it cannot speak to tail
latency or fairness; use `specbatch simulate` for those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MODEL_LABEL = (
    "fluid model: constant arrival and service rates in normalized work units; "
    "no batches, token trees, priorities, admission or random arrivals; "
    "it cannot certify tail latency or scheduler fairness"
)
MAX_POINTS = 100_000


def _check_rate(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class FluidBacklog:
    arrival: float  # λ, work units arriving per second
    service: float  # μ, work units completed per second while backlog > 0
    initial_backlog: float  # B0, work units waiting at t = 0

    def __post_init__(self) -> None:
        _check_rate("arrival rate (lambda)", self.arrival)
        _check_rate("service rate (mu)", self.service)
        _check_rate("initial backlog", self.initial_backlog)

    @property
    def rate_of_change(self) -> float:
        """dB/dt just after t = 0: λ − μ while there is backlog; 0 for an empty queue that
        is served at least as fast as work arrives (it stays empty)."""
        if self.initial_backlog > 0 or self.arrival > self.service:
            return self.arrival - self.service
        return 0.0

    @property
    def drain_time_s(self) -> float | None:
        """When the backlog first reaches zero; None if it never does."""
        if self.arrival > self.service:
            return None
        if self.initial_backlog == 0:
            return 0.0
        if self.arrival == self.service:
            return None
        return self.initial_backlog / (self.service - self.arrival)

    def backlog_at(self, t: float) -> float:
        if t < 0:
            raise ValueError(f"time must be >= 0, got {t}")
        return max(0.0, self.initial_backlog + (self.arrival - self.service) * t)

    def default_horizon_s(self) -> float:
        """Twice the drain time (so the empty stretch shows), else 10 s."""
        drain = self.drain_time_s
        return 2.0 * drain if drain else 10.0

    def series(self, horizon_s: float | None = None, step_s: float = 1.0) -> list[tuple[float, float]]:
        """(t, backlog) every `step_s` from 0 to the horizon, plus the exact drain instant."""
        horizon = self.default_horizon_s() if horizon_s is None else horizon_s
        if not (math.isfinite(horizon) and horizon >= 0 and math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"need horizon_s >= 0 and step_s > 0, got {horizon_s}, {step_s}")
        num_steps = math.floor(horizon / step_s + 1e-9)
        if num_steps + 1 > MAX_POINTS:
            raise ValueError(f"series would have {num_steps + 1} points (max {MAX_POINTS}); raise step_s")
        times = [i * step_s for i in range(num_steps + 1)]
        drain = self.drain_time_s
        if drain and drain <= horizon and all(abs(t - drain) > 1e-9 for t in times):
            times = sorted([*times, drain])
        return [(t, self.backlog_at(t)) for t in times]


def queue_lab_report(
    arrival: float,
    service: float,
    backlog: float,
    horizon_s: float | None = None,
    step_s: float = 1.0,
) -> dict[str, Any]:
    """The JSON object `specbatch queue-lab --json` prints (drain_time_s is null if never)."""
    model = FluidBacklog(arrival, service, backlog)
    return {
        "model": MODEL_LABEL,
        "arrival": model.arrival,
        "service": model.service,
        "initial_backlog": model.initial_backlog,
        "rate_of_change": model.rate_of_change,
        "drain_time_s": model.drain_time_s,
        "series": [{"t": t, "backlog": b} for t, b in model.series(horizon_s, step_s)],
    }


def format_queue_lab(report: dict[str, Any]) -> str:
    """Plain-text rendering of `queue_lab_report` for the terminal."""
    lam, mu, b0 = report["arrival"], report["service"], report["initial_backlog"]
    rate, drain = report["rate_of_change"], report["drain_time_s"]
    if drain is None:
        verdict = f"never drains (backlog changes by {rate:+g} units/s)"
    else:
        verdict = f"drains in {drain:g} s (backlog changes by {rate:+g} units/s until empty)"
    lines = [
        f"lambda={lam:g}/s  mu={mu:g}/s  initial backlog={b0:g}: {verdict}",
        f"({report['model']})",
        "     t  backlog",
    ]
    lines += [f"{p['t']:6g}  {p['backlog']:g}" for p in report["series"]]
    return "\n".join(lines)
