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
            cost = self.round_cost.cost  # the draft cache filled beside a prefill: drafting's, at the model's price
            draft_prefill_ms = (cost.draft_passes + cost.draft_rows * num_draft_prefill_rows
                                if num_draft_prefill_rows else 0.0)
            learning = self.cost_fit is not None and not self.cost_fit.knows_draft_cost
            self.draft_gate.observe(record.num_committed, record.round_ms - record.warmup_ms - record.prefill_ms
                                    + draft_prefill_ms, learning)

    def observe_finish(self, row: Row) -> None:
        completion_s = self.now_s - row.arrival_s
        self.stats.observe_finish(row.domain, row.num_output_tokens, row.params.max_new_tokens, completion_s)
        self.alphas.forget(row)


@dataclass
class DraftGate:
    """Whether drafting pays, measured rather than predicted: rounds run in epochs of `epoch_rounds`
    decode rounds, each either as the lookahead policy plans them (`drafts`) or with k = 0 for every
    row (`plain`), and each mode's committed tokens per millisecond of decoding is kept as a moving
    average over its epochs. Decoding only: a prefill costs the same in either mode, and how many
    fall in an epoch is chance that would swamp the difference; the draft cache a drafting epoch
    fills beside a prefill is drafting's cost and is counted (`observe`).

    An epoch runs the faster mode, except that the other is explored after `explore_after` epochs,
    an interval that doubles (up to `max_explore_after`) each time exploring confirms the choice and
    starts again when it does not, so a drafter that clearly loses (or wins) costs little exploring,
    and a change in the batch or the drafter's acceptance is still noticed. The first two epochs
    measure one of each. Ties go to plain decoding (drafting must be `margin` faster), except while
    the round-time model has not yet measured drafting (`learning`): then the policy keeps k near 0,
    the modes tie, and only the drafting mode lets it learn.

    A cost model can be wrong in ways a refit does not fix (its features miss a cost, its k = 0
    prediction is an extrapolation from rounds that drafted); this bounds what a wrong belief costs."""

    epoch_rounds: int = 16
    min_explore_after: int = 2
    max_explore_after: int = 32
    smoothing: float = 0.5
    margin: float = 0.03
    rates: dict[bool, float] = field(default_factory=dict, init=False)  # drafts? -> tokens per ms
    drafts: bool = field(default=True, init=False)  # the mode of the current epoch
    explore_after: int = field(init=False)  # epochs in the chosen mode before the other is explored
    _since_explored: int = field(default=0, init=False)  # epochs in the chosen mode since
    _choice: bool | None = field(default=None, init=False)  # the chosen mode before an exploring epoch
    _tokens: int = field(default=0, init=False)  # the current epoch's so far
    _ms: float = field(default=0.0, init=False)
    _rounds: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.explore_after = self.min_explore_after

    def observe(self, num_committed: int, decode_ms: float, learning: bool = False) -> None:
        """One round's committed tokens and decoding time; `learning`: drafting's cost not yet measured."""
        if num_committed == 0 or decode_ms <= 0:
            return  # a round of prefills only
        self._tokens, self._ms, self._rounds = self._tokens + num_committed, self._ms + decode_ms, self._rounds + 1
        if self._rounds < self.epoch_rounds:
            return
        rate = self._tokens / self._ms
        old = self.rates.get(self.drafts)
        self.rates[self.drafts] = rate if old is None else old + self.smoothing * (rate - old)
        self._tokens, self._ms, self._rounds = 0, 0.0, 0
        if len(self.rates) < 2:
            self.drafts = not self.drafts
            return
        if learning:
            best = self.rates[True] * (1 + self.margin) >= self.rates[False]
        else:
            best = self.rates[True] >= self.rates[False] * (1 + self.margin)
        if self._choice is not None:  # an exploring epoch ended
            confirmed = best == self._choice
            self.explore_after = min(2 * self.explore_after, self.max_explore_after) if confirmed \
                else self.min_explore_after
            self._choice, self._since_explored = None, 0
        self._since_explored += 1
        if self._since_explored > self.explore_after:
            self._choice, self.drafts = best, not best
        else:
            self.drafts = best
