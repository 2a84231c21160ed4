"""Policy protocols and the simple policies. Pure Python: policies see `Row` state, counters
and the shared `SchedContext`, never tensors, so the simulator runs the very same objects.

- Order policies rank waiting (and, if they preempt, running) requests: lower priority value runs
  first. A waiting row's `key` must not change while it waits, except through its class's scale:
  priority = class_scale(class_of(row)) · key(row). Keeping keys static is what lets the scheduler
  keep a million waiting rows in heaps and do O(#classes + log n) work per admission.
- Lookahead policies choose k per decode row, within each row's cap (order: lookahead.py).
- Prefill-chunk policies size each prefill row's chunk for a round (deadline: prefill.py).
More policies: order.py (laps-sd, specbatch), lookahead.py (adaptive, slack), prefill.py (deadline).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specbatch.core import Row
from specbatch.sched.estimates import AcceptanceStats

__all__ = ["AcceptanceStats", "Fcfs", "FixedLookahead", "FixedPrefillChunk", "LookaheadPolicy", "OrderBase",
           "OrderPolicy", "PrefillChunkPolicy", "ShortestJobFirst", "full_order"]


class OrderPolicy(Protocol):
    name: str
    preemptive: bool
    ages_waiting_rows: bool

    def key(self, row: Row, now_s: float) -> float:
        """Static rank of a row within its class while it waits; lower runs first."""

    def class_of(self, row: Row) -> str:
        """Rows of one class share a scale that may change over time (e.g. per-domain speed)."""

    def class_scale(self, cls: str) -> float:
        """Current multiplier of a class's keys (≥ 0)."""

    def priority(self, row: Row, now_s: float) -> float:
        """Current rank of any row (waiting or running): class_scale · key, minus any aging credit.
        With aging (ages_waiting_rows), the oldest waiting row is a candidate next to the class
        heads, so a long wait can lift a row over better-keyed ones."""

    def should_preempt(self, running: Row, waiting: Row, now_s: float) -> bool:
        """Whether `waiting` deserves `running`'s place enough to pay for a recompute."""

    def pick_victim(self, candidates: list[Row], now_s: float, kv_held: list[int],
                    need_tokens: int) -> Row:
        """Which running candidate to preempt (kv_held[i]: KV tokens candidates[i] holds; need_tokens:
        KV the scheduler must free)."""


class LookaheadPolicy(Protocol):
    name: str

    def choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        """k per row, each within 0..caps[i]."""

    def drafts_when_current(self, rows: list[Row], caps: list[int]) -> bool:
        """Whether these rows would draft if their draft caches were current (rows still prefilling
        count as current): the scheduler then fills the draft cache beside their prefill. No state
        changes."""


class PrefillChunkPolicy(Protocol):
    name: str

    def chunk_tokens(self, decode_rows: list[tuple[Row, int]], prefill_rows: Sequence[Row] = ()) -> int:
        """Largest prefill chunk a row may get this round next to the given decode rows (row, k);
        prefill_rows are the rows that would prefill, in order."""


class OrderBase:
    """Defaults for order policies: one class of scale 1, no aging, preempt only a row of strictly
    worse priority, and the worst-ranked victim first."""

    name = "base"
    preemptive = False
    ages_waiting_rows = False

    def key(self, row: Row, now_s: float) -> float:
        raise NotImplementedError

    def class_of(self, row: Row) -> str:
        return ""

    def class_scale(self, cls: str) -> float:
        return 1.0

    def priority(self, row: Row, now_s: float) -> float:
        return self.class_scale(self.class_of(row)) * self.key(row, now_s)

    def should_preempt(self, running: Row, waiting: Row, now_s: float) -> bool:
        return self.priority(waiting, now_s) < self.priority(running, now_s)

    def pick_victim(self, candidates: list[Row], now_s: float, kv_held: list[int],
                    need_tokens: int) -> Row:
        return max(candidates, key=lambda row: self.priority(row, now_s))


class _WrappedOrder(OrderBase):
    """Gives a minimal order policy (name, preemptive, key) the full protocol."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.preemptive = getattr(inner, "preemptive", False)

    def key(self, row: Row, now_s: float) -> float:
        return self.inner.key(row, now_s)


def full_order(policy) -> OrderPolicy:
    return policy if hasattr(policy, "class_scale") else _WrappedOrder(policy)


@dataclass
class Fcfs(OrderBase):
    name: str = "fcfs"
    preemptive: bool = False

    def key(self, row: Row, now_s: float) -> float:
        return row.arrival_s


@dataclass
class ShortestJobFirst(OrderBase):
    """Shortest remaining max_new_tokens first (the clairvoyant bound users give us)."""

    name: str = "sjf"
    preemptive: bool = False

    def key(self, row: Row, now_s: float) -> float:
        return float(row.num_new_tokens_left + row.num_prefill_remaining)


@dataclass
class FixedLookahead:
    k: int
    name: str = "fixed"

    def choose(self, rows: list[Row], caps: list[int]) -> list[int]:
        return [min(self.k, cap) for cap in caps]

    def drafts_when_current(self, rows: list[Row], caps: list[int]) -> bool:
        return self.k > 0 and any(caps)


@dataclass
class FixedPrefillChunk:
    size: int
    name: str = "fixed"

    def chunk_tokens(self, decode_rows: list[tuple[Row, int]], prefill_rows: Sequence[Row] = ()) -> int:
        return self.size
