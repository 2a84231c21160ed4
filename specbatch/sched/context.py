"""What policies may read besides the rows: the round-time model, measured statistics, limits, the
clock, a little recent state, and the drafting controller (`DraftControl`). One object, shared by the
scheduler and every policy built for it, so the simulator and the real engine give policies the same
view. A read-only view for policies and the loop: only the scheduler writes it (`Scheduler.plan`,
`Scheduler.observe_round`, `Scheduler.finish`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbatch.core import RoundPlan, Row
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sched.draft_control import DraftControl
from specbatch.sched.drafter_choice import DrafterAlphas
from specbatch.sched.estimates import AcceptanceStats, AlphaTracker, expected_tokens
from specbatch.sched.roundcost import RoundCostModel, index_lag


@dataclass
class SchedContext:
    round_cost: RoundCostModel = field(default_factory=lambda: RoundCostModel(CPU_DEMO_PROFILE))
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    max_lookahead: int = 0
    max_batch_rows: int = 32
    max_round_tokens: int = 2048
    tpot_slo_ms: float = 200.0
    now_s: float = 0.0  # the clock at the start of the current plan
    num_running: int = 0
    recent_k: float = 0.0  # moving average of the mean planned k over decode rows
    num_decode_plans: int = 0  # plans with decode rows so far
    num_plans: int = 0  # plans made so far: a version for per-round caches
    draft: DraftControl = field(default_factory=DraftControl)  # does this round draft, which row probes
    # the job's drafters (`drafter.kind`) and those that run a model: several make α per drafter
    drafter_kinds: tuple[str, ...] = ()
    model_drafter_kinds: frozenset[str] = frozenset()
    indexing_drafter_kinds: frozenset[str] = frozenset()  # those that index a row before drafting (suffix)
    alphas: AlphaTracker = field(init=False)

    def __post_init__(self) -> None:
        self.alphas = self.alphas_of(self.stats)
        self.recent_k = self.recent_k or float(self.max_lookahead)  # until rounds say otherwise

    def alpha(self, row: Row) -> float:
        return self.alphas.alpha(row)

    def drafts_with_model(self, row: Row) -> bool:
        """Whether the row's drafts this round cost draft-model work (its rows, passes, lag)."""
        return self.round_cost.uses_draft_model and self.alphas.uses_model(row)

    def index_lag(self, row: Row, kind: str | None = None) -> int:
        """Tokens the row's drafter (or `kind`) must index before drafting for it: a suffix drafter's
        catch-up, priced as host time (`RoundCostModel`); 0 for drafters that keep no index."""
        if kind is None:
            kinds = self.drafter_kinds
            kind = row.drafter if row.drafter in kinds else kinds[0] if kinds else ""
        return index_lag(row) if kind in self.indexing_drafter_kinds else 0

    def typical_k(self, row: Row) -> int:
        """The lookahead a row will likely get: its last k, else what rows get lately."""
        return row.last_k if row.accept_history else round(self.recent_k)

    def tokens_per_round(self, row: Row) -> float:
        return expected_tokens(self.alpha(row), self.typical_k(row))

    def observe_plan(self, plan: RoundPlan, num_running: int, smoothing: float = 0.2) -> None:
        """The first decode plan replaces the initial k̂ (max_lookahead, a guess) outright: smoothed
        from it, an adaptive policy planning k = 0 still read as k̂ ≥ 1 for a dozen rounds, and
        admission priced every row it considered at that k (at batch 128 it held 14 prompts back
        for 12 rounds, their tail then ran at a small batch)."""
        self.num_running = num_running
        self.num_plans += 1
        if plan.decode:
            mean_k = sum(k for _, k in plan.decode) / len(plan.decode)
            weight = smoothing if self.num_decode_plans else 1.0
            self.recent_k += weight * (mean_k - self.recent_k)
            self.num_decode_plans += 1

    def alphas_of(self, stats: AcceptanceStats) -> AlphaTracker:
        if len(self.drafter_kinds) < 2:
            return AlphaTracker(stats)
        return DrafterAlphas(stats, kinds=self.drafter_kinds, model_kinds=self.model_drafter_kinds)

    def observe_finish(self, row: Row) -> None:
        completion_s = self.now_s - row.arrival_s
        self.stats.observe_finish(row.domain, row.num_output_tokens, row.params.max_new_tokens, completion_s)
        self.alphas.forget(row)
