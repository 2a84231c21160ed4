"""Helpers for scheduler tests: hand-made rows, a scheduler from policy names, and the real round
loop over the simulated backend (a virtual clock, acceptance drawn per row with its own α)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from specbatch.config import load_config
from specbatch.core import RoundPlan, Row, SamplingParams
from specbatch.loop import Engine, MemoryRecorder
from specbatch.sched import factory
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sched.scheduler import Scheduler
from specbatch.sched.stops import StopChecker
from specbatch.sim.acceptance import accepted_prefix
from specbatch.sim.backend import SIM_EOS_TOKEN_ID, SimBackend, VirtualClock, sim_decode


def make_row(request_id: str, num_prompt: int = 8, max_new: int = 32, domain: str = "", arrival_s: float = 0.0,
             history: list[tuple[int, int]] | None = None, num_output: int = 0) -> Row:
    """A hand-made row; with num_output, its prompt and output are fully computed (decoding)."""
    row = Row(request_id, list(range(2, 2 + num_prompt)), SamplingParams(max_new_tokens=max_new),
                   domain=domain, arrival_s=arrival_s, output=[7] * num_output)
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
                   prefix: bool = False) -> Scheduler:
    """The factory's scheduler for a config with these settings (no KV-length bucketing; no prefix
    sharing unless asked: hand-made rows all open with the same tokens, and their KV is made up)."""
    config = load_config(None, [
        f"scheduler.order={order}", f"scheduler.lookahead={lookahead}", f"scheduler.prefill_chunk={prefill}",
        f"scheduler.max_batch_rows={max_rows}", f"scheduler.max_round_tokens={max_tokens}",
        f"scheduler.max_lookahead={max_lookahead}", f"scheduler.tpot_slo_ms={tpot_slo_ms}",
        f"capacity.admission={admission}", "buckets.kv_len_multiple=1", f"cache.prefix={prefix}",
    ])
    return factory.make_scheduler(config, capacity, max_context, CPU_DEMO_PROFILE)


@dataclass
class RowAlphas:
    """Acceptance model: each request accepts each draft with its own α (default 0.5)."""

    alphas: dict[str, float] = field(default_factory=dict)

    def num_accepted(self, request_id: str, domain: str, position: int, k: int, rng: random.Random) -> int:
        return accepted_prefix(self.alphas.get(request_id, 0.5), k, rng)

    def release(self, request_id: str) -> None:
        pass


@dataclass
class SimLoop:
    """The real `Engine` over `SimBackend` for a hand-built scheduler: rounds take the demo cost
    model's time, a row stops at its true length (an EOS) or max_new_tokens. `check(scheduler,
    plan)` runs after every plan."""

    scheduler: Scheduler
    seed: int = 0
    alphas: dict[str, float] = field(default_factory=dict)
    true_lengths: dict[str, int] = field(default_factory=dict)
    finished: list[Row] = field(default_factory=list)
    outputs: dict[str, tuple[int, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        limits = self.scheduler.limits
        self.clock = VirtualClock()
        backend = SimBackend(CPU_DEMO_PROFILE, RowAlphas(self.alphas), self.clock, ShapeBuckets(),
                             limits.max_context + limits.max_lookahead + 1, "draft", self.outputs, self.seed)
        stops = StopChecker({SIM_EOS_TOKEN_ID}, sim_decode, limits.max_context)
        self.engine = Engine(self.scheduler, backend, stops, MemoryRecorder(), clock=self.clock)

    def add(self, row: Row) -> None:
        true_length = self.true_lengths.get(row.request_id, row.params.max_new_tokens)
        self.outputs[row.request_id] = (min(true_length, row.params.max_new_tokens),
                                        true_length < row.params.max_new_tokens)
        self.engine.add(row)

    def run(self, max_rounds: int = 100_000, check: Callable[[Scheduler, RoundPlan], None] | None = None) -> None:
        if check is not None:
            plan = self.scheduler.plan

            def checked_plan(now_s: float):
                result = plan(now_s)
                check(self.scheduler, result[0])
                return result

            self.scheduler.plan = checked_plan  # type: ignore[method-assign]
        while self.scheduler.has_work and self.engine.num_rounds < max_rounds:
            self.finished.extend(self.engine.step())
