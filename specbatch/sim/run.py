"""`simulate`: N simulated workers serving a declared request stream, written as a real job.

Event loop. Each worker has its own virtual clock: the time its next round starts. The loop always
takes the earliest event: the next arrival, or the worker whose next round starts first (an
arrival at the same instant goes first, so it can join that round). A round runs whole when it
starts (plan → execute → commit → record); its rows finish at its end, which becomes the worker's
clock. Ties go to the lower worker id. Nothing depends on host time except `plan_ms` and
`commit_ms`, which are real measurements of the scheduler and commit code.

Dispatch. An arriving request joins the worker with the fewest requests in its system at that
instant (waiting + running + those finishing in the round in flight; ties: lower worker id),
like a join-shortest-queue router in front of N servers. With `max_waiting_per_worker`, a worker
whose waiting queue is full takes nothing; when all are full the request waits in a shared FIFO
that workers drain after each round (the real batch worker keeps 2 × max_batch_rows waiting).

Rules, all counted (completed + dropped + cancelled = N, every one in `results`):
- a prompt longer than max_context − 1 is dropped on arrival (`prompt_too_long`), as ingest does;
- the scheduler drops what can never fit its KV capacity (`exceeds_kv_capacity`);
- with `deadline_s`, a request still unfinished that long after its arrival is cancelled
  (`deadline`) at the start of its worker's first round at or after the deadline, with the
  tokens it has;
- warmup: the first ⌈warmup_fraction · N⌉ requests to arrive are marked in `results.metadata`
  (`{"sim_warmup": true}`) and left out of the latency figures of the summary, never out of
  the tables or the counts.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import resource
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from specbatch.config import JobConfig, config_to_dict
from specbatch.core import Row, SamplingParams, Status
from specbatch.ledger import TABLES, committed_parts
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import resolve_cost_model
from specbatch.sim.acceptance import AcceptanceModel, DrafterAcceptance
from specbatch.sim.backend import SIM_TOKEN_ID
from specbatch.sim.summary import SimSummary, SummaryCollector
from specbatch.sim.worker import SimWorker, new_worker, sim_max_context
from specbatch.sim.workload import SyntheticRequest

log = logging.getLogger(__name__)

WARMUP_METADATA = json.dumps({"sim_warmup": True})
SUMMARY_NAME = "simulation.json"
MAX_IDLE_STEPS = 8  # consecutive steps that plan nothing (e.g. after preempting every row) before giving up


class RequestSource(Protocol):
    """Requests sorted by arrival: `SyntheticRequests`, or a list of `SyntheticRequest`."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> SyntheticRequest: ...


@dataclass(frozen=True)
class SimOptions:
    workers: int = 1
    warmup_fraction: float = 0.0  # first ⌈fraction · N⌉ arrivals: recorded, marked, not in latency figures
    deadline_s: float | None = None  # cancel a request unfinished this long after its arrival
    step_sample_every: int = 1  # record steps of every m-th request by arrival order (1: all, 0: none)
    max_waiting_per_worker: int | None = None  # None: every arrival is dispatched at once
    records_per_part: int = 20_000  # records buffered per worker before a part is written (memory)
    overwrite: bool = False  # replace a job directory that already has parts
    timing_noise: float = 0.0  # σ of log round speed, seeded per worker (SimBackend); 0: rounds take their price
    # prompts open with one of `num_prefixes` shared blocks of this many tokens (request i takes block
    # i mod num_prefixes), then a part of their own; 0: no two prompts share anything
    shared_prefix_tokens: int = 0
    num_prefixes: int = 1
    # a job of several drafters (drafter.kind): a row's α under drafter d is its α times this (1 if absent)
    drafter_alpha_scale: tuple[tuple[str, float], ...] = ()
    # the share of a lookup drafter's lookups (n-gram, suffix) that find a match (1 if absent)
    lookup_match_rate: tuple[tuple[str, float], ...] = ()
    # the share of a matched lookup's drafts after its first that it offers, up to k (1 if absent)
    lookup_continue_rate: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1 or self.step_sample_every < 0 or self.records_per_part < 1:
            raise ValueError("need workers >= 1, step_sample_every >= 0, records_per_part >= 1")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.shared_prefix_tokens < 0 or self.num_prefixes < 1:
            raise ValueError("need shared_prefix_tokens >= 0 and num_prefixes >= 1")
        if self.timing_noise < 0:
            raise ValueError(f"timing_noise must be >= 0, got {self.timing_noise}")
        if not all(0.0 <= rate <= 1.0 for _, rate in self.lookup_match_rate):
            raise ValueError(f"a lookup match rate is a share in [0, 1], got {self.lookup_match_rate}")
        if not all(0.0 <= rate <= 1.0 for _, rate in self.lookup_continue_rate):
            raise ValueError(f"a lookup continue rate is a share in [0, 1], got {self.lookup_continue_rate}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.max_waiting_per_worker is not None and self.max_waiting_per_worker < 1:
            raise ValueError("max_waiting_per_worker must be >= 1")


@dataclass
class _State:
    """What the event loop shares with its helpers."""

    workers: list[SimWorker]
    options: SimOptions
    max_prompt_tokens: int
    outputs: dict[str, tuple[int, bool]] = field(default_factory=dict)  # live requests only
    sampled: set[str] = field(default_factory=set)  # live requests whose steps are recorded
    busy: list[tuple[float, int]] = field(default_factory=list)  # heap of (next round start, worker id)
    in_busy: list[bool] = field(default_factory=list)
    overflow: deque[Row] = field(default_factory=deque)
    progress: Callable[[int, int], None] | None = None  # (requests accounted, all requests)
    next_progress: int = 0


def simulate(
    config: JobConfig,
    requests: RequestSource,
    acceptance: AcceptanceModel | DrafterAcceptance,
    job_dir: str | Path,
    cost_model: CostModel | None = None,
    options: SimOptions | None = None,
    description: str = "",
    scheduler_cost_model: CostModel | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimSummary:
    """Serve `requests` on `options.workers` simulated workers; write the job's Parquet tables and
    `simulation.json` (config, cost model, options, summary) into job_dir; return the summary.

    `cost_model` is the simulated truth: every round takes its prediction (default: the config's
    `scheduler.cost_model` file, else the CPU demo profile). `scheduler_cost_model` is what the
    scheduler and its policies believe; by default the config's, as the real engine builds it.
    `progress(accounted, total)` is called about every 1% of the requests."""
    options = options or SimOptions()
    cost = cost_model or resolve_cost_model(None, config)
    job_dir = _fresh_job_dir(Path(job_dir), options.overwrite)
    started = time.perf_counter()
    state = _State([], options, sim_max_context(config) - 1, progress=progress)
    sampled = None if options.step_sample_every == 1 else state.sampled
    state.workers = [new_worker(config, cost, acceptance, state.outputs, job_dir, w, sampled, scheduler_cost_model,
                                options.timing_noise, options.shared_prefix_tokens > 0,
                                dict(options.drafter_alpha_scale), dict(options.lookup_match_rate),
                                dict(options.lookup_continue_rate))
                     for w in range(options.workers)]
    state.in_busy = [False] * options.workers
    collector = SummaryCollector(len(requests), math.ceil(options.warmup_fraction * len(requests)))
    _event_loop(state, requests, config, collector)
    for worker in state.workers:
        worker.writer.flush()
    summary = collector.summary(job_dir, state.workers, time.perf_counter() - started, _peak_rss_mb())
    believed = scheduler_cost_model or resolve_cost_model(None, config)
    _write_summary(job_dir, config, cost, believed, options, description, summary)
    return summary


def _event_loop(state: _State, requests: RequestSource, config: JobConfig, collector: SummaryCollector) -> None:
    params = SamplingParams(max_new_tokens=config.sampling.max_new_tokens, temperature=config.sampling.temperature,
                            top_p=config.sampling.top_p)
    prompts: dict[int, list[int]] = {}  # prompt lists by length, built once (a Row copies its own)
    num, index = len(requests), 0
    upcoming = requests[0] if num else None
    while upcoming is not None or state.busy:
        next_round = state.busy[0][0] if state.busy else math.inf
        if upcoming is not None and upcoming.arrival_s <= next_round:
            row = _to_row(upcoming, index, params, prompts, state, collector)
            _dispatch(state, row, collector)
            index += 1
            upcoming = requests[index] if index < num else None
            continue
        _, worker_id = heapq.heappop(state.busy)
        state.in_busy[worker_id] = False
        worker = state.workers[worker_id]
        finished = worker.cancel_due() + worker.step()
        if worker.num_idle_steps > MAX_IDLE_STEPS:
            raise RuntimeError(f"worker {worker_id}: {worker.num_idle_steps} empty plans in a row with work pending")
        _finish(state, finished, collector)
        _pull_overflow(state, worker, collector)
        if worker.writer.num_buffered >= state.options.records_per_part:
            worker.writer.flush()
        _mark_busy(state, worker)
    if state.overflow:
        raise RuntimeError("requests left in the shared queue with every worker idle")


def _to_row(request: SyntheticRequest, index: int, params: SamplingParams, prompts: dict[int, list[int]],
            state: _State, collector: SummaryCollector) -> Row:
    if params.max_new_tokens != request.max_new_tokens:
        params = SamplingParams(request.max_new_tokens, params.temperature, params.top_p)
    prompt = _prompt(request.num_prompt_tokens, index, prompts, state.options)
    row = Row(request.request_id, prompt, params, request.domain, request.arrival_s)
    if index < collector.num_warmup:
        row.metadata = WARMUP_METADATA
    state.outputs[row.request_id] = (request.num_output_tokens, request.finish_reason == "eos")
    step_every = state.options.step_sample_every
    if step_every > 1 and index % step_every == 0:
        state.sampled.add(row.request_id)
    return row


def _prompt(num_tokens: int, index: int, prompts: dict[int, list[int]], options: SimOptions) -> list[int]:
    """Filler tokens, one list per length (a Row copies it into its `token_ids`); with shared prefixes, request
    `index`'s block (token -1 - block) and then a token of its own, so it shares exactly the block."""
    shared = min(options.shared_prefix_tokens, num_tokens - 1)
    if shared <= 0:
        prompt = prompts.get(num_tokens)
        if prompt is None:
            prompt = prompts[num_tokens] = [SIM_TOKEN_ID] * num_tokens
        return prompt
    block = -1 - index % options.num_prefixes
    return [block] * shared + [SIM_TOKEN_ID + 1 + index] + [SIM_TOKEN_ID] * (num_tokens - shared - 1)


def _dispatch(state: _State, row: Row, collector: SummaryCollector) -> None:
    now = row.arrival_s
    limit = state.options.max_waiting_per_worker
    open_workers = [w for w in state.workers if limit is None or w.num_waiting < limit]
    if not open_workers and row.num_prompt_tokens <= state.max_prompt_tokens:
        state.overflow.append(row)
        return
    worker = min(open_workers or state.workers, key=lambda w: (w.load_at(now), w.worker_id))
    if row.num_prompt_tokens > state.max_prompt_tokens:
        row.status, row.finished_s, row.drop_reason = Status.DROPPED, now, "prompt_too_long"
        row.drop_message = f"prompt has {row.num_prompt_tokens} tokens; at most {state.max_prompt_tokens} fit"
        worker.record(row)
        _finish(state, [row], collector)
        return
    worker.add(row, now, state.options.deadline_s)
    _mark_busy(state, worker)


def _pull_overflow(state: _State, worker: SimWorker, collector: SummaryCollector) -> None:
    limit, now, deadline = state.options.max_waiting_per_worker, worker.clock.now_s, state.options.deadline_s
    while state.overflow and (limit is None or worker.num_waiting < limit):
        row = state.overflow.popleft()
        if deadline is not None and row.arrival_s + deadline <= now:
            row.status, row.finished_s, row.drop_reason = Status.CANCELLED, now, "deadline"
            worker.record(row)
            _finish(state, [row], collector)
            continue
        worker.add(row, now, deadline)


def _mark_busy(state: _State, worker: SimWorker) -> None:
    if worker.has_work and not state.in_busy[worker.worker_id]:
        heapq.heappush(state.busy, (worker.clock.now_s, worker.worker_id))
        state.in_busy[worker.worker_id] = True


def _finish(state: _State, rows: list[Row], collector: SummaryCollector) -> None:
    for row in rows:
        state.outputs.pop(row.request_id, None)
        state.sampled.discard(row.request_id)
        collector.add(row, is_warmup=row.metadata is WARMUP_METADATA)
    if state.progress is not None and collector.num_accounted >= state.next_progress:
        state.progress(collector.num_accounted, collector.num_requests)
        state.next_progress = collector.num_accounted + max(1, collector.num_requests // 100)


def _fresh_job_dir(job_dir: Path, overwrite: bool) -> Path:
    if committed_parts(job_dir) or any((job_dir / t).is_dir() and any((job_dir / t).iterdir()) for t in TABLES):
        if not overwrite:
            raise FileExistsError(f"{job_dir} already holds a job; pass overwrite to replace it")
        for table in TABLES:
            shutil.rmtree(job_dir / table, ignore_errors=True)
    job_dir.mkdir(parents=True, exist_ok=True)
    return job_dir


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _write_summary(job_dir: Path, config: JobConfig, cost: CostModel, believed: CostModel, options: SimOptions,
                   description: str, summary: SimSummary) -> None:
    document = {
        "kind": "simulation",
        "workload": description,
        "options": asdict(options),
        "cost_model": asdict(cost),  # the simulated round times
        "scheduler_cost_model": asdict(believed),  # what the scheduler and its policies predicted with
        "config": config_to_dict(config),
        "summary": summary.to_dict(),
    }
    (job_dir / SUMMARY_NAME).write_text(json.dumps(document, indent=2) + "\n")
