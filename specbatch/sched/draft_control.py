"""Does this round draft, and which row probes: the adaptive controller of drafting.

`DraftControl` is the one object that decides, per round, what the lookahead policy may draft and
what the round-time model still has to measure. It owns the online cost fit (`OnlineCostFit`), the
draft gate (`DraftGate`) and the probe state. The scheduler calls `probe_row` and `observe_plan`
when it plans and `observe_round` when a round has run; policies read `drafts_this_round` and the
gate's state. Without a cost fit and a gate (fixed k, `learn_cost=false`) it always drafts and
never probes. The measurements behind these rules are in benchmarks/README.md ("The draft gate and
probes: why the rules are what they are").
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field

from specbatch.config import MAX_LOOKAHEAD
from specbatch.core import RoundPlan, Row
from specbatch.records import RoundRecord
from specbatch.sched.online_cost import OnlineCostFit
from specbatch.sched.pass_profile import no_alpha_pays
from specbatch.sched.roundcost import RoundCostModel, draft_lag


@dataclass
class DraftControl:
    """Drafting's switch and its measurements, for one scheduler.

    Rules: a plan without drafts *probes* (`RoundPlan.probe`: the draft model drafts one unverified
    token for one row) once `probe_every` such plans ran while the cost fit has not measured the
    draft model; the probed row alternates between the row whose draft cache lags least and the one
    that lags most. With a gate, its mode decides whether the policy drafts this round.
    Invariant: a probe never changes a row's output (its token is not verified)."""

    cost_fit: OnlineCostFit | None = None  # refits the round-time model on the rounds run (scheduler.learn_cost)
    gate: DraftGate | None = None  # measured speed with and without drafts (scheduler.learn_cost)
    drafting: bool = False  # whether the last round with decode rows drafted for any of them (none yet)
    # plans without drafts between probes while cost_fit does not know drafting's cost
    probe_every: int = 4
    plans_without_drafts: int = 0  # decode plans since one drafted or probed
    full_catch_up_ms: float = 0.0  # predicted time to fill a comparing gate's last rows' draft caches from empty
    prefill_ms: float = 0.0  # what the last plan's prefill chunks add to its round, predicted (draft fill aside)
    num_probes: int = 0  # draft probes planned so far (`probe_row` alternates on it)

    @property
    def drafts_this_round(self) -> bool:
        """Whether the lookahead policy may draft: always, unless the gate runs plain decoding."""
        return self.gate is None or self.gate.drafts

    @property
    def wants_probe(self) -> bool:
        """Whether a plan without drafts should time a draft pass: the round-time model learns on the
        run and has not measured the draft model (a policy that believes drafts too dear would never
        draft for it to measure)."""
        fit = self.cost_fit
        return fit is not None and not fit.knows_draft_cost and self.plans_without_drafts >= self.probe_every

    def probe_row(self, plan: RoundPlan, round_cost: RoundCostModel | None = None) -> Row | None:
        """The row a plan without drafts probes for, if it should probe: by turns the one whose draft
        cache lags least (the cheapest probe) and the one that lags most (probes of one lag alone
        cannot tell a draft pass's price from a row's). Never where `round_cost` says that drafts
        always accepted and free to draft could not beat plain decoding by the gate's margin (the
        verify pass alone is too dear: no α could pay, so drafting's price need not be learnt)."""
        if not plan.decode or not self.wants_probe or any(k for _, k in plan.decode):
            return None
        starts = [row.num_computed for row, _ in plan.decode]
        margin = self.gate.margin if self.gate is not None else 0.0  # what drafting must win by to be chosen
        if round_cost is not None and no_alpha_pays(round_cost, starts, MAX_LOOKAHEAD, False, margin):
            return None
        self.num_probes += 1
        return (min if self.num_probes % 2 else max)((row for row, _ in plan.decode), key=draft_lag)

    def observe_plan(self, plan: RoundPlan, round_cost: RoundCostModel) -> None:
        """A plan was made: whether it drafts, how long since one drafted or probed, and (while the
        gate compares) what filling its rows' draft caches from empty would cost, and what its prefills
        add to the round."""
        if self.gate is not None:
            self.prefill_ms = round_cost.prefill_ms(plan.prefill, draft=False)
        if not plan.decode:
            return
        self.drafting = any(k > 0 for _, k in plan.decode)
        self.plans_without_drafts = 0 if self.drafting or plan.probe is not None else self.plans_without_drafts + 1
        if self.gate is not None and self.gate.comparing:  # what its decision reads
            self.full_catch_up_ms = round_cost.draft_position_ms * sum(row.num_tokens for row, _ in plan.decode)

    def observe_round(self, record: RoundRecord, round_cost: RoundCostModel, num_draft_prefill_positions: int,
                      draft_prefill_ms: float = 0.0) -> None:
        """A round ran: with a cost fit, its measured time refines `round_cost`; with a gate, the round
        counts for its mode. The draft cache it filled beside its prefill (`num_draft_prefill_positions`
        in `draft_prefill_ms`, part of the record's prefill time) is a cost of drafting, whichever
        mode the round ran in. The gate compares the round without what its prefills add (predicted,
        at most the pass's share by positions, `RoundRecord.prefill_ms`)."""
        if self.cost_fit is not None and (refitted := self.cost_fit.observe(record, num_draft_prefill_positions,
                                                                                  draft_prefill_ms)):
            round_cost.cost = refitted
        if self.gate is not None:
            learning = self.cost_fit is not None and not self.cost_fit.knows_draft_cost
            round_ms = record.round_ms - record.warmup_ms - draft_prefill_ms  # the fill: charge_drafting
            prefill_ms = min(self.prefill_ms, max(record.prefill_ms - draft_prefill_ms, 0.0))
            self.gate.observe(record.num_decode_rows, record.num_committed, round_ms, learning,
                              self.full_catch_up_ms, record.num_prefill_rows, prefill_ms, self.drafting,
                              record.num_proposed > 0)
            self.gate.charge_drafting(draft_prefill_ms)


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
    """Whether drafting pays, measured rather than predicted, side by side.

    A *comparison* alternates blocks of `block_rounds` decode rounds as the lookahead policy plans
    them (drafting) and with k = 0 for every row (plain), so that both modes meet the same machine.
    The first drafting round of a block (the draft cache's catch-up, paid once per switch) is not
    counted. A round counts less what its prefills add (the round-time model's price of their chunks,
    at most the pass's share by positions): every request is prefilled once in either mode, so both
    pay the same prefill per committed token and leaving it out cannot change which mode is faster.
    Counted whole, one 100-250 ms prefill in a 3-round block decided comparisons, and plain blocks
    met the prefills of rows the drafting blocks before them finished. The draft cache filled beside
    a prefill is charged to drafting (`charge_drafting`). The first comparison starts with the first
    decode round that prefills nothing (or after `max_start_wait` rounds): the job's first
    admissions are a burst no mode caused.

    A comparison ends once each mode has `min_compare_rounds` rounds and the two rates (committed
    tokens per ms) differ by `z` standard errors, or each has 1/`max_compare_share` of the interval
    before it in rounds (then the point estimate decides). The faster mode then runs alone for an
    *interval* that doubles from `min_interval` to `max_interval` rounds while comparisons confirm
    the choice and starts again when one does not. Ties go to plain decoding (drafting must be
    `margin` faster); a plain choice that drafting led, where the policy drafted and not as a trial,
    runs 1/`close_call_recheck` of the interval. A comparison whose drafting rounds have proposed
    nothing yet (lookups that found no match: a job's first rows, before their text repeats) has
    measured the lookups' price and not one draft, and two such rounds time alike: it settles only at
    its share of the interval (or as a trial), not by standard errors nor by drafting's budget: in the
    simulator, 1-row jobs of suffix, n-gram and draft rows settled such a first comparison for plain
    decoding within 2 rounds a mode and kept to it (issue 43's `sim_agreement.py`).
    Earlier comparisons count at `memory` times their weight per comparison since.
    After a plain choice the interval is at least long enough that the next comparison's catch-up
    (`catch_up_ms`, priced from empty caches) costs 1/`catch_up_share` of its plain decoding.
    Nothing is compared while the round-time model has not measured drafting (`learning`).
    Comparing has a price (issue 43): drafting's losses while comparing (its rounds' time, catch-ups
    included, beyond what plain decoding takes for their tokens) may cost `max_loss_share` of the
    engine time so far; past it a comparison drafting is losing by a standard error ends at once,
    and after a plain choice the next one waits until the share is back under. Where the policy's
    model prefers plain decoding, drafting rounds may draft a trial (`note_trial`), whose catch-ups cost a
    comparison at most a plain round in all (`trial_catch_up_ms`).

    Invariant: the gate only chooses between the policy's drafts and none; it never changes what a
    row outputs, and a wrong call costs at most the next interval."""

    min_compare_rounds: int = 2
    max_compare_share: int = 8
    block_rounds: int = 3
    z: float = 3.0
    min_interval: int = 64
    max_interval: int = 2048
    margin: float = 0.03
    # a plain choice that drafting led (by less than the margin) runs 1/this of the interval before the next
    # comparison (the catch-up still repaid): a drafter whose α rises as the job goes is checked again sooner
    close_call_recheck: int = 4
    memory: float = 0.5
    catch_up_share: int = 32
    max_start_wait: int = 64  # decode rounds the first comparison waits for the first round without prefills
    # drafting's losses while comparing (its rounds' time beyond what plain decoding would have taken for
    # their tokens) may cost at most this share of the engine time so far: past it a comparison that
    # drafting is losing ends at once, and after a plain choice none starts until the share is back under
    max_loss_share: float = 0.02
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
    _engine_ms: float = field(default=0.0, init=False)  # every round observed
    _loss_ms: float = field(default=0.0, init=False)  # drafting's losses in comparisons that ended
    _drafting: list[float] = field(default_factory=lambda: [0.0, 0.0], init=False)  # this comparison's (tokens, ms)
    _trial: bool = field(default=False, init=False)  # whether this comparison's drafts are a trial (`note_trial`)
    _drafted: bool = field(default=False, init=False)  # whether this comparison's drafting rounds planned drafts
    _proposed: bool = field(default=False, init=False)  # whether its counted drafting rounds proposed any
    # what this comparison's trials spent catching rows up, priced (`AdaptiveLookahead._trial`: a plain round in all)
    trial_catch_up_ms: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.interval = self.min_interval
        self._sums = {True: _ModeSums(), False: _ModeSums()}
        self._compared = {True: 0, False: 0}

    def observe(self, num_rows: int, num_committed: int, round_ms: float, learning: bool = False,
                catch_up_ms: float = 0.0, num_prefill_rows: int = 0, prefill_ms: float = 0.0,
                drafted: bool = True, proposed: bool = True) -> None:
        """One round's decode rows, committed tokens and time (its prefill included, its draft cache
        fill not); `learning`: drafting's cost not yet measured; `catch_up_ms`: what filling the
        batch's draft caches from empty would cost; `num_prefill_rows`: rows the round prefilled,
        `prefill_ms` what they added to its time (left out of the comparison); `drafted`: the round
        planned drafts for some row (a drafting block's round may plan none); `proposed`: some row's
        drafter proposed drafts (a lookup may find none)."""
        self._catch_up_ms = catch_up_ms
        self._engine_ms += max(round_ms, 0.0)
        round_ms -= prefill_ms
        if num_rows == 0 or num_committed == 0 or round_ms <= 0:
            return  # a round of prefills only
        if learning:
            self.drafts = True  # let the policy's drafts and the probes measure drafting before anything compares it
            return
        if not self._started:
            # the job's first admissions fill every slot at once: a burst of prefills neither mode caused
            self._waited += 1
            if num_prefill_rows and self._waited < self.max_start_wait:
                return
            self._started = True
        if not self.comparing:
            self._left -= 1
            if self._left <= 0 and self.choice is False and self.over_budget:
                self._left = self.interval  # drafting lost too much already: plain decoding a while longer
            elif self._left <= 0:
                self._skip_drafting = not self.drafts  # after plain rounds the draft cache lags
                self.comparing, self.drafts = True, not self.drafts
            return
        if self.drafts:  # its catch-up round too: drafting pays it
            self._drafting[0] += num_committed
            self._drafting[1] += round_ms
            self._drafted = self._drafted or drafted
        if self.catches_up:
            self._skip_drafting = False
        else:
            self._sums[self.drafts].add(num_committed, round_ms)
            self._compared[self.drafts] += 1
            self._proposed = self._proposed or (self.drafts and proposed)
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

    @property
    def over_budget(self) -> bool:
        """Whether drafting's comparison losses (this comparison's included) passed their share."""
        return self._loss_ms + self._comparison_loss_ms() > self.max_loss_share * self._engine_ms

    def _comparison_loss_ms(self) -> float:
        """This comparison's drafting rounds' time beyond plain decoding's for their tokens (without
        what prefills added: counted whole, one 245 ms round that prefilled three rows charged drafting
        191 ms, three times its budget in a 4.4 s job, which then never drafted again)."""
        plain_rate = self.rate(False)
        if plain_rate <= 0:
            return 0.0
        tokens, ms = self._drafting
        return max(0.0, ms - tokens / plain_rate)

    def note_trial(self) -> None:
        """The policy drafts in this comparison only because it compares (its round-time model prefers
        plain decoding, `AdaptiveLookahead._trial`): the comparison then ends once each mode has
        `min_compare_rounds`, its point estimate deciding: a trial checks the model rather than
        settling a close call, and where the model is right it is a loss."""
        self._trial = True

    def _settled(self) -> bool:
        drafting, plain = self._sums[True], self._sums[False]
        fewest = min(self._compared.values())
        if fewest < self.min_compare_rounds:
            return False
        if self._trial:
            return True
        capped = fewest >= self.interval // self.max_compare_share
        if not self._proposed:  # drafting not measured yet: only the share cap ends it
            return capped
        if self.over_budget and drafting.rate < plain.rate - (drafting.variance + plain.variance) ** 0.5:
            return True  # a comparison drafting is losing (by a standard error) stops at its price
        if capped:
            return True
        gap = abs(drafting.rate - plain.rate) - self.margin * plain.rate
        return gap > self.z * (drafting.variance + plain.variance) ** 0.5

    def _repaying_interval(self) -> int:
        """Plain rounds whose time the next comparison's catch-up is 1/catch_up_share of."""
        plain = self._sums[False]
        return math.ceil(self._catch_up_ms * self.catch_up_share * plain.rounds / plain.ms) if plain.ms > 0 else 0

    def _decide(self) -> None:
        self._loss_ms += self._comparison_loss_ms()
        self._drafting = [0.0, 0.0]
        best = self.rate(True) >= self.rate(False) * (1 + self.margin)
        confirmed = best == self.choice
        self.interval = min(2 * self.interval, self.max_interval) if confirmed else self.min_interval
        repaying = 0 if best else min(self._repaying_interval(), self.max_interval)
        self.interval = max(self.interval, repaying)
        self.choice = self.drafts = best
        self.comparing, self._left, self._block = False, self.interval, 0
        if not best and self.rate(True) > self.rate(False) and self._drafted and not self._trial:
            # drafting led, by less than the margin, where the policy drafted (a comparison of plain decoding
            # with itself, or a trial of the model's word, leads by noise alone)
            self._left = max(self.interval // self.close_call_recheck, repaying)
        self._sums = {mode: sums.decayed(self.memory) for mode, sums in self._sums.items()}
        self._compared = {True: 0, False: 0}
        self._trial = self._drafted = self._proposed = False
        self.trial_catch_up_ms = 0.0
