"""Admission, batch composition and preemption under KV capacity and a per-round token budget.

One scheduling model: a decode row asks for 1 + k target positions (k = 0 is plain decoding), a
prefill row for its chunk. A row whose prefill completes this round also verifies this round.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from specbatch.engine.sequence import Sequence, Status
from specbatch.sched.capacity import KVBudget
from specbatch.sched.plan import RoundPlan
from specbatch.sched.policies import AcceptanceStats, LookaheadPolicy, OrderPolicy, PrefillChunkPolicy


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_rows: int
    max_round_tokens: int
    max_context: int  # target positions a row may use (prompt + output)
    max_lookahead: int
    admission: str = "reserve"  # reserve: worst case up front | optimistic: grow, preempt by recompute


@dataclass
class Admission:
    admitted: list[Sequence]
    preempted: list[Sequence]
    dropped: list[Sequence]


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        kv: KVBudget,
        order: OrderPolicy,
        lookahead: LookaheadPolicy,
        prefill_chunk: PrefillChunkPolicy,
        stats: AcceptanceStats | None = None,
    ) -> None:
        self.limits, self.kv = limits, kv
        self.order, self.lookahead, self.prefill_chunk = order, lookahead, prefill_chunk
        self.stats = stats or AcceptanceStats()
        self.waiting: list[tuple[float, int, Sequence]] = []  # heap by (order key, arrival counter)
        self.running: list[Sequence] = []
        self._counter = itertools.count()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, row: Sequence, now_s: float = 0.0) -> None:
        row.status = Status.WAITING
        heapq.heappush(self.waiting, (self.order.key(row, now_s), next(self._counter), row))

    def reservation(self, row: Sequence) -> int:
        """KV positions a row may need: worst case, or (optimistic) just its next round."""
        if self.limits.admission == "reserve":
            worst = row.num_prompt_tokens + row.params.max_new_tokens + self.limits.max_lookahead + 1
            return min(worst, self.limits.max_context + self.limits.max_lookahead)
        return row.num_tokens + self.limits.max_lookahead + 1

    def admit(self, now_s: float) -> Admission:
        """Admit waiting rows in policy order while rows, slots and KV capacity allow."""
        result = Admission([], [], [])
        if self.limits.admission == "optimistic":
            result.preempted = self._grow_reservations()
        while self.waiting and len(self.running) < self.limits.max_batch_rows:
            row = self.waiting[0][2]
            need = self.reservation(row)
            if need > self.kv.capacity_tokens:
                heapq.heappop(self.waiting)
                row.status, row.drop_reason = Status.DROPPED, "exceeds_kv_capacity"
                result.dropped.append(row)
                continue
            if not self.kv.can_reserve(need):
                break
            heapq.heappop(self.waiting)
            self.kv.reserve(row.request_id, need)
            row.status = Status.RUNNING
            if row.admitted_s is None:
                row.admitted_s = now_s
            self.running.append(row)
            result.admitted.append(row)
        return result

    def _grow_reservations(self) -> list[Sequence]:
        """Optimistic mode: each running row needs room for its next round; preempt the lowest
        ranked rows (recompute later) until everyone left fits."""
        preempted: list[Sequence] = []
        ranked = sorted(self.running, key=lambda r: self.order.key(r, 0.0))
        while ranked:
            need = sum(max(self.reservation(r), self.kv.reserved.get(r.request_id, 0)) for r in ranked)
            if need <= self.kv.capacity_tokens:
                break
            victim = ranked.pop()
            self.preempt(victim)
            preempted.append(victim)
        for row in ranked:
            self.kv.reserve(row.request_id, max(self.reservation(row), self.kv.reserved[row.request_id]))
        return preempted

    def preempt(self, row: Sequence) -> None:
        self.running.remove(row)
        self.kv.free(row.request_id)
        row.num_computed = row.num_draft_computed = 0
        row.num_preemptions += 1
        self.add(row)

    def plan(self, now_s: float) -> tuple[RoundPlan, Admission]:
        started = time.perf_counter()
        admission = self.admit(now_s)
        plan = RoundPlan()
        budget = self.limits.max_round_tokens
        decoding = [row for row in self.running if row.is_decoding]
        for row, k in zip(decoding, self.lookahead.choose(decoding, [self.cap(r) for r in decoding])):
            k = max(0, min(k, budget - 1))
            if budget < 1:
                break
            plan.decode.append((row, k))
            budget -= 1 + k
        chunk_limit = self.prefill_chunk.chunk_tokens(plan.decode)
        prefilling = sorted((r for r in self.running if not r.is_decoding), key=lambda r: self.order.key(r, now_s))
        for row in prefilling:
            size = min(chunk_limit, row.num_prefill_remaining, budget)
            if size <= 0:
                break
            plan.prefill.append((row, size))
            budget -= size
            if size == row.num_prefill_remaining and budget >= 1:
                k = min(self.lookahead.choose([row], [self.cap(row)])[0], budget - 1)
                plan.decode.append((row, max(0, k)))
                budget -= 1 + max(0, k)
        plan.plan_ms = (time.perf_counter() - started) * 1000
        return plan, admission

    def cap(self, row: Sequence) -> int:
        """Largest useful k: no drafts past max_new_tokens, no positions past the context."""
        return max(0, min(self.limits.max_lookahead, row.num_new_tokens_left - 1,
                          self.limits.max_context - row.num_tokens))

    def finish(self, row: Sequence) -> None:
        if row in self.running:
            self.running.remove(row)
        self.kv.free(row.request_id)
