"""What policies may read besides the rows: the round-time model, measured statistics, limits and a
little recent state the scheduler updates once per round. One object, shared by the scheduler and
every policy built for it, so the simulator and the real engine give policies the same view."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbatch.core import RoundPlan, Row
from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sched.estimates import AcceptanceStats, AlphaTracker, expected_tokens
from specbatch.sched.online_cost import OnlineCostFit
from specbatch.sched.roundcost import RoundCostModel


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
    num_plans: int = 0  # plans made so far: a version for per-round caches
    cost_fit: OnlineCostFit | None = None  # refits round_cost on the rounds run (scheduler.learn_cost)
    drafting: bool = True  # whether the last round with decode rows drafted for any of them
    alphas: AlphaTracker = field(init=False)

    def __post_init__(self) -> None:
        self.alphas = AlphaTracker(self.stats)
        self.recent_k = self.recent_k or float(self.max_lookahead)  # until rounds say otherwise

    def alpha(self, row: Row) -> float:
        return self.alphas.alpha(row)

    def typical_k(self, row: Row) -> int:
        """The lookahead a row will likely get: its last k, else what rows get lately."""
        return row.last_k if row.accept_history else round(self.recent_k)

    def tokens_per_round(self, row: Row) -> float:
        return expected_tokens(self.alpha(row), self.typical_k(row))

    def observe_plan(self, plan: RoundPlan, num_running: int, smoothing: float = 0.2) -> None:
        self.num_running = num_running
        self.num_plans += 1
        if plan.decode:
            mean_k = sum(k for _, k in plan.decode) / len(plan.decode)
            self.recent_k += smoothing * (mean_k - self.recent_k)
            self.drafting = any(k > 0 for _, k in plan.decode)

    def observe_round(self, record: RoundRecord) -> None:
        """A round ran: with learn_cost, its measured time refines the round-time model."""
        if self.cost_fit is not None and (refitted := self.cost_fit.observe(record)) is not None:
            self.round_cost.cost = refitted

    def observe_finish(self, row: Row) -> None:
        completion_s = self.now_s - row.arrival_s
        self.stats.observe_finish(row.domain, row.num_output_tokens, row.params.max_new_tokens, completion_s)
        self.alphas.forget(row)
