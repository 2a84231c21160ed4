"""Order, lookahead and prefill-chunk policies. Pure Python: they see `Sequence` state and
counters, never tensors, so the simulator runs the very same objects.

- Order policies rank waiting (and, if they preempt, running) requests: lower key runs first.
- Lookahead policies choose k per decode row, within each row's cap.
- Prefill-chunk policies size the prefill chunk of a round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from specbatch.engine.sequence import Sequence


@dataclass
class AcceptanceStats:
    """Per-domain proposed/accepted draft counts, updated at commit; priors for new rows."""

    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    prior: float = 0.5

    def observe(self, domain: str, num_proposed: int, num_accepted: int) -> None:
        self.proposed[domain] = self.proposed.get(domain, 0) + num_proposed
        self.accepted[domain] = self.accepted.get(domain, 0) + num_accepted

    def alpha(self, domain: str, prior_weight: float = 8.0) -> float:
        """Per-token acceptance of a domain, shrunk towards the prior while it has few samples."""
        proposed = self.proposed.get(domain, 0)
        return (self.accepted.get(domain, 0) + self.prior * prior_weight) / (proposed + prior_weight)


class OrderPolicy(Protocol):
    name: str
    preemptive: bool

    def key(self, row: Sequence, now_s: float) -> float:
        """Rank of a row; lower runs first."""


class LookaheadPolicy(Protocol):
    name: str

    def choose(self, rows: list[Sequence], caps: list[int]) -> list[int]:
        """k per row, each within 0..caps[i]."""


class PrefillChunkPolicy(Protocol):
    name: str

    def chunk_tokens(self, decode_rows: list[tuple[Sequence, int]]) -> int:
        """Prefill tokens this round may add next to the given decode rows (row, k)."""


@dataclass
class Fcfs:
    name: str = "fcfs"
    preemptive: bool = False

    def key(self, row: Sequence, now_s: float) -> float:
        return row.arrival_s


@dataclass
class ShortestJobFirst:
    """Shortest remaining max_new_tokens first (the clairvoyant bound users give us)."""

    name: str = "sjf"
    preemptive: bool = False

    def key(self, row: Sequence, now_s: float) -> float:
        return float(row.num_new_tokens_left + row.num_prefill_remaining)


@dataclass
class FixedLookahead:
    k: int
    name: str = "fixed"

    def choose(self, rows: list[Sequence], caps: list[int]) -> list[int]:
        return [min(self.k, cap) for cap in caps]


@dataclass
class FixedPrefillChunk:
    size: int
    name: str = "fixed"

    def chunk_tokens(self, decode_rows: list[tuple[Sequence, int]]) -> int:
        return self.size
