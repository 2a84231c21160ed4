"""One worker process: its shards → engine → ledger parts.

Worker i of N takes shards i, i + N, ... of the manifest. It skips every request that already has a
committed completed or dropped result (resume; a cancelled one runs again), streams shards into the
engine so batching continues across shard boundaries, flushes parts every N requests or T seconds,
and on a stop request cancels what is in flight (recorded as `cancelled` with its tokens) and
commits before returning.
Launched in-process by `specbatch submit`, as `accelerate launch ... -m specbatch.job.worker`, or as
a worker flow run of a `pool` job (`specbatch.job.pool`).

On an object store the worker never writes the manifest (the flow marks shards, see manifest.py) and
its per-id lock is a lease (`specbatch.job.lease`) instead of an `flock`.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.core import Row, SamplingParams, Status
from specbatch.data.shards import SHARDS_FOLDER, read_shard_requests
from specbatch.data.validate import Request
from specbatch.engine.build import Models, build_hf_engine, load_models
from specbatch.engine.graphs import use_compile_cache
from specbatch.faults import crash_point
from specbatch.fences import run_epoch
from specbatch.job.finalize import DONE_STATUSES
from specbatch.job.lease import LeaseHeldError, hold_lease
from specbatch.job.lock import check_epoch
from specbatch.job.manifest import ShardEntry, append_part, load_manifest, update_manifest
from specbatch.ledger import PartWriter, committed_request_ids, remove_orphan_parts
from specbatch.loop import Engine, fewer_collections
from specbatch.storage import Location, is_url, join, open_no_follow, open_storage

log = logging.getLogger(__name__)


@dataclass
class WorkerProgress:
    """Raw counters a progress display derives rates from."""

    num_done: int = 0
    num_dropped: int = 0
    num_cancelled: int = 0
    num_committed_tokens: int = 0
    num_proposed: int = 0
    num_accepted: int = 0

    def add(self, status: str, num_output_tokens: int, num_proposed: int, num_accepted: int) -> None:
        """Count one finished request; the arguments are its `requests` columns of the same names."""
        self.num_done += 1
        self.num_dropped += status == Status.DROPPED.value
        self.num_cancelled += status == Status.CANCELLED.value
        self.num_committed_tokens += num_output_tokens
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted


def my_shards(job_dir: Location, worker_id: int, num_workers: int) -> list[ShardEntry]:
    shards = load_manifest(job_dir).shards
    return [shard for index, shard in enumerate(shards) if index % num_workers == worker_id]


def max_request_tokens(shards: list[ShardEntry]) -> int | None:
    """The longest request (prompt + max_new_tokens) of these shards, which the worker's KV slots
    are sized to; None when a shard has no record of it (ingested before it was kept)."""
    needs = [shard.max_request_tokens for shard in shards if shard.max_request_tokens is not None]
    return max(needs, default=0) if len(needs) == len(shards) else None


def shared_prefix_tokens(shards: list[ShardEntry]) -> int:
    """The room the worker's KV pool keeps for shared prefixes: the most any one of its shards' prompts
    share, since its rows run shard after shard (a feed a few rows ahead of the batch)."""
    return max((shard.shared_prefix_tokens for shard in shards), default=0)


def to_row(request: Request) -> Row:
    """A shard row as engine state; a dropped row keeps zeroed limits (it never runs)."""
    params = SamplingParams(
        max_new_tokens=request.max_new_tokens or 0, temperature=request.temperature or 0.0,
        top_p=request.top_p or 1.0, seed=request.seed, stop=tuple(request.stop or ()),
        constraint=request.constraint,
    )
    row = Row(request.request_id, list(request.prompt_token_ids or []), params, request.domain or "")
    row.metadata = request.metadata
    if request.is_dropped:
        row.status, row.drop_reason = Status.DROPPED, request.drop_reason
        row.drop_message = request.drop_message
    return row


def pending_requests(job_dir: Location, shard_names: list[str], done: set[str]) -> Iterator[tuple[str, Request]]:
    for name in shard_names:
        for request in read_shard_requests(join(job_dir, SHARDS_FOLDER, name)):
            if request.request_id not in done:
                yield name, request


def run_worker(
    job_dir: Location,
    config: JobConfig,
    worker_id: int = 0,
    num_workers: int = 1,
    run_id: str | None = None,
    models: Models | None = None,
    stop_requested: threading.Event | None = None,
    on_round: Callable[[WorkerProgress], None] | None = None,
) -> WorkerProgress:
    """Run this worker's share of the job to completion (or until a stop is requested), holding
    the worker's lock."""
    job_dir = job_dir if is_url(job_dir) else Path(job_dir)
    stop_requested = stop_requested or threading.Event()
    run_id = run_id or time.strftime("%Y%m%dT%H%M%S")
    with worker_lock(job_dir, worker_id, lease_s=config.workers.lease_s) as lease_lost:  # one runner per id
        remove_orphan_parts(job_dir, worker_id)
        done = committed_request_ids(job_dir, DONE_STATUSES)  # cancelled rows, even late ones, run again
        shards = my_shards(job_dir, worker_id, num_workers)
        names = [shard.name for shard in shards]
        if config.models.graphs != "eager":
            use_compile_cache(open_storage(job_dir).local_dir() / "compile-cache")
        models = models or load_models(config)
        writer = PartWriter(job_dir, worker_id, run_id, config.io.part_every_requests, config.io.part_every_s,
                            before_commit=lambda: _check_commit(job_dir, run_id, lease_lost, worker_id))
        engine = build_hf_engine(config, models, writer, worker_id, max_request_tokens(shards),
                                 shared_prefix_tokens(shards))
        progress = WorkerProgress()
        _mark_shards(job_dir, names, "running", worker_id)
        feed = pending_requests(job_dir, names, done)
        backlog = 2 * config.scheduler.max_batch_rows
        exhausted = False
        with fewer_collections():
            while not stop_requested.is_set():
                while not exhausted and len(engine.scheduler.waiting) < backlog:
                    exhausted = not _admit_next(engine, feed, progress)
                if not engine.scheduler.has_work:
                    break
                _count(engine.step(), progress)
                crash_point("round")
                _check_lease(lease_lost, worker_id)
                _record_part(job_dir, writer.maybe_flush())
                if on_round is not None:
                    on_round(progress)
        if stop_requested.is_set():
            _count(engine.cancel_all(), progress)
        _check_lease(lease_lost, worker_id)
        _record_part(job_dir, writer.flush())
        if exhausted and not engine.scheduler.has_work:
            _mark_shards(job_dir, names, "done", worker_id)
        return progress


def _check_commit(job_dir: Location, run_id: str, lease_lost: Callable[[], bool], worker_id: int) -> None:
    """Right before a part's commit: this worker's lease and the job's lease epoch its run id carries
    are still held (a part that loses a race with a takeover anyway is fenced out by the new holder)."""
    _check_lease(lease_lost, worker_id)
    check_epoch(job_dir, run_epoch(run_id))


def _check_lease(lease_lost: Callable[[], bool], worker_id: int) -> None:
    """A worker whose lease was taken over (it stalled past its expiry) stops before committing more."""
    if lease_lost():
        raise RuntimeError(f"worker {worker_id} lost its lease to a newer run of the same worker id; "
                           "stopping without committing (the other run owns these requests now)")


def _admit_next(engine: Engine, feed: Iterator[tuple[str, Request]], progress: WorkerProgress) -> bool:
    """Move one request from the shards into the engine; dropped ones are recorded directly."""
    item = next(feed, None)
    if item is None:
        return False
    row = to_row(item[1])
    if row.status is Status.DROPPED:
        engine.record_finished(row)
        _count([row], progress)
    else:
        engine.add(row)
    return True


def _count(rows: list[Row], progress: WorkerProgress) -> None:
    for row in rows:
        progress.add(row.status.value, row.num_output_tokens, row.num_proposed, row.num_accepted)


def _record_part(job_dir: Location, name: str | None) -> None:
    """After a part's commit (its results file renamed), list it in the manifest's journal."""
    if name is None:
        return
    crash_point("part_committed")
    append_part(job_dir, name)


def _mark_shards(job_dir: Location, names: list[str], status: str, worker_id: int) -> None:
    if is_url(job_dir):
        return  # only the job's lease holder writes a manifest on an object store
    wanted = set(names)

    def change(manifest):
        for shard in manifest.shards:
            if shard.name in wanted:
                shard.status, shard.worker_id = status, worker_id

    update_manifest(job_dir, change)


def mark_group_shards(job_dir: Location, num_workers: int, status: str, epoch: int = 0) -> None:
    """Mark the job's shards `status`, shard i with worker i % num_workers (as `my_shards` deals them);
    marking them `running` leaves `done` shards as they are. The flow does this for its workers on an
    object store, fenced by its lease's `epoch` (`update_manifest`)."""

    def change(manifest):
        for index, shard in enumerate(manifest.shards):
            if status != "running" or shard.status != "done":
                shard.status, shard.worker_id = status, index % num_workers

    update_manifest(job_dir, change, epoch)


def main(argv: list[str] | None = None) -> int:
    """Entry point for `accelerate launch -m specbatch.job.worker JOB_DIR --run-id R` (one process per device),
    or `python -m specbatch.job.worker JOB_DIR --run-id R --worker-id I --num-workers N` (no accelerate).

    SIGINT / SIGTERM stop the worker: in-flight requests are recorded as cancelled and committed.
    Exit code 0 when its shards are done, 130 when stopped.
    """
    parser = argparse.ArgumentParser(description="One specbatch worker process.")
    parser.add_argument("job_dir", help="a local path or an object-store URL")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--worker-id", type=int, help="without accelerate: this worker's index")
    parser.add_argument("--num-workers", type=int, help="without accelerate: the number of workers")
    args = parser.parse_args(argv)
    config = JobConfig.model_validate(load_manifest(args.job_dir).config)
    worker_id, num_workers, device = _placement(args, config)
    config = config.model_copy(update={"models": config.models.model_copy(update={"device": device})})
    logging.basicConfig(level=logging.INFO, format=f"[worker {worker_id}] %(asctime)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    run_worker(args.job_dir, config, worker_id, num_workers, args.run_id, stop_requested=stop)
    log.info("worker %d %s", worker_id, "stopped" if stop.is_set() else "done")
    return 130 if stop.is_set() else 0


def _placement(args: argparse.Namespace, config: JobConfig) -> tuple[int, int, str]:
    """(worker id, number of workers, device) from the arguments, or from accelerate's process state."""
    import torch

    on_cpu = config.models.device == "cpu" or not torch.cuda.is_available()
    if args.worker_id is not None:
        num_workers = args.num_workers or 1
        if on_cpu or not 0 <= args.worker_id < num_workers:
            return args.worker_id, num_workers, "cpu" if on_cpu else config.models.device
        return args.worker_id, num_workers, f"cuda:{args.worker_id % torch.cuda.device_count()}"
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True) if on_cpu else Accelerator()
    return accelerator.process_index, accelerator.num_processes, str(accelerator.device)


@contextmanager
def worker_lock(job_dir: Location, worker_id: int, timeout_s: float = 60.0,
                lease_s: float = 30.0) -> Iterator[Callable[[], bool]]:
    """Hold JOB_DIR/.worker-NN.lock: a worker waits for a stale one with its id (a killed launcher's
    child still committing) instead of writing the same requests beside it. On an object store, the
    lease `.worker-NN-lease/`; a killed worker's lease expires `lease_s` after its last renewal.
    Yields a check that says whether the lease was lost (taken over; never on a local disk)."""
    if is_url(job_dir):
        try:
            with hold_lease(open_storage(job_dir), f".worker-{worker_id:02d}-lease", lease_s,
                            wait_s=max(timeout_s, 2 * lease_s)) as lease:
                yield lambda: lease.lost
        except LeaseHeldError as error:
            raise RuntimeError(f"worker {worker_id} of {job_dir} is still running ({error})") from None
        return
    path = Path(job_dir) / f".worker-{worker_id:02d}.lock"
    with os.fdopen(open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as lock_file:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {worker_id} of {job_dir} is still running") from None
                time.sleep(0.5)
        yield lambda: False


if __name__ == "__main__":
    sys.exit(main())
