"""Policies, context and scheduler from a job config; shared by the real engine and the simulator.

    --order fcfs|sjf|laps-sd|specbatch   --lookahead fixed:K|adaptive|slack   --prefill-chunk fixed:N|deadline
"""

from __future__ import annotations

from pathlib import Path

from specbatch.config import JobConfig
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.capacity import KVBudget
from specbatch.sched.context import SchedContext
from specbatch.sched.costmodel import CPU_DEMO_PROFILE, CostModel
from specbatch.sched.lookahead import AdaptiveLookahead, SlackLookahead
from specbatch.sched.order import LapsSd, SpecbatchOrder
from specbatch.sched.policies import (
    Fcfs,
    FixedLookahead,
    FixedPrefillChunk,
    LookaheadPolicy,
    OrderPolicy,
    PrefillChunkPolicy,
    ShortestJobFirst,
)
from specbatch.sched.prefill import DeadlinePrefillChunk
from specbatch.sched.roundcost import RoundCostModel
from specbatch.sched.scheduler import Scheduler, SchedulerLimits

ORDERS = ("fcfs", "sjf", "laps-sd", "specbatch")
PROFILES: dict[str, CostModel] = {"cpu-demo": CPU_DEMO_PROFILE}  # named cost models


def make_order(name: str, ctx: SchedContext | None = None) -> OrderPolicy:
    ctx = ctx or SchedContext()
    if name == "fcfs":
        return Fcfs()
    if name == "sjf":
        return ShortestJobFirst()
    if name == "laps-sd":
        return LapsSd(ctx)
    if name == "specbatch":
        return SpecbatchOrder(ctx)
    raise ValueError(f"order policy {name!r} is not available (have: {', '.join(ORDERS)})")


def make_lookahead(spec: str, max_lookahead: int, ctx: SchedContext | None = None) -> LookaheadPolicy:
    ctx = ctx or SchedContext(max_lookahead=max_lookahead)
    kind, _, k = spec.partition(":")
    if kind == "fixed" and k.isdigit():
        return FixedLookahead(min(int(k), max_lookahead))
    if spec == "adaptive":
        return AdaptiveLookahead(ctx)
    if spec == "slack":
        return SlackLookahead(ctx)
    raise ValueError(f"lookahead policy {spec!r} is not available (fixed:K, adaptive, slack)")


def make_prefill_chunk(spec: str, ctx: SchedContext | None = None) -> PrefillChunkPolicy:
    kind, _, size = spec.partition(":")
    if kind == "fixed" and size.isdigit():
        return FixedPrefillChunk(int(size))
    if spec == "deadline":
        return DeadlinePrefillChunk(ctx or SchedContext())
    raise ValueError(f"prefill chunk policy {spec!r} is not available (fixed:N, deadline)")


def max_lookahead(config: JobConfig) -> int:
    """No drafter means no drafts, whatever the lookahead policy says."""
    return 0 if config.drafter.kind == "none" else config.scheduler.max_lookahead


def resolve_cost_model(spec: str | None, config: JobConfig | None = None) -> CostModel:
    """A named profile (`cpu-demo`), a JSON file from `specbatch calibrate`, or with no spec the
    config's `scheduler.cost_model` file, else the CPU demo profile."""
    if spec is None:
        path = config.scheduler.cost_model if config is not None else None
        return CostModel.load(Path(path)) if path else CPU_DEMO_PROFILE
    if spec in PROFILES:
        return PROFILES[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"cost model {spec!r} is neither a profile ({', '.join(PROFILES)}) nor a file")
    return CostModel.load(path)


def make_context(config: JobConfig, cost: CostModel | None = None) -> SchedContext:
    s, b = config.scheduler, config.buckets
    round_cost = RoundCostModel(cost or resolve_cost_model(None, config),
                                ShapeBuckets(b.batch_rows, b.query_len, b.kv_len_multiple),
                                uses_draft_model=config.drafter.kind == "draft")
    return SchedContext(round_cost, max_lookahead=max_lookahead(config), max_batch_rows=s.max_batch_rows,
                        max_round_tokens=s.max_round_tokens, tpot_slo_ms=s.tpot_slo_ms)


def policies(config: JobConfig, ctx: SchedContext | None = None
             ) -> tuple[OrderPolicy, LookaheadPolicy, PrefillChunkPolicy]:
    s = config.scheduler
    ctx = ctx or make_context(config)
    return (make_order(s.order, ctx), make_lookahead(s.lookahead, max_lookahead(config), ctx),
            make_prefill_chunk(s.prefill_chunk, ctx))


def make_scheduler(config: JobConfig, kv_capacity_tokens: int, max_context: int,
                   cost: CostModel | None = None) -> Scheduler:
    """The scheduler of one worker: limits, KV budget, the shared context and the three policies."""
    ctx = make_context(config, cost)
    limits = SchedulerLimits(config.scheduler.max_batch_rows, config.scheduler.max_round_tokens, max_context,
                             max_lookahead(config), config.capacity.admission)
    order, lookahead, prefill_chunk = policies(config, ctx)
    return Scheduler(limits, KVBudget(kv_capacity_tokens), order, lookahead, prefill_chunk, context=ctx)
