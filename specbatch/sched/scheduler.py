"""Admission, batch composition and preemption under KV capacity, a token budget and a round-time
objective.

One scheduling model: a decode row asks for 1 + k target positions (k = 0 is plain decoding), a
prefill row for its chunk. A row whose prefill completes this round also verifies this round.
Per round: admit (grow reservations, preempt for priority, admit in policy order) → pack the
decodable rows → lookahead k per row → prefill chunks with what is left of the token budget.
Preemption is by recompute: the row's KV is freed, num_computed reset, and it is re-prefilled
when re-admitted (greedy output unchanged). KV is counted in blocks (`KVBlocks`), a shared block
once: a row admitted with its prefix registered points at those blocks and starts computed past them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specbatch.core import RoundPlan, Row, Status
from specbatch.records import RoundRecord, ms_since
from specbatch.sched.context import SchedContext
from specbatch.sched.drafter_choice import choose_drafters, probe_with_model
from specbatch.sched.estimates import AcceptanceStats
from specbatch.sched.kv_blocks import KVBlocks
from specbatch.sched.packing import Packer
from specbatch.sched.pass_profile import forecast_round
from specbatch.sched.policies import FixedLookahead, LookaheadPolicy, OrderPolicy, PrefillChunkPolicy, full_order
from specbatch.sched.queues import WaitQueue
from specbatch.sched.roundcost import DecodeShape


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_rows: int
    max_round_tokens: int
    max_context: int  # target positions a row may use (prompt + output)
    max_lookahead: int
    admission: str = "reserve"  # reserve: worst case up front | optimistic: grow, preempt by recompute
    max_preemptions_per_round: int = 4  # priority preemptions (recompute is not free)


@dataclass
class Admission:
    admitted: list[Row]
    preempted: list[Row]
    dropped: list[Row]
    num_reused_tokens: int = 0  # prompt positions the admitted rows took from shared blocks


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        kv: KVBlocks,
        order: OrderPolicy,
        lookahead: LookaheadPolicy,
        prefill_chunk: PrefillChunkPolicy,
        stats: AcceptanceStats | None = None,
        context: SchedContext | None = None,
    ) -> None:
        self.limits, self.kv = limits, kv
        self.ctx = context or SchedContext(
            stats=stats or AcceptanceStats(), max_lookahead=limits.max_lookahead,
            max_batch_rows=limits.max_batch_rows, max_round_tokens=limits.max_round_tokens)
        self.stats = self.ctx.stats
        self.order, self.lookahead, self.prefill_chunk = full_order(order), lookahead, prefill_chunk
        self.waiting = WaitQueue(self.order)
        self.running: list[Row] = []
        self.packer = Packer(self.ctx)
        self.draft = self.ctx.draft  # does this round draft, which row probes

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, row: Row, now_s: float = 0.0) -> None:
        row.status = Status.WAITING
        self.waiting.push(row, now_s)

    def reservation(self, row: Row) -> int:
        """KV positions a row may need: worst case, or (optimistic) just its next round."""
        if self.limits.admission == "reserve":
            worst = row.num_prompt_tokens + row.params.max_new_tokens + self.limits.max_lookahead + 1
            return min(worst, self.limits.max_context + self.limits.max_lookahead)
        return row.num_tokens + self.limits.max_lookahead + 1

    def admit(self, now_s: float) -> Admission:
        """Admit waiting rows in policy order while rows, KV and the round-time objective allow;
        a preemptive order may first take a worse running row's place."""
        result = Admission([], [], [])
        if self.limits.admission == "optimistic":
            result.preempted = self._grow_reservations(now_s)
            if result.preempted:
                return result  # memory pressure: admit nothing new this round
        num_priority_preemptions = 0
        while self.waiting:
            row = self.waiting.peek(now_s)
            assert row is not None  # the queue is not empty
            need = self.reservation(row)
            if self.kv.blocks_for(need) > self.kv.num_blocks:
                self.waiting.pop(now_s)
                row.status, row.drop_reason = Status.DROPPED, "exceeds_kv_capacity"
                result.dropped.append(row)
                continue
            if any(row is r for r in result.preempted):
                break  # a row preempted this round waits at least a round
            if len(self.running) >= self.limits.max_batch_rows and not self.order.preemptive:
                break  # no slot, and none to take: its prefix lookup (hashing its prompt) can wait
            shared = self.kv.lookup(row)
            if self._can_admit(row, need, shared):
                self._admit(self.waiting.pop(now_s), need, shared, now_s, result)
                continue
            if (not self.order.preemptive or num_priority_preemptions >= self.limits.max_preemptions_per_round
                    or not self._fits_round_time(row)):
                break  # preempting frees slots and KV, not round time
            victim = self._priority_victim(row, self.kv.need(row, need, shared), now_s, result.admitted)
            if victim is None:
                break
            self.preempt(victim)
            result.preempted.append(victim)
            num_priority_preemptions += 1
        return result

    def _can_admit(self, row: Row, need: int, shared: list[int]) -> bool:
        return (len(self.running) < self.limits.max_batch_rows and self.kv.can_admit(row, need, shared)
                and self._fits_round_time(row))

    def _fits_round_time(self, row: Row) -> bool:
        """Predicted verification cost: a round of the running rows plus this one, each verifying
        1 + k̂ positions (k̂ the recent mean lookahead), within tpot_slo_ms. The first row always fits."""
        if not self.running:
            return True
        k = min(round(self.ctx.recent_k), self.limits.max_lookahead)
        shape = DecodeShape.of(self.running + [row], [k] * (len(self.running) + 1))
        return self.ctx.round_cost.decode_ms(shape) <= self.ctx.tpot_slo_ms

    def _admit(self, row: Row, need: int, shared: list[int], now_s: float, result: Admission) -> None:
        reused = self.kv.admit(row, need, shared)
        if reused > row.num_computed:  # a re-admitted row has computed nothing (preemption reset it)
            row.num_reused_tokens += reused - row.num_computed
            result.num_reused_tokens += reused - row.num_computed
            row.num_computed = reused
            row.num_draft_computed = self.kv.num_draft_shared(row.request_id)
        row.status = Status.RUNNING
        if row.admitted_s is None:
            row.admitted_s = now_s
        self.running.append(row)
        result.admitted.append(row)

    def _priority_victim(self, row: Row, need: int, now_s: float,
                         just_admitted: list[Row]) -> Row | None:
        """A running row to preempt so that `row` fits (`need` blocks), if the order policy wants one
        and freeing it makes room (a slot and enough KV); None otherwise. Rows admitted this round are safe."""
        if not self.order.preemptive:
            return None
        fresh = {id(r) for r in just_admitted}
        candidates = [r for r in self.running
                      if id(r) not in fresh and self.order.should_preempt(r, row, now_s)]
        held = [self.kv.held_tokens(r.request_id) for r in candidates]
        free, size = self.kv.num_free * self.kv.block_size, self.kv.block_size
        fits = [i for i, h in enumerate(held) if free + h >= need * size]
        if not fits:
            return None
        pool = [candidates[i] for i in fits]
        return self.order.pick_victim(pool, now_s, [held[i] for i in fits], need * size - free)

    def _grow_reservations(self, now_s: float) -> list[Row]:
        """Optimistic mode: each running row needs room for its next round; preempt (policy's pick)
        until everyone left fits."""
        preempted: list[Row] = []
        while self.running:
            for row in self.running:
                self.kv.reserve(row.request_id, max(self.reservation(row), self.kv.reserved(row.request_id)))
            if self.kv.num_free >= 0:
                break
            held = [self.kv.held_tokens(r.request_id) for r in self.running]
            victim = self.order.pick_victim(list(self.running), now_s, held, -self.kv.num_free * self.kv.block_size)
            self.preempt(victim)
            preempted.append(victim)
        return preempted

    def preempt(self, row: Row) -> None:
        _remove(self.running, row)
        self.kv.free(row.request_id)
        row.num_computed = row.num_draft_computed = row.num_indexed = 0  # its drafters forget it too
        row.num_preemptions += 1
        self.add(row, self.ctx.now_s)

    def plan(self, now_s: float) -> tuple[RoundPlan, Admission]:
        started = time.perf_counter()
        self.ctx.now_s = now_s
        admission = self.admit(now_s)
        plan = RoundPlan(num_reused_tokens=admission.num_reused_tokens)
        held_back = self._share_prefixes(plan)
        decoding = [row for row in self.running if row.is_decoding]
        rows = self.packer.select(decoding, self.limits.max_batch_rows, self.limits.max_round_tokens)
        budget = self._plan_decode(plan, rows)
        self._plan_prefill(plan, budget, now_s, held_back)
        plan.probe = self.draft.probe_row(plan, self.ctx.round_cost)
        probe_with_model(self.ctx.alphas, plan.probe)
        self._allocate(plan)
        self.ctx.observe_plan(plan, len(self.running))
        self.draft.observe_plan(plan, self.ctx.round_cost)
        plan.draft_prefill = bool(plan.prefill) and (self.draft.drafting or self._drafts_when_current())
        forecast_round(self.ctx, plan, [self.cap(row) for row, _ in plan.decode])  # the limit in the ledger
        plan.plan_ms = ms_since(started)
        return plan, admission

    def observe_round(self, record: RoundRecord, num_draft_prefill_positions: int,
                      draft_prefill_ms: float = 0.0) -> None:
        """A round ran: the drafting controller learns from it (`DraftControl.observe_round`)."""
        self.draft.observe_round(record, self.ctx.round_cost, num_draft_prefill_positions, draft_prefill_ms)

    def _plan_decode(self, plan: RoundPlan, rows: list[Row]) -> int:
        budget = self.limits.max_round_tokens
        caps = [self.cap(r) for r in rows]
        if self.ctx.draft.drafts_this_round:  # in the gate's plain rounds no row drafts: nothing to choose
            choose_drafters(self.ctx.alphas, self.ctx.round_cost, rows, caps, index_lag=self.ctx.index_lag)
        for row, k in zip(rows, self.lookahead.choose(rows, caps), strict=True):
            if budget < 1:
                break
            k = max(0, min(k, budget - 1))
            plan.decode.append((row, k))
            budget -= 1 + k
        return budget

    def _share_prefixes(self, plan: RoundPlan) -> set[int]:
        """Point prefilling rows at blocks registered since they last looked (an earlier row computed
        the same tokens), counted in `plan`; returns the ids of rows that wait this round because an
        earlier row is about to compute their next block, so a batch admitted at once computes a shared
        prefix once."""
        held_back, computing = set(), set()
        for row in self.running:
            if row.is_decoding:
                continue
            gained = self.kv.extend_shared(row)
            if gained:
                draft_current = row.num_draft_computed == row.num_computed
                row.num_computed += gained
                row.num_reused_tokens += gained
                plan.num_reused_tokens += gained
                if draft_current:  # the draft KV comes with the blocks where their donor computed it
                    row.num_draft_computed = max(row.num_draft_computed,
                                                 min(self.kv.num_draft_shared(row.request_id), row.num_computed))
            key = self.kv.next_key(row) if not row.is_decoding else None
            if key is None:
                continue
            if key in computing:
                held_back.add(id(row))
            computing.add(key)
        return held_back

    def _allocate(self, plan: RoundPlan) -> None:
        """Blocks for every position this round writes: prefill chunks, verify windows, draft steps."""
        ends = {id(row): (row, row.num_computed + size) for row, size in plan.prefill}
        for row, k in plan.decode:
            ends[id(row)] = (row, plan.computed_after_prefill(row) + 1 + k)
        for row, end in ends.values():
            self.kv.ensure(row.request_id, end)

    def _plan_prefill(self, plan: RoundPlan, budget: int, now_s: float, held_back: set[int]) -> None:
        """Prefill rows in priority order, but those waiting for a shared prefix. A row whose prefill
        completes also verifies this round, with k no larger than the round's largest (no extra
        verify padding); if it is the round's only kind of verify row, the lookahead policy chooses
        for those rows together. A row whose drafter must first index its prompt (suffix) joins at
        k = 0 where the policy prices drafts: taking the round's k would build that index unpriced,
        so it waits a round for the policy to weigh it against what the row may still draft."""
        prefilling = sorted((r for r in self.running if not r.is_decoding and id(r) not in held_back),
                            key=lambda r: self.order.priority(r, now_s))
        if not prefilling:
            return
        chunk_limit = self.prefill_chunk.chunk_tokens(plan.decode, prefilling)
        completing: list[Row] = []
        for row in prefilling:
            size = min(chunk_limit, row.num_prefill_remaining, budget)
            if size <= 0:
                break
            plan.prefill.append((row, size))
            budget -= size
            if size == row.num_prefill_remaining and budget >= 1:
                completing.append(row)
                budget -= 1
        if not completing:
            return
        caps = [self.cap(r) for r in completing]
        choose_drafters(self.ctx.alphas, self.ctx.round_cost, completing, caps,
                        index_lag=self.ctx.index_lag)
        max_k = max((k for _, k in plan.decode), default=None)
        if max_k is None:
            ks = self.lookahead.choose(completing, caps)
        else:
            ks = [0 if self._catches_up_unpriced(row) else min(c, max_k) for row, c in zip(completing, caps,
                                                                                            strict=True)]
        for row, k in zip(completing, ks, strict=True):
            k = max(0, min(k, budget))
            plan.decode.append((row, k))
            budget -= k

    def _catches_up_unpriced(self, row: Row) -> bool:
        """Whether a row completing its prefill would, at the round's k, first catch up a drafter the
        policy prices: a suffix index that does not hold its prompt, or a draft cache its earlier
        chunks did not fill (`Row.draft_is_current`; a fill skipped while the batch would not draft)."""
        if isinstance(self.lookahead, FixedLookahead):
            return False
        if self.ctx.drafts_with_model(row):
            return not row.draft_is_current
        return self.ctx.round_cost.cost.lookup_tokens > 0 and self.ctx.index_lag(row) > 0

    def _drafts_when_current(self) -> bool:
        """Whether the batch this round's prefilling rows will decode in, every running row, would
        draft, the prefilling rows' draft caches current (the lookahead policy's call). Asked of the
        round's own rows, a job's first round asked it of the one row whose first chunk it prefilled:
        at 1 row the bundled pair's drafts pay where at 8 they do not, and the first admissions filled
        1,759 draft rows (3% of a few-shot batch-8 job) for a batch that then never drafted."""
        return self.lookahead.drafts_when_current(self.running, [self.cap(row) for row in self.running])

    def cap(self, row: Row) -> int:
        """Largest useful k: no drafts past max_new_tokens, no positions past the context."""
        return max(0, min(self.limits.max_lookahead, row.num_new_tokens_left - 1,
                          self.limits.max_context - row.num_tokens))

    def finish(self, row: Row) -> None:
        self.kv.register(row)
        _remove(self.running, row)
        self.kv.free(row.request_id)
        if row.status is Status.COMPLETED:
            self.ctx.observe_finish(row)


def _remove(rows: list[Row], row: Row) -> None:
    """Remove by identity (dataclass equality would compare every field)."""
    for index, candidate in enumerate(rows):
        if candidate is row:
            del rows[index]
            return
