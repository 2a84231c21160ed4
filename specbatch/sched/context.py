"""What policies may read besides the rows: the round-time model, measured statistics, limits and a
little recent state the scheduler updates once per round. One object, shared by the scheduler and
every policy built for it, so the simulator and the real engine give policies the same view."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field

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
    num_decode_plans: int = 0  # plans with decode rows so far
    num_plans: int = 0  # plans made so far: a version for per-round caches
    cost_fit: OnlineCostFit | None = None  # refits round_cost on the rounds run (scheduler.learn_cost)
    drafting: bool = True  # whether the last round with decode rows drafted for any of them
    draft_gate: DraftGate | None = None  # measured speed with and without drafts (scheduler.learn_cost)
    # plans without drafts between probes while cost_fit does not know drafting's cost: a probe costs
    # one row's draft pass, and until 4 have run the policy solves every plan (at batch 128, a 125-round
    # job spent 64 plans learning with probes every 16th, planning 3x what plain decoding plans)
    probe_every: int = 4
    plans_without_drafts: int = 0  # decode plans since one drafted or probed
    full_catch_up_ms: float = 0.0  # predicted time to fill a comparing gate's last rows' draft caches from empty
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
            self.drafting = any(k > 0 for _, k in plan.decode)
            self.plans_without_drafts = 0 if self.drafting or plan.probe is not None else self.plans_without_drafts + 1
            if self.draft_gate is not None and self.draft_gate.comparing:  # what its decision reads
                self.full_catch_up_ms = self.round_cost.draft_row_ms * sum(row.num_tokens for row, _ in plan.decode)

    @property
    def wants_draft_probe(self) -> bool:
        """Whether a plan without drafts should time a draft pass (`RoundPlan.probe`): the round-time
        model learns on the run and has not measured the draft model, and a policy that believes
        drafts too dear would never draft for it to measure."""
        fit = self.cost_fit
        return fit is not None and not fit.knows_draft_cost and self.plans_without_drafts >= self.probe_every

    def observe_round(self, record: RoundRecord, num_draft_prefill_rows: int, draft_prefill_ms: float = 0.0) -> None:
        """A round ran: with learn_cost, its measured time refines the round-time model. The draft
        cache it filled beside its prefill (`num_draft_prefill_rows` in `draft_prefill_ms`, part of
        the record's prefill time) is a cost of drafting, whichever mode the round ran in."""
        if self.cost_fit is not None and (refitted := self.cost_fit.observe(record, num_draft_prefill_rows,
                                                                                  draft_prefill_ms)):
            self.round_cost.cost = refitted
        if self.draft_gate is not None:
            learning = self.cost_fit is not None and not self.cost_fit.knows_draft_cost
            round_ms = record.round_ms - record.warmup_ms - draft_prefill_ms  # the fill: charge_drafting
            self.draft_gate.observe(record.num_decode_rows, record.num_committed, round_ms, learning,
                                    self.full_catch_up_ms, record.num_prefill_rows)
            self.draft_gate.charge_drafting(draft_prefill_ms)

    def observe_finish(self, row: Row) -> None:
        completion_s = self.now_s - row.arrival_s
        self.stats.observe_finish(row.domain, row.num_output_tokens, row.params.max_new_tokens, completion_s)
        self.alphas.forget(row)


@dataclass
class _ModeSums:
    """A mode's rounds in one comparison: tokens per ms as a ratio estimate, with its standard error."""

    tokens: float = 0.0
    ms: float = 0.0
    rounds: float = 0.0
    tokens_sq: float = 0.0
    tokens_ms: float = 0.0
    ms_sq: float = 0.0

    def add(self, tokens: float, ms: float) -> None:
        self.tokens += tokens
        self.ms += ms
        self.rounds += 1
        self.tokens_sq += tokens**2
        self.tokens_ms += tokens * ms
        self.ms_sq += ms**2

    def decayed(self, weight: float) -> _ModeSums:
        """The same rate from `weight` times the evidence: what an older comparison still says."""
        return _ModeSums(*(weight * value for value in astuple(self)))

    @property
    def rate(self) -> float:
        return self.tokens / self.ms if self.ms > 0 else 0.0

    @property
    def variance(self) -> float:
        """Of the ratio estimate: Σ(tᵢ − R·mᵢ)² / (n − 1) · n / (Σm)² (the delta method)."""
        if self.rounds < 2:
            return float("inf")
        r = self.rate
        residual = max(self.tokens_sq - 2 * r * self.tokens_ms + r * r * self.ms_sq, 0.0)
        return residual / (self.rounds - 1) * self.rounds / self.ms**2


@dataclass
class DraftGate:
    """Whether drafting pays, measured rather than predicted, side by side: a *comparison* alternates
    blocks of `block_rounds` decode rounds as the lookahead policy plans them (drafting) and with
    k = 0 for every row (plain); the faster mode by committed tokens per millisecond of decoding then
    runs alone for an *interval* of rounds, and the next comparison follows. Alternating in short
    blocks is what makes the comparison fair on a machine whose speed drifts by a third within
    seconds: both modes meet the same drift, where modes timed in epochs apart met different machines
    (an earlier gate sent a fifth of a batch-1 job's rounds to plain decoding where drafting paid
    1.3×). The first drafting round of a block is not counted: it catches the draft cache up on what
    the plain rounds before it committed, a cost paid once per switch, not per round (alternating
    single rounds, every drafting round paid it, and at batch 32 it made k = 1 tie with plain
    decoding where k = 2 beat it by 9%). A comparison ends once each mode has `min_compare_rounds`
    rounds and the two rates differ by `z` standard errors (a clear winner costs a few rounds), or
    each has 1/`max_compare_share` of the interval before it in rounds (a near tie): at batch 1 a
    drafting round commits 1 to 3 tokens, 3 standard errors took dozens of rounds per mode, and a
    16-prompt job spent half its rounds comparing a 1.3x winner; a wrong call on the point estimate
    costs at most the next interval, which is as short as the comparison was. The cap is in rounds,
    not rows: the machine's drift is per round whatever the batch, and a cap of 64 decode rows ended
    every batch-32 comparison after 2 rounds per mode, which sent a job where drafting paid 1.1x to
    plain decoding in some runs and not in others. Earlier
    comparisons count too, at `memory` times their weight per comparison since: each is fair in
    itself, and while the winner stays the same a comparison then ends after `min_compare_rounds`,
    a few plain rounds per interval where drafting clearly pays (at batch 1 a drafting round's
    tokens vary by 40%). Prefills count, in the round they fall in: where a pass costs what its
    launches cost (a GPU's host-bound passes), drafting finishes rows in fewer rounds and their
    prefills share passes, and timing decoding alone priced drafting at 1.09x plain decoding where
    it ran jobs 1.22x faster (the simulator, batch 128, H200-like round costs), close enough for
    rounds swinging by 10-30% to settle plain decoding in 4 of 8 jobs. Counted so, the blocks
    overstate drafting there (1.45x), and plain blocks meet prefills the drafting blocks before
    them caused; charging each prefill to the round before instead measured the same and settled
    no better. The draft cache filled beside a prefill is charged to drafting (`charge_drafting`).
    Except the job's first admissions: every slot fills at once, a burst no mode caused, so the
    first comparison starts with the first decode round that prefills nothing (or after
    `max_start_wait` rounds, where every round prefills).

    The interval doubles from `min_interval` to `max_interval` rounds while comparisons confirm the
    choice and starts again when one does not, so a clear winner costs little comparing and a change
    in the batch or the drafter's acceptance is still noticed. Ties go to plain decoding (drafting
    must be `margin` faster). Nothing is compared while the round-time model has not yet measured
    drafting (`learning`): a policy that believes drafts too dear keeps k near 0 and probes, and
    its drafting would show only the draft cache's cost, never what drafts are worth.

    Plain rounds leave the draft caches behind, and a row that joined during them has none: a
    comparison after plain decoding starts by catching up what amounts to every row's whole context
    (at batch 32, 3,078 draft rows in one 260 ms round, a tenth of the 64 plain rounds before it and
    5% of a 220-round job, whatever the comparison then finds). So after a plain choice the interval
    is at least long enough that this catch-up (`catch_up_ms`, priced from empty caches) costs
    1/`catch_up_share` of the interval's plain decoding; the draft model's price is what makes it
    long at large batches, an n-gram drafter has no catch-up.

    A cost model can be wrong in ways a refit does not fix (its features miss a cost, its k = 0
    prediction is an extrapolation from rounds that drafted); this bounds what a wrong belief costs."""

    min_compare_rounds: int = 2
    max_compare_share: int = 8
    block_rounds: int = 3
    z: float = 3.0
    min_interval: int = 64
    max_interval: int = 2048
    margin: float = 0.03
    memory: float = 0.5
    catch_up_share: int = 32
    max_start_wait: int = 64  # decode rounds the first comparison waits for the first round without prefills
    drafts: bool = field(default=True, init=False)  # the mode of the next decode round
    choice: bool | None = field(default=None, init=False)  # the last comparison's winner
    interval: int = field(init=False)  # rounds the winner runs alone before the next comparison
    comparing: bool = field(default=False, init=False)  # (the first starts once `learning` ends)
    _left: int = field(default=0, init=False)  # rounds left in the interval
    _sums: dict[bool, _ModeSums] = field(init=False)  # this comparison's and, decayed, earlier ones'
    _compared: dict[bool, int] = field(init=False)  # rounds in this comparison, per mode
    _skip_drafting: bool = field(default=True, init=False)  # the next drafting round catches up
    _block: int = field(default=0, init=False)  # rounds of the current mode in this comparison
    _catch_up_ms: float = field(default=0.0, init=False)  # the latest catch_up_ms observed
    _started: bool = field(default=False, init=False)  # whether the job's first admissions are over
    _waited: int = field(default=0, init=False)  # decode rounds seen before that

    def __post_init__(self) -> None:
        self.interval = self.min_interval
        self._sums = {True: _ModeSums(), False: _ModeSums()}
        self._compared = {True: 0, False: 0}

    def observe(self, num_rows: int, num_committed: int, round_ms: float, learning: bool = False,
                catch_up_ms: float = 0.0, num_prefill_rows: int = 0) -> None:
        """One round's decode rows, committed tokens and time (its prefill included, its draft cache
        fill not); `learning`: drafting's cost not yet measured; `catch_up_ms`: what filling the
        batch's draft caches from empty would cost; `num_prefill_rows`: rows the round prefilled."""
        self._catch_up_ms = catch_up_ms
        if num_rows == 0 or num_committed == 0 or round_ms <= 0:
            return  # a round of prefills only
        if learning:
            self.drafts = True  # let the policy's drafts and the probes measure drafting before anything compares it
            return
        if not self._started:
            # the job's first admissions fill every slot at once: a burst of prefills neither mode
            # caused, which fell in the first plain block (at batch 128, two rounds of 45 prompts made
            # plain decoding look slower than n-gram drafting, which then ran 56 rounds at 3.7 tokens
            # per ms where the plain rounds around them ran 5.2)
            self._waited += 1
            if num_prefill_rows and self._waited < self.max_start_wait:
                return
            self._started = True
        if not self.comparing:
            self._left -= 1
            if self._left <= 0:
                self._skip_drafting = not self.drafts  # after plain rounds the draft cache lags
                self.comparing, self.drafts = True, not self.drafts
            return
        if self.catches_up:
            self._skip_drafting = False
        else:
            self._sums[self.drafts].add(num_committed, round_ms)
            self._compared[self.drafts] += 1
        self._block += 1
        if self._settled():
            self._decide()
        elif self._block >= self.block_rounds:
            self._block, self._skip_drafting = 0, not self.drafts
            self.drafts = not self.drafts

    @property
    def catches_up(self) -> bool:
        """Whether the next round is the first to draft after plain rounds (or at all): the draft cache
        lags by what they committed (by whole prompts, for rows that joined meanwhile), a catch-up
        paid once for every round drafting may then run, not spread over a few."""
        return self.drafts and self._skip_drafting

    def charge_drafting(self, ms: float) -> None:
        """Time only drafting needs but that fell outside decoding (the draft cache filled beside a
        prefill, in a round of either mode): drafting alone would fill it for every prefill, plain
        decoding never, so while comparing drafting is charged its counted rounds' share of it (2 of
        every 6 rounds with blocks of 3: prefills fall in rounds of either mode alike)."""
        if self.comparing and ms > 0:
            self._sums[True].ms += ms * (self.block_rounds - 1) / (2 * self.block_rounds)

    def rate(self, drafts: bool) -> float:
        """Committed tokens per ms in a mode, over the comparisons so far."""
        return self._sums[drafts].rate

    def _settled(self) -> bool:
        drafting, plain = self._sums[True], self._sums[False]
        if min(self._compared.values()) < self.min_compare_rounds:
            return False
        if min(self._compared.values()) >= self.interval // self.max_compare_share:
            return True
        gap = abs(drafting.rate - plain.rate) - self.margin * plain.rate
        return gap > self.z * (drafting.variance + plain.variance) ** 0.5

    def _repaying_interval(self) -> int:
        """Plain rounds whose time the next comparison's catch-up is 1/catch_up_share of."""
        plain = self._sums[False]
        return math.ceil(self._catch_up_ms * self.catch_up_share * plain.rounds / plain.ms) if plain.ms > 0 else 0

    def _decide(self) -> None:
        best = self.rate(True) >= self.rate(False) * (1 + self.margin)
        confirmed = best == self.choice
        self.interval = min(2 * self.interval, self.max_interval) if confirmed else self.min_interval
        if not best:
            self.interval = max(self.interval, min(self._repaying_interval(), self.max_interval))
        self.choice = self.drafts = best
        self.comparing, self._left, self._block = False, self.interval, 0
        self._sums = {mode: sums.decayed(self.memory) for mode, sums in self._sums.items()}
        self._compared = {True: 0, False: 0}
