"""Synthetic workloads: a declared domain mix, prompt/output length mix and arrival process.

Requests are drawn into columnar stdlib arrays (about 21 bytes per request), so 1,000,000 requests
fit in ~25 MB. Each column has its own random stream derived from the seed, so changing one part of
the workload (say the arrival process) leaves the others' draws identical: configurations compared
under the same seed see the same requests.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from specbatch import ledger
from specbatch.sim.arrivals import ArrivalProcess, Offline


class LengthDist(Protocol):
    """A distribution of token counts (prompt lengths, or output lengths to EOS)."""

    def sample(self, n: int, rng: random.Random) -> array:
        """Return `n` lengths >= 1 as an array('l')."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class FixedLength:
    num_tokens: int

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError(f"fixed length must be >= 1, got {self.num_tokens}")

    def sample(self, n: int, rng: random.Random) -> array:
        return array("l", [self.num_tokens]) * n

    def describe(self) -> str:
        return f"fixed {self.num_tokens}"


@dataclass(frozen=True)
class UniformLength:
    """Uniform integer lengths in [low, high], both inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"uniform lengths need 1 <= low <= high, got {self.low},{self.high}")

    def sample(self, n: int, rng: random.Random) -> array:
        randint, low, high = rng.randint, self.low, self.high
        return array("l", (randint(low, high) for _ in range(n)))

    def describe(self) -> str:
        return f"uniform [{self.low}, {self.high}]"


@dataclass(frozen=True)
class LogNormalLength:
    """Heavy-tailed lengths: exp(N(ln median, sigma²)), rounded and clipped to [1, max_tokens]."""

    median: float
    sigma: float
    max_tokens: int = 32768

    def __post_init__(self) -> None:
        if not (self.median >= 1 and self.sigma >= 0 and self.max_tokens >= 1):
            raise ValueError(
                f"lognormal needs median >= 1, sigma >= 0, max >= 1, got "
                f"{self.median},{self.sigma},{self.max_tokens}"
            )

    def sample(self, n: int, rng: random.Random) -> array:
        draw, mu, sigma, top = rng.lognormvariate, math.log(self.median), self.sigma, self.max_tokens
        return array("l", (min(top, max(1, round(draw(mu, sigma)))) for _ in range(n)))

    def describe(self) -> str:
        return f"lognormal (median {self.median:g}, sigma {self.sigma:g}, max {self.max_tokens})"


@dataclass(frozen=True)
class DomainMix:
    """Domain names and their probabilities (normalized on construction)."""

    weights: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if not self.weights or any(w < 0 for _, w in self.weights) or sum(w for _, w in self.weights) <= 0:
            raise ValueError(f"domain mix needs non-negative weights with a positive sum, got {self.weights}")
        if len({d for d, _ in self.weights}) != len(self.weights) or len(self.weights) > 255:
            raise ValueError("domain mix needs distinct domain names (at most 255)")
        total = sum(w for _, w in self.weights)
        object.__setattr__(self, "weights", tuple((d, w / total) for d, w in self.weights))

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.weights)

    def sample(self, n: int, rng: random.Random) -> array:
        """Indices into `domains`, as an array('B')."""
        probs = [w for _, w in self.weights]
        return array("B", rng.choices(range(len(probs)), weights=probs, k=n))

    def describe(self) -> str:
        return "mix " + ", ".join(f"{d}={w:.3g}" for d, w in self.weights)


def parse_length(spec: str) -> LengthDist:
    """Parse fixed:N, uniform:A,B or lognormal:MEDIAN,SIGMA[,MAX]."""
    kind, _, args = spec.strip().partition(":")
    try:
        nums = [float(p) for p in args.split(",")] if args else []
    except ValueError:
        raise ValueError(f"length {spec!r}: parameters must be numbers") from None
    if kind == "fixed" and len(nums) == 1:
        return FixedLength(int(nums[0]))
    if kind == "uniform" and len(nums) == 2:
        return UniformLength(int(nums[0]), int(nums[1]))
    if kind == "lognormal" and len(nums) in (2, 3):
        return LogNormalLength(nums[0], nums[1], *(int(x) for x in nums[2:]))
    raise ValueError(
        f"unknown length {spec!r}; expected fixed:N, uniform:A,B or lognormal:MEDIAN,SIGMA[,MAX]"
    )


def parse_domains(spec: str) -> DomainMix:
    """Parse mix:code=0.5,prose=0.5, or a single domain name."""
    kind, _, args = spec.strip().partition(":")
    if kind != "mix":
        if args or not kind:
            raise ValueError(f"domains {spec!r}: expected mix:NAME=WEIGHT,... or one domain name")
        return DomainMix(((kind, 1.0),))
    pairs = []
    for part in args.split(","):
        name, eq, weight = part.partition("=")
        try:
            pairs.append((name.strip(), float(weight)))
        except ValueError:
            raise ValueError(f"domains {spec!r}: {part!r} is not NAME=WEIGHT") from None
        if not eq or not name.strip():
            raise ValueError(f"domains {spec!r}: {part!r} is not NAME=WEIGHT")
    return DomainMix(tuple(pairs))


@dataclass(frozen=True)
class SyntheticRequest:
    request_id: str
    domain: str
    num_prompt_tokens: int
    max_new_tokens: int
    num_output_tokens: int  # tokens the request generates: up to EOS, or max_new_tokens
    finish_reason: str  # eos | length
    arrival_s: float


@dataclass(frozen=True)
class SyntheticRequests:
    """Columnar requests; row i is `self[i]`. Columns are stdlib arrays, not per-request objects."""

    id_prefix: str
    domains: tuple[str, ...]
    max_new_tokens: int
    domain_index: array  # 'B', index into domains
    num_prompt_tokens: array  # 'l'
    num_output_tokens: array  # 'l', <= max_new_tokens
    reaches_eos: array  # 'b', 1 if EOS comes within max_new_tokens, else the request stops at length
    arrival_s: array  # 'd', sorted

    def __len__(self) -> int:
        return len(self.arrival_s)

    def request_id(self, i: int) -> str:
        return f"{self.id_prefix}{i:08d}"

    def __getitem__(self, i: int) -> SyntheticRequest:
        return SyntheticRequest(
            request_id=self.request_id(i),
            domain=self.domains[self.domain_index[i]],
            num_prompt_tokens=self.num_prompt_tokens[i],
            max_new_tokens=self.max_new_tokens,
            num_output_tokens=self.num_output_tokens[i],
            finish_reason="eos" if self.reaches_eos[i] else "length",
            arrival_s=self.arrival_s[i],
        )

    def __iter__(self) -> Iterator[SyntheticRequest]:
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True)
class Workload:
    """What a simulated job serves: domains, lengths, limits and arrivals, all declared."""

    domains: DomainMix
    prompt_len: LengthDist
    output_len: LengthDist  # tokens to EOS; a draw above max_new_tokens stops at length instead
    max_new_tokens: int
    arrival: ArrivalProcess = Offline()
    id_prefix: str = "sim-"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def draw(self, n: int, seed: int) -> SyntheticRequests:
        """Draw `n` requests; the same (workload, n, seed) always gives the same requests."""
        if n < 0:
            raise ValueError(f"number of requests must be >= 0, got {n}")

        def stream(name: str) -> random.Random:
            return random.Random(f"specbatch.sim:{seed}:{name}")  # str seeds hash with sha512: stable

        to_eos = self.output_len.sample(n, stream("output_len"))
        cap = self.max_new_tokens
        return SyntheticRequests(
            id_prefix=self.id_prefix,
            domains=self.domains.domains,
            max_new_tokens=cap,
            domain_index=self.domains.sample(n, stream("domain")),
            num_prompt_tokens=self.prompt_len.sample(n, stream("prompt_len")),
            num_output_tokens=array("l", (min(x, cap) for x in to_eos)),
            reaches_eos=array("b", (x <= cap for x in to_eos)),
            arrival_s=array("d", self.arrival.times(n, stream("arrival"))),
        )

    def describe(self) -> str:
        return (
            f"domains {self.domains.describe()}; prompt {self.prompt_len.describe()}; "
            f"output to EOS {self.output_len.describe()}, max_new_tokens {self.max_new_tokens}; "
            f"arrivals {self.arrival.describe()}"
        )


def recorded_requests(job_dir: str | Path) -> list[SyntheticRequest]:
    """A job's requests with their real prompt and output lengths, domains, limits and arrivals.

    Arrivals are seconds after the job's first round; a request that arrived before it counts as
    arriving at 0 (it was queued when serving began). Order: real arrival, then request id. A
    request that ended by EOS or a stop string ends by EOS here; one cut by max_new_tokens or the
    context ends by length; a dropped or cancelled one is given max_new_tokens (its end is unknown).
    """
    job_dir = Path(job_dir)
    columns = ["request_id", "domain", "status", "finish_reason", "num_prompt_tokens", "num_output_tokens",
               "max_new_tokens", "arrival_s"]
    table = ledger.read_table(job_dir, "requests").select(columns).to_pylist()
    rounds = ledger.read_table(job_dir, "rounds").column("started_s").to_pylist()
    start_s = min(rounds) if rounds else min((r["arrival_s"] for r in table), default=0.0)
    out = []
    for r in sorted(table, key=lambda r: (r["arrival_s"], r["request_id"])):
        completed = r["status"] == "completed"
        ends_by_eos = completed and r["finish_reason"] in ("eos", "stop")
        num_output = r["num_output_tokens"] if completed else r["max_new_tokens"]
        out.append(SyntheticRequest(
            request_id=r["request_id"], domain=r["domain"], num_prompt_tokens=r["num_prompt_tokens"],
            max_new_tokens=r["max_new_tokens"], num_output_tokens=max(1, num_output),
            finish_reason="eos" if ends_by_eos else "length", arrival_s=max(0.0, r["arrival_s"] - start_s),
        ))
    return out
