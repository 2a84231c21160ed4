"""One simulated worker: the real `Scheduler` and `Engine` over a `SimBackend` and its own virtual clock.

Assembled by the same `loop.build_engine` as a real worker (same limits, KV capacity rule, shape
buckets and policies), so every policy the factory knows runs here unchanged. The worker also owns
what a server adds around the engine: cancelling requests past their deadline, and its load as the
dispatcher sees it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbatch.config import JobConfig
from specbatch.core import Row
from specbatch.ledger import PartWriter
from specbatch.loop import Engine, EngineLimits, Recorder, build_engine
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import job_buckets
from specbatch.sim.acceptance import AcceptanceModel, DrafterAcceptance
from specbatch.sim.backend import SIM_EOS_TOKEN_ID, SimBackend, VirtualClock, sim_decode

RUN_ID = "sim"  # part names: part-wNN-sim-SEQ
DEFAULT_MAX_CONTEXT = 4096  # positions per request when the config does not set capacity.max_context


class StepSampler:
    """A recorder in front of a `PartWriter` that keeps steps only of sampled requests (the steps
    table has one row per request per round: tens of millions of rows at a million requests)."""

    def __init__(self, writer: PartWriter, sampled: set[str]) -> None:
        self.writer, self.sampled = writer, sampled

    def add_round(self, record: Any) -> None:
        self.writer.add_round(record)

    def add_step(self, record: Any) -> None:
        if record.request_id in self.sampled:
            self.writer.add_step(record)

    def add_request(self, record: Any) -> None:
        self.writer.add_request(record)

    def add_result(self, record: Any) -> None:
        self.writer.add_result(record)


def sim_max_context(config: JobConfig) -> int:
    return config.capacity.max_context or DEFAULT_MAX_CONTEXT


def sim_kv_capacity_tokens(config: JobConfig, slot_len: int) -> int:
    """As `build.kv_capacity_tokens`; a capacity in bytes needs a model, so it must be in tokens."""
    if config.capacity.kv_tokens:
        return config.capacity.kv_tokens
    if config.capacity.kv_bytes:
        raise ValueError("the simulator has no model to size capacity.kv_bytes; set capacity.kv_tokens")
    return config.scheduler.max_batch_rows * slot_len


def build_sim_engine(
    config: JobConfig,
    cost: CostModel,
    acceptance: AcceptanceModel | DrafterAcceptance,
    outputs: Mapping[str, tuple[int, bool]],
    recorder: Recorder,
    worker_id: int = 0,
    scheduler_cost: CostModel | None = None,
    timing_noise: float = 0.0,
    shared_prefixes: bool = False,
    drafter_alpha_scale: Mapping[str, float] | None = None,
    lookup_match_rate: Mapping[str, float] | None = None,
    lookup_continue_rate: Mapping[str, float] | None = None,
) -> tuple[Engine, VirtualClock]:
    """An `Engine` whose backend and clock are simulated; everything else is the real thing.

    `cost` is the simulated truth (round times, each scaled by a seeded factor where `timing_noise`
    is set: `SimBackend`); `scheduler_cost` is what the scheduler and its policies believe, by
    default the config's, exactly as the real engine's scheduler is built. Prefix reuse
    (`cache.prefix`) runs only where the rows' prompts model `shared_prefixes`: without, every
    simulated prompt is the same filler token and would match every other whole. A job of several
    drafters (`drafter.kind`) draws a row's acceptance under drafter d as its α times
    `drafter_alpha_scale[d]`; a lookup by drafter d matches with probability `lookup_match_rate[d]`
    and offers each draft after its first with probability `lookup_continue_rate[d]` (`SimBackend`)."""
    if not shared_prefixes:
        config = config.model_copy(update={"cache": config.cache.model_copy(update={"prefix": False})})
    context = sim_max_context(config)
    slot_len = context + config.max_lookahead + 1
    buckets = job_buckets(config)
    clock = VirtualClock()
    backend = SimBackend(cost, acceptance, clock, buckets, slot_len, config.drafter.kind, outputs, config.seed,
                         timing_noise, worker_id, drafter_alpha_scale, lookup_match_rate, lookup_continue_rate)
    limits = EngineLimits(context, sim_kv_capacity_tokens(config, slot_len), frozenset({SIM_EOS_TOKEN_ID}),
                          sim_decode)
    return build_engine(config, backend, limits, recorder, worker_id, clock, scheduler_cost), clock


@dataclass
class SimWorker:
    worker_id: int
    engine: Engine
    clock: VirtualClock
    writer: PartWriter
    deadlines: list[tuple[float, int, Row]] = field(default_factory=list)  # heap
    num_finished_in_flight: int = 0  # rows finished by the round that ends at clock.now_s
    first_round_s: float | None = None  # start of its first round and end of its last: its span
    last_round_end_s: float | None = None
    num_idle_steps: int = 0  # consecutive steps that neither ran a round nor finished a row
    _counter: itertools.count = field(default_factory=itertools.count)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting)

    @property
    def has_work(self) -> bool:
        return self.engine.scheduler.has_work

    def load_at(self, now_s: float) -> int:
        """Requests in this worker's system at `now_s`: waiting + running, plus those that finish
        only when its in-flight round ends (after now_s)."""
        in_flight = self.num_finished_in_flight if self.clock.now_s > now_s else 0
        return len(self.engine.scheduler.waiting) + len(self.engine.scheduler.running) + in_flight

    def add(self, row: Row, now_s: float, deadline_s: float | None) -> None:
        if not self.has_work:
            self.clock.now_s = max(self.clock.now_s, now_s)  # an idle worker wakes at the arrival
        self.engine.scheduler.add(row, now_s)
        if deadline_s is not None:
            heapq.heappush(self.deadlines, (row.arrival_s + deadline_s, next(self._counter), row))

    def record(self, row: Row) -> None:
        """Record a request that never reaches the scheduler (dropped or cancelled on arrival)."""
        self.engine.record_finished(row)

    def cancel_due(self) -> list[Row]:
        """Cancel (reason `deadline`) every unfinished row whose deadline is at or before now."""
        now, due = self.clock.now_s, []
        while self.deadlines and self.deadlines[0][0] <= now:
            row = heapq.heappop(self.deadlines)[2]
            if not row.is_finished:
                due.append(row)
        if due:
            self.engine.cancel(due, "deadline")
        return due

    def step(self) -> list[Row]:
        started_s, num_rounds = self.clock.now_s, self.engine.num_rounds
        finished = self.engine.step()
        self.num_finished_in_flight = len(finished)
        if self.engine.num_rounds > num_rounds:
            self.first_round_s = started_s if self.first_round_s is None else self.first_round_s
            self.last_round_end_s = self.clock.now_s
        self.num_idle_steps = 0 if finished or self.engine.num_rounds > num_rounds else self.num_idle_steps + 1
        return finished


def new_worker(
    config: JobConfig,
    cost: CostModel,
    acceptance: AcceptanceModel | DrafterAcceptance,
    outputs: Mapping[str, tuple[int, bool]],
    job_dir: Path,
    worker_id: int,
    sampled_steps: set[str] | None,
    scheduler_cost: CostModel | None = None,
    timing_noise: float = 0.0,
    shared_prefixes: bool = False,
    drafter_alpha_scale: Mapping[str, float] | None = None,
    lookup_match_rate: Mapping[str, float] | None = None,
    lookup_continue_rate: Mapping[str, float] | None = None,
) -> SimWorker:
    """A worker writing parts into job_dir (`sampled_steps` None: every step is recorded)."""
    writer = PartWriter(job_dir, worker_id, RUN_ID, every_requests=2**62, every_s=float("inf"), durable=False)
    recorder: Recorder = writer if sampled_steps is None else StepSampler(writer, sampled_steps)
    engine, clock = build_sim_engine(config, cost, acceptance, outputs, recorder, worker_id, scheduler_cost,
                                     timing_noise, shared_prefixes, drafter_alpha_scale, lookup_match_rate,
                                     lookup_continue_rate)
    return SimWorker(worker_id, engine, clock, writer)
