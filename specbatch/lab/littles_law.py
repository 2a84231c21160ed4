"""Little's-law latency model for speculative and plain decoding under load (seed 001).

Mean latency against request rate from a few fitted cost components, to explain why speculation's
gain shrinks as load rises and to check the simulator against.

Derivation. A configuration serves requests with continuous batching. One round over a batch of b
requests takes

    T(b) = t0 + t1·b

t0 is load-independent (launches, weights read once per pass, k sequential draft passes), t1 is
each batched request's marginal cost (its 1 + k verify rows and k draft rows). A request that
generates N tokens at τ committed tokens per round (τ = Σ_{i=0..k} α^i = (1 − α^{k+1}) / (1 − α)
for i.i.d. acceptance α, τ = 1 for plain decoding) runs in R = N / τ rounds and also pays its own
prefill P (seconds when run alone).

Let L be the mean number of requests in the system (the effective batch size). While our request
is in the system the batch holds it plus, on average, L others (arrivals see time averages), so
each of its rounds takes t0 + t1·(1 + L). Every request that arrives during its stay W, λ·W = L of
them by Little's law, runs its prefill on the shared device and stalls it by P. Hence

    W = A + B·L,   A = P + R·(t0 + t1)   (load-independent: the latency of a request alone)
                   B = P + R·t1          (load-dependent: what each co-resident request adds)

Little's law closes the loop, L = λ·W, so W = A + B·λ·W and

    W(λ) = A / (1 − λ·B),   L(λ) = λ·A / (1 − λ·B),   for λ < λ* = 1 / B,

and W → ∞ as λ → λ*: B is each request's device time once t0 is amortized over an unbounded
batch, so λ* is the configuration's capacity. Speculation lowers A (R shrinks by τ), but each of
its rounds costs (1 + k) verify rows and k draft rows per request for only τ ≤ 1 + k tokens, so
B_spec ≥ B_plain (prefill aside): it wins at low load and loses capacity.

It is a mean-value model: it ignores admission waits, KV capacity, preemption, padding, the EOS
cut of the last round and all variance, so it predicts means, never tails.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LatencyModel:
    """Fitted cost components of one configuration (speculative or plain)."""

    name: str
    num_output_tokens: float  # N: mean tokens generated per request
    tokens_per_round: float  # τ: mean tokens committed per request per round
    round_fixed_s: float  # t0: round time that does not grow with the batch
    round_per_request_s: float  # t1: round time each batched request adds
    prefill_s: float = 0.0  # P: one request's prefill time

    def __post_init__(self) -> None:
        if not (self.num_output_tokens > 0 and self.tokens_per_round > 0):
            raise ValueError(f"{self.name}: num_output_tokens and tokens_per_round must be > 0")
        if min(self.round_fixed_s, self.round_per_request_s, self.prefill_s) < 0:
            raise ValueError(f"{self.name}: costs must be >= 0")
        if self.load_dependent_s <= 0:
            raise ValueError(f"{self.name}: need round_per_request_s > 0 or prefill_s > 0 (else no capacity)")

    @property
    def num_rounds(self) -> float:
        return self.num_output_tokens / self.tokens_per_round

    @property
    def load_independent_s(self) -> float:
        """A = P + R·(t0 + t1): mean latency of a request served alone."""
        return self.prefill_s + self.num_rounds * (self.round_fixed_s + self.round_per_request_s)

    @property
    def load_dependent_s(self) -> float:
        """B = P + R·t1: latency each other request in the system adds."""
        return self.prefill_s + self.num_rounds * self.round_per_request_s

    @property
    def capacity_rps(self) -> float:
        """λ* = 1 / B: the request rate at which latency diverges."""
        return 1.0 / self.load_dependent_s

    def mean_batch_size(self, rate: float) -> float:
        """L = λ·A / (1 − λ·B), or inf at or beyond capacity."""
        return rate * self.mean_latency_s(rate)

    def mean_latency_s(self, rate: float) -> float:
        """W = A / (1 − λ·B), or inf at or beyond capacity."""
        if rate < 0 or math.isnan(rate):
            raise ValueError(f"request rate must be >= 0, got {rate}")
        utilization = rate * self.load_dependent_s
        if utilization >= 1.0:
            return math.inf
        return self.load_independent_s / (1.0 - utilization)


def tokens_per_round(alpha: float, k: int) -> float:
    """τ = Σ_{i=0..k} α^i: accepted drafts plus the one correction or bonus token."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got {alpha}, {k}")
    return sum(alpha**i for i in range(k + 1))


def plain_model(
    name: str,
    num_output_tokens: float,
    verify_fixed_s: float,
    verify_per_position_s: float,
    prefill_s: float = 0.0,
) -> LatencyModel:
    """Plain decoding: one target row per request per round, one token per round."""
    return LatencyModel(name, num_output_tokens, 1.0, verify_fixed_s, verify_per_position_s, prefill_s)


def speculative_model(
    name: str,
    num_output_tokens: float,
    k: int,
    alpha: float,
    verify_fixed_s: float,
    verify_per_position_s: float,
    draft_fixed_s: float,
    draft_per_position_s: float,
    prefill_s: float = 0.0,
) -> LatencyModel:
    """k sequential draft passes (1 row per request each) and one verify pass of 1 + k rows.

    t0 = k·draft_fixed + verify_fixed;  t1 = k·draft_per_row + (1 + k)·verify_per_row.
    Pass draft costs of 0 for n-gram drafting.
    """
    return LatencyModel(
        name=name,
        num_output_tokens=num_output_tokens,
        tokens_per_round=tokens_per_round(alpha, k),
        round_fixed_s=k * draft_fixed_s + verify_fixed_s,
        round_per_request_s=k * draft_per_position_s + (1 + k) * verify_per_position_s,
        prefill_s=prefill_s,
    )


def predict_latency(model: LatencyModel, rates: Iterable[float]) -> list[float]:
    """Mean latency (s) at each request rate (req/s); math.inf at or beyond capacity."""
    return [model.mean_latency_s(rate) for rate in rates]


def latency_curve(model: LatencyModel, rates: Iterable[float]) -> list[tuple[float, float]]:
    """(rate, latency) pairs for `plot_latency_vs_rate`."""
    rates = list(rates)
    return list(zip(rates, predict_latency(model, rates), strict=True))


def plot_latency_vs_rate(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    points: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    capacities: Mapping[str, float] | None = None,
    title: str = "Mean latency vs request rate (Little's-law model)",
) -> Path:
    """Model curves as lines, optional measured or simulated `points` as markers, optional
    capacities as dashed verticals. Infinite latencies are left out. Writes and returns `path`."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    colors: dict[str, Any] = {}  # matplotlib colors
    for name, curve in curves.items():
        finite = [(r, w) for r, w in curve if math.isfinite(w)]
        (line,) = ax.plot([r for r, _ in finite], [w for _, w in finite], label=f"{name} (model)")
        colors[name] = line.get_color()
    for name, pts in (points or {}).items():
        finite = [(r, w) for r, w in pts if math.isfinite(w)]
        ax.scatter(
            [r for r, _ in finite],
            [w for _, w in finite],
            color=colors.get(name),
            marker="o",
            s=18,
            label=f"{name} (simulated)",
            zorder=3,
        )
    for name, cap in (capacities or {}).items():
        ax.axvline(cap, color=colors.get(name, "gray"), linestyle="--", linewidth=0.8)
    ax.set_xlabel("request rate λ (requests/s)")
    ax.set_ylabel("mean latency W (s)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
