"""The round loop: plan → execute → commit → record.

`Engine` owns no policy (the scheduler decides), touches no device (the backend does) and changes
no row itself (the scheduler's commit step does); it drives a round and turns it into accounting
records for the ledger. The same loop runs the real models (`engine.build`) and the simulator
(`sim.worker`): `build_engine` assembles it from a job config and either backend.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from specbatch.config import JobConfig
from specbatch.core import Backend, RoundOutcome, RoundPlan, Row, Status
from specbatch.isolation import MAX_FAILED_IN_A_ROW, failure_message, is_request_fault, plan_rows, split_plan
from specbatch.records import RequestRecord, ResultRecord, RoundRecord, StepRecord, ms_since
from specbatch.sched.commit import commit_round
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import make_scheduler
from specbatch.sched.scheduler import Scheduler
from specbatch.sched.stops import StopChecker

log = logging.getLogger(__name__)


@contextmanager
def fewer_collections(threshold: int = 100_000) -> Iterator[None]:
    """CPython's cyclic collector, run every `threshold` container allocations instead of 700 while
    rounds run. A suffix drafter's index is hundreds of thousands of small objects, and each
    collection of the oldest generation walked all of them: SmolLM2, 32 rows, the job's drafting
    phases took 346 ms with the default threshold, 95 ms with this one (`specbatch bench`,
    `instruct`). Cyclic garbage is still collected, less often."""
    saved = gc.get_threshold()
    gc.set_threshold(threshold, *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


class Recorder(Protocol):
    def add_round(self, record: RoundRecord) -> None: ...
    def add_step(self, record: StepRecord) -> None: ...
    def add_request(self, record: RequestRecord) -> None: ...
    def add_result(self, record: ResultRecord) -> None: ...


class MemoryRecorder:
    """Keeps records in lists: for tests, benchmarks and callers that write nothing."""

    def __init__(self) -> None:
        self.rounds: list[RoundRecord] = []
        self.steps: list[StepRecord] = []
        self.requests: list[RequestRecord] = []
        self.results: list[ResultRecord] = []

    def add_round(self, record: RoundRecord) -> None:
        self.rounds.append(record)

    def add_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def add_request(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def add_result(self, record: ResultRecord) -> None:
        self.results.append(record)


@dataclass(frozen=True)
class EngineLimits:
    """What the models (or the simulator standing in for them) fix for an engine."""

    max_context: int  # positions a request may use (prompt + output)
    kv_capacity_tokens: int  # target KV token slots the scheduler may reserve
    eos_token_ids: frozenset[int]
    decode: Callable[[list[int]], str]  # token ids -> text, for stop strings and results
    kv_bytes_per_token: int = 0  # target + draft KV bytes of one position (0: unknown, the simulator)


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        backend: Backend,
        stops: StopChecker,
        recorder: Recorder,
        worker_id: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler, self.backend, self.stops, self.recorder = scheduler, backend, stops, recorder
        self.worker_id, self.clock = worker_id, clock
        self.num_rounds = 0
        self.num_failed_in_a_row = 0  # requests dropped as `failed` since a plan last succeeded

    def add(self, row: Row) -> None:
        row.arrival_s = row.arrival_s or self.clock()
        self.scheduler.add(row, row.arrival_s)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        with fewer_collections():
            while self.scheduler.has_work and not should_stop():
                self.step()

    def step(self) -> list[Row]:
        """One planned round (executed in parts if a request fails); returns the rows that finished."""
        started_s = self.clock()
        plan, admission = self.scheduler.plan(started_s)
        for row in admission.preempted:
            self.backend.release(row, finished=False)
        for row in admission.admitted:
            self.backend.admit(row)
        for row in admission.dropped:
            self.record_finished(row)
        if plan.is_empty:
            return list(admission.dropped)
        return list(admission.dropped) + self._serve(plan, started_s)

    def _serve(self, plan: RoundPlan, started_s: float) -> list[Row]:
        """Execute and commit a plan; returns the rows that finished. When execute raises for a
        request's fault (it wrote no row), the plan runs again in halves until the rows that fail run
        alone: those are dropped, every other row is committed and recorded as usual, each executed
        half as a round of its own. Failed attempts committed nothing and are no rounds."""
        try:
            outcome = self.backend.execute(plan)
        except Exception as error:
            if not is_request_fault(error):
                raise
            rows = plan_rows(plan)
            if len(rows) == 1:
                return [self._fail(rows[0], error)]
            return [row for half in split_plan(plan) for row in self._serve(half, self.clock())]
        self.num_failed_in_a_row = 0
        return self._commit(plan, outcome, started_s)

    def _commit(self, plan: RoundPlan, outcome: RoundOutcome, started_s: float) -> list[Row]:
        commit_started = time.perf_counter()
        emitted_s = self.clock()
        commit = commit_round(self.scheduler, self.stops, plan, outcome, emitted_s)
        for row_outcome, committed in commit.verified:
            self.recorder.add_step(StepRecord.of(row_outcome, committed, self.worker_id, self.num_rounds, emitted_s))
        for row in commit.finished:
            self.backend.release(row, finished=True)
            self.record_finished(row)
        commit_ms = ms_since(commit_started)
        round_ms = (self.clock() - started_s) * 1000  # the engine's clock: wall time, or virtual in the simulator
        kv = self.scheduler.kv
        record = RoundRecord.of(plan, outcome, commit.num_committed, worker_id=self.worker_id,
                                round_index=self.num_rounds, started_s=started_s, kv_tokens_in_use=kv.num_used,
                                kv_tokens_capacity=kv.capacity_tokens, commit_ms=commit_ms, round_ms=round_ms,
                                kv_use=kv.use())
        self.recorder.add_round(record)
        self.scheduler.observe_round(record, outcome.num_draft_prefill_positions, outcome.draft_prefill_ms)
        self.num_rounds += 1
        return commit.finished

    def _fail(self, row: Row, error: Exception) -> Row:
        """Drop a row whose execute raised while it ran alone, as `failed` with the error's message;
        raise instead when too many failed in a row (then the engine is broken, not a record)."""
        self.num_failed_in_a_row += 1
        if self.num_failed_in_a_row > MAX_FAILED_IN_A_ROW:
            raise error
        log.warning("request %s failed and is dropped: %s", row.request_id, failure_message(error))
        row.status, row.finished_s = Status.DROPPED, self.clock()
        row.drop_reason, row.drop_message = "failed", failure_message(error)
        self.scheduler.finish(row)
        self.backend.release(row, finished=True)
        self.record_finished(row)
        return row

    def cancel(self, rows: list[Row], reason: str) -> None:
        """Stop rows on purpose: waiting or running, each becomes `cancelled` with the tokens it has."""
        waiting = [row for row in rows if row.status is Status.WAITING]
        if waiting:
            self.scheduler.waiting.remove(waiting)
        now = self.clock()
        for row in rows:
            self.scheduler.finish(row)
            self.backend.release(row, finished=True)
            row.status, row.finished_s, row.drop_reason = Status.CANCELLED, now, reason
            self.record_finished(row)

    def cancel_all(self, reason: str = "job_cancelled") -> list[Row]:
        rows = list(self.scheduler.running) + [entry[2] for entry in self.scheduler.waiting]
        self.cancel(rows, reason)
        return rows

    def record_finished(self, row: Row) -> None:
        """Request + result records of a row that is done (completed, dropped or cancelled)."""
        self.stops.forget(row)
        finished_s = row.finished_s if row.finished_s is not None else self.clock()
        self.recorder.add_request(RequestRecord.of(row, self.worker_id, finished_s))
        text = self.stops.text(row) if row.status is not Status.DROPPED else None
        self.recorder.add_result(ResultRecord.of(row, text))


def build_engine(
    config: JobConfig,
    backend: Backend,
    limits: EngineLimits,
    recorder: Recorder,
    worker_id: int = 0,
    clock: Callable[[], float] = time.time,
    scheduler_cost: CostModel | None = None,
) -> Engine:
    """The engine of one worker over any backend: the config's scheduler and policies, stops.

    `scheduler_cost` is what the scheduler's policies believe about round times; by default the
    config's (`scheduler.cost_model`, else the CPU profile)."""
    scheduler = make_scheduler(config, limits.kv_capacity_tokens, limits.max_context, scheduler_cost,
                               limits.kv_bytes_per_token)
    backend.use_kv_blocks(scheduler.kv)
    stops = StopChecker(set(limits.eos_token_ids), limits.decode, limits.max_context)
    return Engine(scheduler, backend, stops, recorder, worker_id, clock)


def generate(engine: Engine, rows: list[Row]) -> dict[str, Row]:
    """Run rows to completion on an engine; returns them by request id (tests, benchmarks)."""
    for row in rows:
        engine.add(row)
    engine.run()
    return {row.request_id: row for row in rows}
