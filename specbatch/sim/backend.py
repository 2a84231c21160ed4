"""SimBackend: executes the scheduler's round plans on a virtual clock, with no model.

It returns the same `RoundOutcome` as `HFBackend` and, like it, never writes a row, so the unchanged
`Engine` and the scheduler's commit step commit, stop and record it. What a model would decide comes from elsewhere:
- round time: the cost model's `predict_ms` over the round's passes, rows (padding included) and
  KV reads, with the pass shapes `HFBackend` would build (same buckets, same KV-length rounding),
  times a seeded mean-1 lognormal factor per round where `timing_noise` is set: a machine whose
  speed varies round to round, as a shared host's does, which decisions from measured timings
  must survive;
- accepted prefix: an acceptance model (per-request α per domain, and per drafter with a
  `DrafterAcceptance`, or replayed histories);
- tokens: a fixed fake token id, and `SIM_EOS_TOKEN_ID` at the request's output length when it
  ends by EOS, so the real `StopChecker` finishes it and discards what was accepted past it.

Draft work follows `DraftModelDrafter` exactly: one catch-up pass over each speculating row's
unfed tokens (1 after a rejection, 2 after a fully accepted block), then one pass per further
draft; the commit step rolls the draft cache back to the accepted prefix. n-gram and suffix drafting
cost the cost model's lookup host time: per row drafted for, and per token a suffix row's own index
takes (its tokens but the pending one, from where the row's index reached: its whole prompt the
first time), as `SuffixDrafter` reports them. A lookup finds a match with its drafter's
`lookup_match_rate` (drawn per row and round): then it offers its first draft and each further one up to
k with its `lookup_continue_rate` (a suffix drafter stops where its continuation's confidence drops:
on the bundled pair's held-out prompts it proposed 1 token of a planned 2 in 3 lookups of 4; n-gram
lookups offered the whole k), else none, and the row verifies its pending token alone, as a real
lookup that matches nothing does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from specbatch.config import INDEXING_DRAFTERS
from specbatch.core import PassShape, Proposals, RoundOutcome, RoundPlan, Row, RowOutcome
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.costmodel import CostModel
from specbatch.sched.roundcost import index_lag
from specbatch.sim.acceptance import AcceptanceModel, DomainAcceptance, DrafterAcceptance

SIM_EOS_TOKEN_ID = 0
SIM_TOKEN_ID = 1  # every other emitted or drafted token


class VirtualClock:
    """Seconds on a simulated worker; the engine reads it, the backend advances it."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


class SimBackend:
    def __init__(
        self,
        cost: CostModel,
        acceptance: AcceptanceModel | DrafterAcceptance,
        clock: VirtualClock,
        buckets: ShapeBuckets,
        max_kv_len: int,
        drafter_kind: str,
        outputs: Mapping[str, tuple[int, bool]],
        seed: int = 0,
        timing_noise: float = 0.0,
        worker_id: int = 0,
        drafter_alpha_scale: Mapping[str, float] | None = None,
        lookup_match_rate: Mapping[str, float] | None = None,
        lookup_continue_rate: Mapping[str, float] | None = None,
    ) -> None:
        """`outputs[request_id]` = (output tokens the request generates, whether the last is EOS);
        `max_kv_len` is a slot's length (context + max lookahead + 1), the KV-length ceiling;
        `timing_noise` the σ of the log of each round's speed factor (0: every round as priced).
        `drafter_kind` may name several drafters (`a,b`: each row drafts with `Row.drafter`); a row's
        α under drafter d is its α times `drafter_alpha_scale[d]` (1 if absent; `DomainAcceptance`), a
        lookup by drafter d finds a match with probability `lookup_match_rate[d]` (1 if absent) and then
        offers each draft after its first with probability `lookup_continue_rate[d]` (1 if absent)."""
        self.kinds = tuple(drafter_kind.split(","))
        if not all(kind in ("draft", "eagle", "ngram", "suffix", "none") for kind in self.kinds):
            raise ValueError(f"unknown drafter kind {drafter_kind!r}")
        self.model_kinds = frozenset(kind for kind in self.kinds if kind in ("draft", "eagle"))
        self.lookup_kinds = frozenset(kind for kind in self.kinds if kind in ("ngram", "suffix"))
        self._log_scales = {kind: math.log(scale) if scale > 0 else -math.inf
                            for kind, scale in (drafter_alpha_scale or {}).items()}
        self.cost, self.acceptance, self.clock, self.buckets = cost, acceptance, clock, buckets
        self.max_kv_len, self.outputs, self.seed = max_kv_len, outputs, seed
        self.match_rates = {kind: rate for kind, rate in (lookup_match_rate or {}).items()
                            if kind in self.lookup_kinds and rate < 1.0}
        self.continue_rates = {kind: rate for kind, rate in (lookup_continue_rate or {}).items()
                               if kind in self.lookup_kinds and rate < 1.0}
        self.match_rngs: dict[str, random.Random] = {}  # a lookup's draws, apart from the acceptance draws
        self.timing_noise = timing_noise  # checked where a user sets it (SimOptions)
        self._speed = random.Random(f"specbatch.sim.speed:{seed}:{worker_id}")
        self.uses_draft_model = bool(self.model_kinds)
        self.rngs: dict[str, random.Random] = {}
        self._drafts: dict[int, list[int]] = {}  # k -> k fake draft tokens
        # DomainAcceptance is drawn inline (the same draws as `accepted_prefix`, a third of the
        # cost): ln α per running request, 0.0 for α = 1 and -inf for α = 0
        self._log_alphas: dict[str, float] | None = {} if type(acceptance) is DomainAcceptance else None
        # a DrafterAcceptance too, per request and drafter
        self._drafter_log_alphas: dict[str, dict[str, float]] | None = None
        if isinstance(acceptance, DrafterAcceptance):
            if missing := set(self.kinds) - {"none"} - set(acceptance.drafters):
                raise ValueError(f"no acceptance model for drafter(s) {sorted(missing)}")
            self._drafter_log_alphas = {}

    def admit(self, row: Row) -> None:
        if row.request_id not in self.rngs:  # one stream per request: policies see the same draws
            self.rngs[row.request_id] = random.Random(f"specbatch.sim.accept:{self.seed}:{row.request_id}")
            if self.match_rates or self.continue_rates:
                self.match_rngs[row.request_id] = random.Random(f"specbatch.sim.match:{self.seed}:{row.request_id}")
        if self._log_alphas is not None:
            assert isinstance(self.acceptance, DomainAcceptance)
            alpha = self.acceptance.alpha(row.request_id, row.domain)
            self._log_alphas[row.request_id] = math.log(alpha) if alpha > 0 else -math.inf
        elif self._drafter_log_alphas is not None:
            assert isinstance(self.acceptance, DrafterAcceptance)
            alphas = {kind: self.acceptance.alpha(row.request_id, row.domain, kind) for kind in self.kinds
                      if kind != "none"}
            self._drafter_log_alphas[row.request_id] = {kind: math.log(a) if a > 0 else -math.inf
                                                        for kind, a in alphas.items()}

    def use_kv_blocks(self, kv: object) -> None:
        """Shared blocks cost nothing here: the scheduler counts them computed, so only the rest is
        prefilled and priced."""

    def release(self, row: Row, finished: bool) -> None:
        if finished:
            self.rngs.pop(row.request_id, None)
            self.match_rngs.pop(row.request_id, None)
            self.acceptance.release(row.request_id)
            if self._log_alphas is not None:
                self._log_alphas.pop(row.request_id, None)
            if self._drafter_log_alphas is not None:
                self._drafter_log_alphas.pop(row.request_id, None)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        outcome = RoundOutcome()
        if plan.prefill:
            outcome.prefill_shapes = [self._prefill_shape(plan.prefill)]
            outcome.num_draft_prefill_positions = self._draft_prefill_positions(plan.prefill, plan.draft_prefill)
        if plan.decode:
            starts = [plan.computed_after_prefill(row) for row, _ in plan.decode]
            drafted = [(row, plan.drafted_k(row, k)) for row, k in plan.decode]
            outcome.proposals = self._draft(drafted, starts, outcome.num_draft_prefill_positions > 0)
            outcome.rows, outcome.verify_shape = self._verify(plan.decode, starts, outcome.proposals)
        # one flat pass, but an EAGLE head drafts from the prefill's features, so it prefills apart
        apart = bool(plan.prefill) and bool(plan.decode) and "eagle" in self.kinds
        outcome.num_target_passes = int(bool(plan.prefill) or bool(plan.decode)) + int(apart)
        outcome.prefill_ms, outcome.draft_prefill_ms, outcome.draft_ms, outcome.verify_ms = self._split_ms(outcome)
        self.clock.advance((outcome.prefill_ms + outcome.draft_ms + outcome.verify_ms) / 1000)
        return outcome

    def _prefill_shape(self, work: list[tuple[Row, int]]) -> PassShape:
        return PassShape.flat([row.num_computed for row, _ in work], [size for _, size in work])

    def _draft_prefill_positions(self, work: list[tuple[Row, int]], draft_prefill: bool) -> int:
        """The drafter's cache is filled alongside, up to the same end, where it is current."""
        if not self.uses_draft_model or not draft_prefill:
            return 0
        return sum(row.num_computed + size - row.num_draft_computed for row, size in work if row.draft_is_current)

    def _draft(self, decode: list[tuple[Row, int]], starts: list[int], alongside: bool) -> Proposals:
        """Counts of the passes `DraftModelDrafter.propose` runs: pass 0 feeds each speculating
        row's unfed tokens (flat: no padding), pass j > 0 one draft to each row with
        k > j (no padding). A row prefilled this round has its draft cache filled to its start."""
        proposals = Proposals([], [], [0] * len(decode))
        self._lookup(decode, proposals)
        if not self.uses_draft_model:
            return proposals
        num_fed = max_k = further = 0
        for index, ((row, k), start) in enumerate(zip(decode, starts, strict=True)):
            if k > 0 and self._drafts_with_model(row):
                draft_start = RoundPlan.draft_start(row, start, alongside)
                fed = len(row.token_ids) - draft_start
                num_fed, further = num_fed + fed, further + k - 1
                if k > max_k:
                    max_k = k
                proposals.num_fed[index] = fed + k - 1
        proposals.num_draft_positions = num_fed + further
        proposals.num_padded_draft_positions = 0  # flat passes pad no row
        proposals.num_passes = max_k
        return proposals

    def _lookup(self, decode: list[tuple[Row, int]], proposals: Proposals) -> None:
        """What n-gram and suffix drafting would report: rows drafted for, and a suffix row's own index
        brought up to all its tokens but the pending one."""
        if not self.lookup_kinds:
            return
        proposals.indexed_to = [0] * len(decode)
        for index, (row, k) in enumerate(decode):
            kind = self._kind(row)
            if k <= 0 or kind not in self.lookup_kinds:
                continue
            proposals.num_lookup_rows += 1
            if kind in INDEXING_DRAFTERS:
                proposals.indexed_to[index] = len(row.token_ids) - 1
                proposals.num_indexed_tokens += index_lag(row)

    def _verify(self, decode: list[tuple[Row, int]], starts: list[int], proposals: Proposals
                ) -> tuple[list[RowOutcome], PassShape]:
        # the hot loop of a simulation (one iteration per row per round): properties inlined
        num_accepted_of, rngs, outputs = self.acceptance.num_accepted, self.rngs, self.outputs
        log_alphas, drafts, log, num_fed = self._log_alphas, self._drafts, math.log, proposals.num_fed
        indexed_to, match_rates, drafter_log_alphas = proposals.indexed_to, self.match_rates, self._drafter_log_alphas
        continue_rates = self.continue_rates
        outcomes = []
        max_end = num_positions = max_len = wide_kv = 0
        for index, (row, planned_k) in enumerate(decode):
            request_id, position = row.request_id, len(row.token_ids) - row.num_prompt_tokens
            k = planned_k
            if k and match_rates and self.match_rngs[request_id].random() >= match_rates.get(self._kind(row), 1.0):
                k = 0  # the lookup found no match: nothing to verify but the pending token
            elif k > 1 and continue_rates and (rate := continue_rates.get(self._kind(row))) is not None:
                draws, k = self.match_rngs[request_id], 1
                while k < planned_k and draws.random() < rate:
                    k += 1  # the match goes on
            if starts[index] + 1 + k > max_end:
                max_end = starts[index] + 1 + k
            if k >= max_len:
                max_len = 1 + k
            num_positions += 1 + k
            if k:
                wide_kv += starts[index] + 1 + k
            if drafter_log_alphas is not None:  # as below, under the row's drafter
                u, log_alpha = 1.0 - rngs[request_id].random(), drafter_log_alphas[request_id].get(self._kind(row), 0.0)
                num_accepted = k if log_alpha == 0.0 else min(k, int(log(u) / log_alpha))
            elif log_alphas is None:
                num_accepted = num_accepted_of(request_id, row.domain, position, k, rngs[request_id])
            else:  # accepted_prefix: X = min(k, floor(ln U / ln α)), U in (0, 1]
                u, log_alpha = 1.0 - rngs[request_id].random(), log_alphas[request_id]
                if self._log_scales:
                    log_alpha = min(0.0, log_alpha + self._log_scales.get(self._kind(row), 0.0))
                num_accepted = k if log_alpha == 0.0 else min(k, int(log(u) / log_alpha))
            num_output_tokens, ends_with_eos = outputs[request_id]
            eos_at = num_output_tokens - 1 - position  # index of EOS among this round's tokens
            emitted = [SIM_TOKEN_ID] * (num_accepted + 1)
            if ends_with_eos and 0 <= eos_at <= num_accepted:
                emitted[eos_at] = SIM_EOS_TOKEN_ID
            proposed = drafts.get(k) or drafts.setdefault(k, [SIM_TOKEN_ID] * k)  # shared, never mutated
            outcomes.append(RowOutcome(row, planned_k, proposed, num_accepted, emitted, num_fed[index],
                                       num_indexed=indexed_to[index] if indexed_to else 0))
        return outcomes, PassShape(len(decode), len(decode), max_len, max_end, num_positions, flat_padded_positions=0,
                                   flat_kv_tokens_read=sum(starts) + num_positions, flat_wide_kv_tokens_read=wide_kv)

    def _kind(self, row: Row) -> str:
        return row.drafter if row.drafter in self.kinds else self.kinds[0]

    def _drafts_with_model(self, row: Row) -> bool:
        return self._kind(row) in self.model_kinds

    def _split_ms(self, outcome: RoundOutcome) -> tuple[float, float, float, float]:
        """(prefill, draft prefill, draft, verify) ms, booked as the real backend times them: the draft
        cache filled alongside the prefill is part of the prefill's time, the intercept of verify's.
        Same features as `CostModel.fit` reads from a rounds table: rows include padding."""
        c = self.cost
        prefill = verify = draft = 0.0
        draft_prefill = (c.draft_passes + c.draft_rows * outcome.num_draft_prefill_positions
                         if outcome.num_draft_prefill_positions else 0.0)
        if outcome.prefill_shapes:
            prefill = sum(_pass_ms(c, shape) for shape in outcome.prefill_shapes) + draft_prefill
        if outcome.verify_shape is not None:
            verify = _pass_ms(c, outcome.verify_shape)
        # prefill chunks and verify windows in one flat pass pay one pass's price, not two
        num_shares = len(outcome.prefill_shapes) + int(outcome.verify_shape is not None)
        prefill -= c.target_passes * (num_shares - outcome.num_target_passes)
        if (proposals := outcome.proposals) is not None:
            draft = (c.draft_passes * proposals.num_passes
                     + c.draft_rows * (proposals.num_draft_positions + proposals.num_padded_draft_positions)
                     + c.lookup_ms(proposals.num_lookup_rows, proposals.num_indexed_tokens))
        scale = self._round_speed()
        return prefill * scale, draft_prefill * scale, draft * scale, (c.intercept_ms + verify) * scale

    def _round_speed(self) -> float:
        """This round's time factor: exp(N(−σ²/2, σ)), whose mean is 1, so noise moves no policy's
        expected time, only what a few rounds' timings say about it."""
        if not self.timing_noise:
            return 1.0
        return math.exp(self._speed.gauss(-self.timing_noise**2 / 2, self.timing_noise))


def _pass_ms(cost: CostModel, shape: PassShape) -> float:
    return (cost.target_passes + cost.target_rows * (shape.num_real_positions + shape.num_padded_positions)
            + cost.kv_tokens_read * shape.num_kv_tokens_read + cost.wide_kv_tokens_read * shape.num_wide_kv_tokens_read)


def sim_decode(token_ids: list[int]) -> str:
    """Simulated requests have no text."""
    return ""

