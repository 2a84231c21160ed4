"""SimBackend: executes the scheduler's round plans on a virtual clock, with no model.

It returns the same `RoundOutcome` as `HFBackend`, so the unchanged `Engine` commits, stops and
records it. What a model would decide comes from elsewhere:
- round time: the cost model's `predict_ms` over the round's passes, rows (padding included) and
  KV reads, with the pass shapes `HFBackend` would build (same buckets, same KV-length rounding);
- accepted prefix: an acceptance model (per-request α per domain, or replayed histories);
- tokens: a fixed fake token id, and `SIM_EOS_TOKEN_ID` at the request's output length when it
  ends by EOS, so the real `StopChecker` finishes it and discards what was accepted past it.

Draft work follows `DraftModelDrafter` exactly: one catch-up pass over each speculating row's
unfed tokens (1 after a rejection, 2 after a fully accepted block), then one pass per further
draft; after verification the draft cache rolls back to the accepted prefix. n-gram drafting
costs nothing here and always offers k drafts (the acceptance model covers lookup misses).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from specbatch.engine.backend import RoundOutcome, RowOutcome
from specbatch.engine.drafters import Proposals
from specbatch.engine.forward import PassShape, round_up
from specbatch.engine.sequence import Sequence
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.costmodel import CostModel
from specbatch.sched.plan import RoundPlan
from specbatch.sim.acceptance import AcceptanceModel, DomainAcceptance

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
        acceptance: AcceptanceModel,
        clock: VirtualClock,
        buckets: ShapeBuckets,
        max_kv_len: int,
        drafter_kind: str,
        outputs: Mapping[str, tuple[int, bool]],
        seed: int = 0,
    ) -> None:
        """`outputs[request_id]` = (output tokens the request generates, whether the last is EOS);
        `max_kv_len` is a slot's length (context + max lookahead + 1), the KV-length ceiling."""
        if drafter_kind not in ("draft", "ngram", "none"):
            raise ValueError(f"unknown drafter kind {drafter_kind!r}")
        self.cost, self.acceptance, self.clock, self.buckets = cost, acceptance, clock, buckets
        self.max_kv_len, self.outputs, self.seed = max_kv_len, outputs, seed
        self.uses_draft_model = drafter_kind == "draft"
        self.rngs: dict[str, random.Random] = {}
        self._drafts: dict[int, list[int]] = {}  # k -> k fake draft tokens
        # DomainAcceptance is drawn inline (the same draws as `accepted_prefix`, a third of the
        # cost): ln α per running request, 0.0 for α = 1 and -inf for α = 0
        self._log_alphas: dict[str, float] | None = {} if type(acceptance) is DomainAcceptance else None

    def admit(self, row: Sequence) -> None:
        row.num_computed = row.num_draft_computed = 0  # (re)admitted rows recompute their KV
        if row.request_id not in self.rngs:  # one stream per request: policies see the same draws
            self.rngs[row.request_id] = random.Random(f"specbatch.sim.accept:{self.seed}:{row.request_id}")
        if self._log_alphas is not None:
            alpha = self.acceptance.alpha(row.request_id, row.domain)
            self._log_alphas[row.request_id] = math.log(alpha) if alpha > 0 else -math.inf

    def release(self, row: Sequence, finished: bool) -> None:
        if finished:
            self.rngs.pop(row.request_id, None)
            self.acceptance.release(row.request_id)
            if self._log_alphas is not None:
                self._log_alphas.pop(row.request_id, None)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        outcome = RoundOutcome()
        if plan.prefill:
            outcome.prefill_shape, outcome.num_draft_prefill_rows = self._prefill(plan.prefill)
        if plan.decode:
            outcome.proposals = self._draft(plan.decode)
            outcome.rows, outcome.verify_shape = self._verify(plan.decode)
        outcome.prefill_ms, outcome.draft_ms, outcome.verify_ms = self._split_ms(outcome)
        self.clock.advance((outcome.prefill_ms + outcome.draft_ms + outcome.verify_ms) / 1000)
        return outcome

    def _prefill(self, work: list[tuple[Sequence, int]]) -> tuple[PassShape, int]:
        sizes = [size for _, size in work]
        shape = self._pass_shape(len(work), max(row.num_computed for row, _ in work), max(sizes), sum(sizes))
        num_draft_rows = 0
        for row, size in work:
            row.num_computed += size
            if self.uses_draft_model:  # the drafter's cache is filled alongside, up to the same end
                num_draft_rows += row.num_computed - row.num_draft_computed
                row.num_draft_rows += row.num_computed - row.num_draft_computed
                row.num_draft_computed = row.num_computed
        return shape, num_draft_rows

    def _draft(self, decode: list[tuple[Sequence, int]]) -> Proposals:
        """Counts of the passes `DraftModelDrafter.propose` runs: pass 0 feeds each speculating
        row's unfed tokens (ragged, padded to the longest), pass j > 0 one draft to each row with
        k > j (no padding)."""
        proposals = Proposals([], [])
        if not self.uses_draft_model:
            return proposals
        num_rows = num_fed = max_fed = max_k = further = 0
        for row, k in decode:
            if k > 0:
                num_tokens = len(row.prompt_ids) + len(row.output_ids)
                fed = num_tokens - row.num_draft_computed
                num_rows, num_fed, further = num_rows + 1, num_fed + fed, further + k - 1
                if fed > max_fed:
                    max_fed = fed
                if k > max_k:
                    max_k = k
                row.num_draft_rows += fed + k - 1
                row.num_draft_computed = num_tokens + k - 1
        proposals.num_draft_rows = num_fed + further
        proposals.num_padded_draft_rows = num_rows * max_fed - num_fed
        proposals.num_passes = max_k
        return proposals

    def _verify(self, decode: list[tuple[Sequence, int]]) -> tuple[list[RowOutcome], PassShape]:
        # the hot loop of a simulation (one iteration per row per round): properties inlined
        num_accepted_of, rngs, outputs = self.acceptance.num_accepted, self.rngs, self.outputs
        log_alphas = self._log_alphas
        drafts, uses_draft_model, log = self._drafts, self.uses_draft_model, math.log
        outcomes = []
        max_start = num_positions = max_len = 0
        for row, k in decode:
            if row.num_computed > max_start:
                max_start = row.num_computed
            if k >= max_len:
                max_len = 1 + k
            num_positions += 1 + k
            request_id, position = row.request_id, len(row.output_ids)
            if log_alphas is None:
                num_accepted = num_accepted_of(request_id, row.domain, position, k, rngs[request_id])
            else:  # accepted_prefix: X = min(k, floor(ln U / ln α)), U in (0, 1]
                u, log_alpha = 1.0 - rngs[request_id].random(), log_alphas[request_id]
                num_accepted = k if log_alpha == 0.0 else min(k, int(log(u) / log_alpha))
            accepted_end = len(row.prompt_ids) + position + num_accepted  # pending + accepted are valid
            row.num_computed = accepted_end
            if uses_draft_model and row.num_draft_computed > accepted_end:
                row.num_draft_computed = accepted_end
            num_output_tokens, ends_with_eos = outputs[request_id]
            eos_at = num_output_tokens - 1 - position  # index of EOS among this round's tokens
            emitted = [SIM_TOKEN_ID] * (num_accepted + 1)
            if ends_with_eos and 0 <= eos_at <= num_accepted:
                emitted[eos_at] = SIM_EOS_TOKEN_ID
            proposed = drafts.get(k) or drafts.setdefault(k, [SIM_TOKEN_ID] * k)  # shared, never mutated
            outcomes.append(RowOutcome(row, k, proposed, num_accepted, emitted))
        return outcomes, self._pass_shape(len(decode), max_start, max_len, num_positions)

    def _pass_shape(self, num_rows: int, max_start: int, max_len: int, num_positions: int) -> PassShape:
        """The pass `forward_rows` would run: bucketed rows and query length, KV length rounded up
        to the bucket multiple over every position read (padding rows start at 0)."""
        bucket = self.buckets.fit(num_rows, max_len)
        kv_len = min(round_up(max_start + bucket.query_len, self.buckets.kv_len_multiple), self.max_kv_len)
        return PassShape(num_rows, bucket.batch_rows, bucket.query_len, kv_len, num_positions)

    def _split_ms(self, outcome: RoundOutcome) -> tuple[float, float, float]:
        """(prefill, draft, verify) ms; the intercept is booked to verify. Same features as
        `CostModel.fit` reads from a rounds table: rows include padding."""
        c = self.cost
        prefill = verify = 0.0
        if outcome.prefill_shape is not None:
            prefill = _pass_ms(c, outcome.prefill_shape)
        if outcome.verify_shape is not None:
            verify = _pass_ms(c, outcome.verify_shape)
        proposals = outcome.proposals
        draft_rows = outcome.num_draft_prefill_rows
        draft_passes = int(outcome.num_draft_prefill_rows > 0)
        if proposals is not None:
            draft_rows += proposals.num_draft_rows + proposals.num_padded_draft_rows
            draft_passes += proposals.num_passes
        draft = c.draft_passes * draft_passes + c.draft_rows * draft_rows
        return prefill, draft, c.intercept_ms + verify


def _pass_ms(cost: CostModel, shape: PassShape) -> float:
    return (cost.target_passes + cost.target_rows * shape.num_bucket_rows * shape.query_len
            + cost.kv_tokens_read * shape.num_kv_tokens_read)


def sim_decode(token_ids: list[int]) -> str:
    """Simulated requests have no text."""
    return ""

