"""Policies, context and scheduler from a job config; shared by the real engine and the simulator.

    --order fcfs|sjf|laps-sd|specbatch   --lookahead fixed:K|adaptive|slack   --prefill-chunk fixed:N|deadline
"""

from __future__ import annotations

from pathlib import Path

from specbatch.config import INDEXING_DRAFTERS, MODEL_DRAFTERS, JobConfig, LookaheadSpec, PrefillChunkSpec
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.context import SchedContext
from specbatch.sched.costmodel import CPU_DEMO_PROFILE, CostModel
from specbatch.sched.draft_control import DraftControl, DraftGate
from specbatch.sched.kv_blocks import KVBlocks
from specbatch.sched.lookahead import AdaptiveLookahead, SlackLookahead
from specbatch.sched.online_cost import OnlineCostFit
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


def make_lookahead(spec: LookaheadSpec | str, max_lookahead: int,
                   ctx: SchedContext | None = None) -> LookaheadPolicy:
    """A string goes through the config's parser (the one parser of lookahead specs)."""
    spec = LookaheadSpec.parse(spec) if isinstance(spec, str) else spec
    ctx = ctx or SchedContext(max_lookahead=max_lookahead)
    if spec.kind == "adaptive":
        return AdaptiveLookahead(ctx)
    if spec.kind == "slack":
        return SlackLookahead(ctx)
    k = spec.within(max_lookahead).k
    if k is None:
        raise ValueError(f"lookahead {spec} has no K")
    return FixedLookahead(k)


def make_prefill_chunk(spec: PrefillChunkSpec | str, ctx: SchedContext | None = None) -> PrefillChunkPolicy:
    """A string goes through the config's parser (the one parser of prefill-chunk specs)."""
    spec = PrefillChunkSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.num_tokens is not None:
        return FixedPrefillChunk(spec.num_tokens)
    return DeadlinePrefillChunk(ctx or SchedContext())


def resolve_cost_model(spec: str | None, config: JobConfig | None = None) -> CostModel:
    """A named profile (`cpu-demo`), a JSON file from `specbatch calibrate`, or with no spec the
    config's `scheduler.cost_model` file, else the CPU demo profile."""
    if spec is None:
        configured = config.scheduler.cost_model if config is not None else None
        return CostModel.load(Path(configured)) if configured else CPU_DEMO_PROFILE
    if spec in PROFILES:
        return PROFILES[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"cost model {spec!r} is neither a profile ({', '.join(PROFILES)}) nor a file")
    return CostModel.load(path)


# Graph modes pad every decode-shaped pass to at least this many rows and query positions: compiled
# graphs specialize a size of 1 (engine/graphs.py).
MIN_GRAPH_SIZE = 2


def job_buckets(config: JobConfig) -> ShapeBuckets:
    """The shape buckets the scheduler plans with and the target pads to: the configured ones, or in a
    graph mode a small set chosen from the batch sizes and lookaheads the job will use. `compile`
    pads only sizes of 1 (its graphs take any other size): batches of one row, and single-position
    verify passes where the job speculates (so that they share the graph of k > 0). `cuda-graphs`
    replays fixed shapes: powers of two up to max_batch_rows and 1 + k for k = 1, 2, 4, ..., max
    lookahead. The drafter pads its batch the same way and runs its steps' exact lengths."""
    b, graphs, k_max = config.buckets, config.models.graphs, config.max_lookahead
    if b.batch_rows or b.query_len or graphs == "eager":
        return ShapeBuckets(b.batch_rows, b.query_len, b.kv_len_multiple)
    if graphs == "compile":
        return ShapeBuckets((MIN_GRAPH_SIZE,), (MIN_GRAPH_SIZE,) if k_max else (), b.kv_len_multiple)
    max_rows = config.scheduler.max_batch_rows
    batch_rows = {min(2**i, max_rows) for i in range(1, max(max_rows, 2).bit_length() + 1)}
    query_len = {max(1 + min(2**i, k_max), MIN_GRAPH_SIZE) for i in range(max(k_max, 1).bit_length() + 1)}
    return ShapeBuckets(tuple(sorted(batch_rows | {MIN_GRAPH_SIZE})), tuple(sorted(query_len)), b.kv_len_multiple)


def make_context(config: JobConfig, cost: CostModel | None = None) -> SchedContext:
    s = config.scheduler
    # only where the lookahead is decided from it: a measured model makes the schedule depend on the
    # clock, and with fixed k (and the rejection coupling) the schedule is what fixes a seed's text
    learns = s.learn_cost and config.effective_lookahead.kind == "adaptive" and config.max_lookahead > 0
    round_cost = RoundCostModel(cost or resolve_cost_model(None, config), job_buckets(config),
                                uses_draft_model=config.drafter.model_kind is not None,
                                flat=True)  # the paged engine and the simulator run flat passes (issue 40)
    cost_fit = OnlineCostFit(round_cost.cost, draft_model=round_cost.uses_draft_model) if learns else None
    return SchedContext(round_cost, max_lookahead=config.max_lookahead, max_batch_rows=s.max_batch_rows,
                        max_round_tokens=s.max_round_tokens, tpot_slo_ms=s.tpot_slo_ms,
                        # with a gate, whether anything drafts is measured: the prompts prefilled
                        # before the first decode round fill the draft cache only if it drafts
                        draft=DraftControl(cost_fit, DraftGate() if learns else None, drafting=not learns),
                        drafter_kinds=config.drafter.kinds if config.max_lookahead else (),
                        model_drafter_kinds=frozenset(MODEL_DRAFTERS),
                        indexing_drafter_kinds=frozenset(INDEXING_DRAFTERS))


def policies(config: JobConfig, ctx: SchedContext | None = None
             ) -> tuple[OrderPolicy, LookaheadPolicy, PrefillChunkPolicy]:
    s = config.scheduler
    ctx = ctx or make_context(config)
    return (make_order(s.order, ctx), make_lookahead(config.effective_lookahead, config.max_lookahead, ctx),
            make_prefill_chunk(s.prefill_chunk, ctx))


def make_scheduler(config: JobConfig, kv_capacity_tokens: int, max_context: int,
                   cost: CostModel | None = None, kv_bytes_per_token: int = 0) -> Scheduler:
    """The scheduler of one worker: limits, KV blocks, the shared context and the three policies."""
    ctx = make_context(config, cost)
    limits = SchedulerLimits(config.scheduler.max_batch_rows, config.scheduler.max_round_tokens, max_context,
                             config.max_lookahead, config.capacity.admission)
    order, lookahead, prefill_chunk = policies(config, ctx)
    return Scheduler(limits, make_kv_blocks(config, kv_capacity_tokens, kv_bytes_per_token), order, lookahead,
                     prefill_chunk, context=ctx)


def make_kv_blocks(config: JobConfig, kv_capacity_tokens: int, kv_bytes_per_token: int = 0) -> KVBlocks:
    """The job's KV blocks. Shared prefixes (`cache.prefix`) are off with an EAGLE head: its cache at
    a position was fed the target's hidden state there, which a row sharing the block never computed."""
    c = config.cache
    max_cached = None
    if c.prefix_kv_bytes is not None:
        max_cached = c.prefix_kv_bytes // max(kv_bytes_per_token * c.block_tokens, 1)
    return KVBlocks(max(1, kv_capacity_tokens // c.block_tokens), c.block_tokens, shares_prefixes(config), max_cached)


def shares_prefixes(config: JobConfig) -> bool:
    """Whether rows share KV blocks of a common prefix: `cache.prefix`, and no EAGLE head (`make_kv_blocks`)."""
    return config.cache.prefix and "eagle" not in config.drafter.kind
