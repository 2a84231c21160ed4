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
    draft_gate: DraftGate | None = None  # measured speed with and without drafts (scheduler.learn_cost)
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

    def observe_round(self, record: RoundRecord, num_draft_prefill_rows: int) -> None:
        """A round ran: with learn_cost, its measured time refines the round-time model."""
        if self.cost_fit is not None and (refitted := self.cost_fit.observe(record, num_draft_prefill_rows)):
            self.round_cost.cost = refitted
        if self.draft_gate is not None:
            self.draft_gate.observe(record.num_committed, record.round_ms - record.warmup_ms)

    def observe_finish(self, row: Row) -> None:
        completion_s = self.now_s - row.arrival_s
        self.stats.observe_finish(row.domain, row.num_output_tokens, row.params.max_new_tokens, completion_s)
        self.alphas.forget(row)


@dataclass
class DraftGate:
    """Whether drafting pays, measured rather than predicted: rounds run in epochs of `epoch_rounds`,
    each either as the lookahead policy plans them (`drafts`) or with k = 0 for every row (`plain`),
    and each mode's committed tokens per millisecond is kept as a moving average over its epochs. An
    epoch runs the faster mode, except every `explore_every`-th, which runs the other, so a change in
    the batch or the drafter's acceptance is noticed. The first two epochs measure one of each. Plain
    decoding must be `margin` faster to be chosen: while the policy itself still keeps k near 0 (its
    draft cost not yet measured) the two modes tie, and only the drafting mode lets it learn.

    A cost model can be wrong in ways a refit does not fix (its features miss a cost, its k = 0
    prediction is an extrapolation from rounds that drafted); this bounds what a wrong belief costs:
    at most one epoch in `explore_every` runs the slower mode."""

    epoch_rounds: int = 16
    explore_every: int = 8
    smoothing: float = 0.5
    margin: float = 0.03
    rates: dict[bool, float] = field(default_factory=dict, init=False)  # drafts? -> tokens per ms
    drafts: bool = field(default=True, init=False)  # the mode of the current epoch
    num_epochs: int = field(default=0, init=False)
    _tokens: int = field(default=0, init=False)  # the current epoch's so far
    _ms: float = field(default=0.0, init=False)
    _rounds: int = field(default=0, init=False)

    def observe(self, num_committed: int, round_ms: float) -> None:
        self._tokens, self._ms, self._rounds = self._tokens + num_committed, self._ms + round_ms, self._rounds + 1
        if self._rounds < self.epoch_rounds or self._ms <= 0:
            return
        rate = self._tokens / self._ms
        old = self.rates.get(self.drafts)
        self.rates[self.drafts] = rate if old is None else old + self.smoothing * (rate - old)
        self._tokens, self._ms, self._rounds = 0, 0.0, 0
        self.num_epochs += 1
        if len(self.rates) < 2:
            self.drafts = not self.drafts
            return
        best = self.rates[True] * (1 + self.margin) >= self.rates[False]
        self.drafts = best if self.num_epochs % self.explore_every else not best
