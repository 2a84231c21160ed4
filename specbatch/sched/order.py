"""Order policies that know about speculation: `laps-sd` (a baseline from the literature) and
`specbatch` (ours). Both rank by predicted time from the cost model.

LAPS-SD's formula uses a row's shares of a round in a batch of B rows with k drafts
(RoundCostModel.row_share_ms):
    t_verify(k) = (c0 + c_pass)/B + c_row·(1 + k) + c_kv·kv_len        t_draft = c_dpass/B + c_drow
`specbatch` ranks by expected remaining wall time: rounds left times the predicted round time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from specbatch.core import Row
from specbatch.sched.context import SchedContext
from specbatch.sched.estimates import expected_tokens
from specbatch.sched.policies import OrderBase
from specbatch.sched.roundcost import DecodeShape


@dataclass
class LapsSd(OrderBase):
    """LAPS-SD (Li, Chen, Li 2025), semi-clairvoyant: max_new_tokens is known, acceptance is not.

    While a row's α̂ is unsettled (fewer than `settle_proposed` drafts proposed so far), its rank is
    its *attained* service (least-attained-service); once settled, its *perceived* remaining time
        T = L_remaining · (k·t_draft + t_verify) / (k·α + 1).
    Both are in milliseconds and both are measured in units of one plain round t_verify(0), then cut
    into multi-level queues at `level_rounds`. A lower queue index runs first; a waiting row of a
    strictly higher queue preempts a running one. Within a queue, settled rows (known short) go
    first by T, unsettled ones by least attained service. Without drafts (max lookahead 0) T is
    exact at once (semi-clairvoyance becomes clairvoyance: SRPT by levels).
    """

    ctx: SchedContext
    level_rounds: tuple[float, ...] = (8, 32, 128, 512)
    settle_proposed: int = 16
    name: str = "laps-sd"
    preemptive: bool = True
    level_span: float = 1e10  # key = level · span + within-level rank

    def key(self, row: Row, now_s: float) -> float:
        settled, rounds = self.service_rounds(row)
        level = bisect.bisect_right(self.level_rounds, rounds)
        return level * self.level_span + (rounds if settled else 1e9 + rounds)

    def level(self, row: Row) -> int:
        return bisect.bisect_right(self.level_rounds, self.service_rounds(row)[1])

    def service_rounds(self, row: Row) -> tuple[bool, float]:
        """(settled, rounds): perceived remaining service if α̂ is settled, else attained service."""
        ctx = self.ctx
        k = min(ctx.typical_k(row), ctx.max_lookahead)
        t_unit, _ = ctx.round_cost.row_share_ms(ctx.max_batch_rows, 0, row.num_tokens)
        t_verify, t_draft = ctx.round_cost.row_share_ms(ctx.max_batch_rows, k, row.num_tokens)
        if ctx.max_lookahead == 0 or row.num_proposed >= self.settle_proposed:
            alpha = ctx.alpha(row) if k else 0.0
            remaining_ms = row.num_new_tokens_left * (k * t_draft + t_verify) / (k * alpha + 1)
            return True, remaining_ms / t_unit
        per_draft_ms = t_draft + ctx.round_cost.cost.target_rows
        return False, (row.num_rounds * t_unit + row.num_proposed * per_draft_ms) / t_unit

    def should_preempt(self, running: Row, waiting: Row, now_s: float) -> bool:
        return self.level(waiting) < self.level(running)


@dataclass
class SpecbatchOrder(OrderBase):
    """Ours: shortest *expected remaining time* first, from per-domain statistics (no per-request
    length predictor), with aging and cache-aware preemption.

        remaining_ms(row) = L̂ / E · T_round,  L̂ = (max_new_tokens left) · ρ_domain
                                              E  = (1 − α^(k+1)) / (1 − α),  α = α̂ of the row's domain
                                              T_round = predicted round time of the current batch, k̂
    ρ_domain (AcceptanceStats.length_ratio) is how much of their budget the domain's finished rows
    really used (early EOS), α̂ its measured acceptance: a code row that drafts well and tends to
    stop early ranks ahead of a prose row with the same budget. All of ρ, α̂ and T_round apply to a
    whole domain, so they form the class scale ρ·T_round/E and the waiting heaps never re-rank. A
    row with its own acceptance history (preempted) keeps its speed relative to its domain in its key.

    Aging: priority = remaining_ms − `aging` · waited_ms, so a long wait lifts a row (tail latency:
    a row that waited twice its own expected time beats a fresh one) while rows that arrived together
    keep their order.

    Cache-aware preemption: a waiting row takes a running row's place only if
        remaining(waiting)·(1 + margin) + recompute_ms(victim) < remaining(victim)   (both aged)
    and among such victims the one with the most to lose and the least KV to recompute goes.
    """

    ctx: SchedContext
    preempt_margin: float = 0.5
    aging: float = 0.5
    name: str = "specbatch"
    preemptive: bool = True
    ages_waiting_rows: bool = True
    _scales: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _scales_version: int = field(default=-1, init=False, repr=False)

    def class_of(self, row: Row) -> str:
        return row.domain

    def class_scale(self, cls: str) -> float:
        """ρ·t_row/E of a domain, computed once per plan (statistics change only at commit)."""
        if self._scales_version != self.ctx.num_plans:
            self._scales, self._scales_version = {}, self.ctx.num_plans
        if cls not in self._scales:
            self._scales[cls] = self._class_scale(cls)
        return self._scales[cls]

    def _class_scale(self, cls: str) -> float:
        ctx = self.ctx
        k = round(ctx.recent_k)
        tokens = expected_tokens(ctx.stats.alpha(cls), k)
        return ctx.stats.length_ratio(cls) * self._round_ms(ctx.num_running or ctx.max_batch_rows, k) / tokens

    def _round_ms(self, num_rows: int, k: int) -> float:
        shape = DecodeShape(num_rows, 0, k, num_rows if k else 0, 1 if k else 0, num_rows * k,
                            sum_all_k=num_rows * k, sum_lag=num_rows if k else 0)
        return self.ctx.round_cost.decode_ms(shape)

    def key(self, row: Row, now_s: float) -> float:
        """Budget tokens left (+ prefill work in decode-token equivalents: rounds of a plain full
        batch it costs), relative to its domain's speed."""
        ctx = self.ctx
        per_prefill_token = ctx.round_cost.cost.target_rows / self._round_ms(ctx.max_batch_rows, 0)
        left = row.num_new_tokens_left + row.num_prefill_remaining * per_prefill_token
        if row.accept_history:
            k = ctx.typical_k(row)
            left *= expected_tokens(ctx.stats.alpha(row.domain), k) / expected_tokens(ctx.alpha(row), k)
        return left

    def remaining_ms(self, row: Row, now_s: float) -> float:
        return self.class_scale(row.domain) * self.key(row, now_s)

    def priority(self, row: Row, now_s: float) -> float:
        return self.remaining_ms(row, now_s) - self.aging_credit_ms(row, now_s)

    def aging_credit_ms(self, row: Row, now_s: float) -> float:
        return self.aging * 1000 * max(0.0, now_s - row.arrival_s)

    def should_preempt(self, running: Row, waiting: Row, now_s: float) -> bool:
        """remaining(w)·(1 + margin) + recompute(r) − credit(w) < remaining(r) − credit(r): the margin
        scales remaining times only (aged priorities may be negative)."""
        recompute = self.ctx.round_cost.recompute_ms(running.num_computed)
        waiting_ms = self.remaining_ms(waiting, now_s) * (1 + self.preempt_margin) + recompute
        return (waiting_ms - self.aging_credit_ms(waiting, now_s)
                < self.remaining_ms(running, now_s) - self.aging_credit_ms(running, now_s))

    def pick_victim(self, candidates: list[Row], now_s: float, kv_held: list[int],
                    need_tokens: int) -> Row:
        """Prefer victims whose KV alone covers the need (never free a big row when a small one would
        do), then the largest priority minus recompute cost."""
        covering = [i for i, held in enumerate(kv_held) if held >= need_tokens]
        pool = covering or range(len(candidates))
        recompute = self.ctx.round_cost.recompute_ms

        def score(i: int) -> float:
            row = candidates[i]
            return self.priority(row, now_s) - recompute(row.num_computed)

        return candidates[max(pool, key=score)]
