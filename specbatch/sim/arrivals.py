"""Arrival processes: when each simulated request reaches the server.

Every process returns `n` sorted arrival times in seconds from the start of the job, drawn only from
the `random.Random` it is given, so the same seed gives the same trace. Generation is one pass over
`n` floats (no per-request objects), so 1,000,000 arrivals take well under a second.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class ArrivalProcess(Protocol):
    """A declared arrival process (seed 000: results are only comparable under the same one)."""

    def times(self, n: int, rng: random.Random) -> list[float]:
        """Return `n` sorted arrival times in seconds."""
        ...

    def describe(self) -> str:
        """One line for reports: the process and its parameters."""
        ...


def _check_count(n: int) -> None:
    if n < 0:
        raise ValueError(f"number of arrivals must be >= 0, got {n}")


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")


@dataclass(frozen=True)
class Offline:
    """All requests present at t = 0: the batch (offline) setting."""

    def times(self, n: int, rng: random.Random) -> list[float]:
        _check_count(n)
        return [0.0] * n

    def describe(self) -> str:
        return "offline (all requests at t=0)"


@dataclass(frozen=True)
class Poisson:
    """Independent exponential gaps with mean 1/rate: the memoryless baseline load."""

    rate: float  # requests per second

    def __post_init__(self) -> None:
        _check_positive("poisson rate", self.rate)

    def times(self, n: int, rng: random.Random) -> list[float]:
        _check_count(n)
        expo, rate = rng.expovariate, self.rate
        return list(itertools.accumulate(expo(rate) for _ in range(n)))

    def describe(self) -> str:
        return f"poisson (rate {self.rate:g}/s)"


@dataclass(frozen=True)
class OnOff:
    """Bursts: Poisson at `rate_on` during on periods, nothing during off periods.

    Period lengths are exponential with the given means; the process starts in an on period.
    Long-run mean rate = rate_on * mean_on_s / (mean_on_s + mean_off_s).
    """

    rate_on: float
    mean_on_s: float
    mean_off_s: float

    def __post_init__(self) -> None:
        _check_positive("onoff rate_on", self.rate_on)
        _check_positive("onoff mean_on_s", self.mean_on_s)
        if not (math.isfinite(self.mean_off_s) and self.mean_off_s >= 0):
            raise ValueError(f"onoff mean_off_s must be a finite number >= 0, got {self.mean_off_s}")

    @property
    def mean_rate(self) -> float:
        return self.rate_on * self.mean_on_s / (self.mean_on_s + self.mean_off_s)

    def times(self, n: int, rng: random.Random) -> list[float]:
        # Draw gaps in "on time" and map them to wall time by inserting off periods; exponential
        # gaps are memoryless, so cutting a gap at the end of an on period changes nothing.
        _check_count(n)
        expo = rng.expovariate
        inv_on, inv_off = 1.0 / self.mean_on_s, (1.0 / self.mean_off_s if self.mean_off_s > 0 else 0.0)
        out: list[float] = []
        t, on_left = 0.0, expo(inv_on)
        for _ in range(n):
            gap = expo(self.rate_on)
            while gap > on_left:
                gap -= on_left
                t += on_left + (expo(inv_off) if inv_off else 0.0)
                on_left = expo(inv_on)
            t += gap
            on_left -= gap
            out.append(t)
        return out

    def describe(self) -> str:
        return (
            f"on/off bursts (rate {self.rate_on:g}/s while on, mean on {self.mean_on_s:g}s, "
            f"mean off {self.mean_off_s:g}s, mean rate {self.mean_rate:.4g}/s)"
        )


@dataclass(frozen=True)
class GammaGaps:
    """Gamma inter-arrival gaps with mean 1/rate and coefficient of variation `cv`.

    cv = 1 is Poisson, cv > 1 is burstier, cv < 1 smoother, cv = 0 evenly spaced.
    Shape = 1/cv², scale = cv²/rate.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        _check_positive("gamma rate", self.rate)
        if not (math.isfinite(self.cv) and self.cv >= 0):
            raise ValueError(f"gamma cv must be a finite number >= 0, got {self.cv}")

    def times(self, n: int, rng: random.Random) -> list[float]:
        _check_count(n)
        if self.cv == 0:
            return [(i + 1) / self.rate for i in range(n)]
        shape, scale = 1.0 / self.cv**2, self.cv**2 / self.rate
        gamma = rng.gammavariate
        return list(itertools.accumulate(gamma(shape, scale) for _ in range(n)))

    def describe(self) -> str:
        return f"gamma gaps (rate {self.rate:g}/s, cv {self.cv:g})"


@dataclass(frozen=True)
class Replay:
    """Replays recorded arrival times (sorted on construction); `times(n)` takes the first n."""

    arrival_s: tuple[float, ...] = field(repr=False)
    source: str = ""

    def __post_init__(self) -> None:
        if any(not math.isfinite(t) or t < 0 for t in self.arrival_s):
            raise ValueError(f"replay arrival_s values must be finite and >= 0 ({self.source or 'given'})")
        object.__setattr__(self, "arrival_s", tuple(sorted(float(t) for t in self.arrival_s)))

    def times(self, n: int, rng: random.Random) -> list[float]:
        _check_count(n)
        if n > len(self.arrival_s):
            raise ValueError(f"replay has {len(self.arrival_s)} arrivals, {n} requested")
        return list(self.arrival_s[:n])

    def describe(self) -> str:
        where = f" from {self.source}" if self.source else ""
        return f"replay of {len(self.arrival_s)} recorded arrivals{where}"

    @classmethod
    def from_file(cls, path: str | Path) -> Replay:
        """Read the `arrival_s` column of a Parquet file or JSONL file (one object per line)."""
        path = Path(path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=["arrival_s"])
            values = table.column("arrival_s").to_pylist()
        else:
            with path.open() as f:
                values = [json.loads(line)["arrival_s"] for line in f if line.strip()]
        if any(v is None for v in values):
            raise ValueError(f"{path}: arrival_s has null values")
        return cls(tuple(float(v) for v in values), source=str(path))


def _floats(spec: str, args: str, count: int) -> list[float]:
    parts = [p for p in args.split(",") if p.strip()]
    if len(parts) != count:
        raise ValueError(f"arrival {spec!r}: expected {count} comma-separated numbers")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"arrival {spec!r}: parameters must be numbers") from None


def parse_arrival(spec: str) -> ArrivalProcess:
    """Parse a CLI arrival string: offline, poisson:RATE, onoff:RATE_ON,MEAN_ON_S,MEAN_OFF_S,
    gamma:RATE,CV or replay:PATH (Parquet or JSONL with an arrival_s column)."""
    kind, _, args = spec.strip().partition(":")
    if kind == "offline" and not args:
        return Offline()
    if kind == "poisson":
        return Poisson(*_floats(spec, args, 1))
    if kind == "onoff":
        return OnOff(*_floats(spec, args, 3))
    if kind == "gamma":
        return GammaGaps(*_floats(spec, args, 2))
    if kind == "replay" and args:
        return Replay.from_file(args)
    raise ValueError(
        f"unknown arrival {spec!r}; expected offline, poisson:RATE, onoff:RATE_ON,MEAN_ON_S,MEAN_OFF_S, "
        "gamma:RATE,CV or replay:PATH"
    )
