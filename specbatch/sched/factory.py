"""Policies and limits from a job config; shared by the real engine and the simulator."""

from __future__ import annotations

from specbatch.config import JobConfig
from specbatch.sched.policies import (
    Fcfs,
    FixedLookahead,
    FixedPrefillChunk,
    LookaheadPolicy,
    OrderPolicy,
    PrefillChunkPolicy,
    ShortestJobFirst,
)


def make_order(name: str) -> OrderPolicy:
    policies = {"fcfs": Fcfs, "sjf": ShortestJobFirst}
    if name not in policies:
        raise ValueError(f"order policy {name!r} is not available (have: {', '.join(policies)})")
    return policies[name]()


def make_lookahead(spec: str, max_lookahead: int) -> LookaheadPolicy:
    kind, _, k = spec.partition(":")
    if kind == "fixed":
        return FixedLookahead(min(int(k), max_lookahead))
    raise ValueError(f"lookahead policy {spec!r} is not available")


def make_prefill_chunk(spec: str) -> PrefillChunkPolicy:
    kind, _, size = spec.partition(":")
    if kind == "fixed":
        return FixedPrefillChunk(int(size))
    raise ValueError(f"prefill chunk policy {spec!r} is not available")


def max_lookahead(config: JobConfig) -> int:
    """No drafter means no drafts, whatever the lookahead policy says."""
    return 0 if config.drafter.kind == "none" else config.scheduler.max_lookahead


def policies(config: JobConfig) -> tuple[OrderPolicy, LookaheadPolicy, PrefillChunkPolicy]:
    s = config.scheduler
    return make_order(s.order), make_lookahead(s.lookahead, max_lookahead(config)), make_prefill_chunk(s.prefill_chunk)
