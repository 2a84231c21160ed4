"""Helpers for scheduler tests: a model-free round loop on a virtual clock (what the backend and the
round loop do to rows, with acceptance drawn per row), hand-made rows, and engine runs per policy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from specbatch.engine.sequence import SamplingParams, Sequence, Status
from specbatch.sched.capacity import KVBudget
from specbatch.sched.context import SchedContext
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sched.factory import make_lookahead, make_order, make_prefill_chunk
from specbatch.sched.roundcost import RoundCostModel
from specbatch.sched.scheduler import Scheduler, SchedulerLimits


def make_row(request_id: str, num_prompt: int = 8, max_new: int = 32, domain: str = "", arrival_s: float = 0.0,
             history: list[tuple[int, int]] | None = None, num_output: int = 0) -> Sequence:
    """A hand-made row; with num_output, its prompt and output are fully computed (decoding)."""
    row = Sequence(request_id, list(range(2, 2 + num_prompt)), SamplingParams(max_new_tokens=max_new),
                   domain=domain, arrival_s=arrival_s)
    row.output_ids = [7] * num_output
    row.accept_history = list(history or [])
    row.num_proposed = sum(k for _, k in row.accept_history)
    row.num_rounds = len(row.accept_history)
    if history:
        row.last_k = history[-1][1]
    if num_output:
        row.num_computed = row.num_draft_computed = row.num_tokens - 1
    return row


def make_scheduler(order: str = "fcfs", lookahead: str = "fixed:4", prefill: str = "fixed:16", *,
                   capacity: int = 10_000, max_rows: int = 8, max_tokens: int = 512, max_context: int = 512,
                   max_lookahead: int = 4, admission: str = "reserve", tpot_slo_ms: float = 200.0,
                   ctx: SchedContext | None = None) -> Scheduler:
    ctx = ctx or SchedContext(RoundCostModel(CPU_DEMO_PROFILE), max_lookahead=max_lookahead, max_batch_rows=max_rows,
                              max_round_tokens=max_tokens, tpot_slo_ms=tpot_slo_ms)
    limits = SchedulerLimits(max_rows, max_tokens, max_context, max_lookahead, admission)
    return Scheduler(limits, KVBudget(capacity), make_order(order, ctx),
                     make_lookahead(lookahead, max_lookahead, ctx), make_prefill_chunk(prefill, ctx), context=ctx)


@dataclass
class FakeLoop:
    """Plan → emulate the backend and the loop's commit → finish, on a virtual clock advanced by the
    predicted round time. Each row accepts each draft with its own α until the first rejection and
    stops at its true length (an EOS) or max_new_tokens. `check` runs after every plan."""

    scheduler: Scheduler
    alphas: dict[str, float] = field(default_factory=dict)
    true_lengths: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    now_s: float = 0.0
    finished: list[Sequence] = field(default_factory=list)
    num_rounds: int = 0

    def add(self, row: Sequence) -> None:
        row.arrival_s = row.arrival_s or self.now_s
        self.scheduler.add(row, row.arrival_s)

    def run(self, max_rounds: int = 100_000, check=None) -> None:
        rng = random.Random(self.seed)
        while self.scheduler.has_work and self.num_rounds < max_rounds:
            self.step(rng, check)

    def step(self, rng: random.Random, check=None) -> None:
        scheduler = self.scheduler
        plan, admission = scheduler.plan(self.now_s)
        for row in admission.admitted:
            row.num_computed = row.num_draft_computed = 0
        self.finished.extend(admission.dropped)
        if check is not None:
            check(scheduler, plan)
        self.now_s += scheduler.ctx.round_cost.round_ms(plan.decode, plan.prefill) / 1000
        self.num_rounds += 1
        for row, size in plan.prefill:
            row.num_computed += size
            row.num_draft_computed = row.num_computed
        for row, k in plan.decode:
            self._verify(row, k, rng)
        for row, _ in plan.decode:
            if row.status is Status.COMPLETED:
                row.finished_s = self.now_s
                scheduler.finish(row)
                self.finished.append(row)

    def _verify(self, row: Sequence, k: int, rng: random.Random) -> None:
        alpha = self.alphas.get(row.request_id, 0.5)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        before = row.num_tokens
        row.num_computed = before + accepted
        if k:
            row.num_draft_computed = min(row.num_draft_computed, before) + accepted
            row.accept_history.append((accepted, k))
            row.num_proposed += k
            self.scheduler.stats.observe(row.domain, k, accepted)
        row.last_k = k
        row.num_rounds += 1
        limit = min(row.params.max_new_tokens, self.true_lengths.get(row.request_id, row.params.max_new_tokens))
        for _ in range(accepted + 1):
            row.output_ids.append(9)
            if row.num_output_tokens >= limit:
                row.status = Status.COMPLETED
                break
