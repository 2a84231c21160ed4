"""`workers.placement: pool`: a job's workers as flow runs of a deployment, on any machine of a work pool.

The `specbatch-job` flow registers the deployment `specbatch-worker/POOL` (a module entry point, so a
Prefect worker started in any directory where specbatch is installed can run it), then starts one
flow run per worker slot with `run_deployment`. Each run is worker `i` of `slots`: it takes shards
`i, i + slots, ...` from the job's storage and commits its own ledger parts there, as a local worker
process would. The parent polls the runs, starts a failed or crashed one again (up to
`workers.worker_retries` times per worker id; the new run skips what the failed one committed), and
returns once every worker id has completed.

Each run's idempotency key names the job, the parent flow run and the worker id and attempt: a
retried parent (the `run-workers` task, or a flow run retried by Prefect) finds the runs it had
started instead of starting twice as many workers. Only the parent writes the manifest (it marks the
shards); the workers need nothing but the job's URL, the object store's credentials and the Prefect
API. "One run per GPU machine" is the Prefect worker's `--limit 1` on each machine (or a concurrency
limit on the work queue); see docs/deployment.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prefect import flow, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelling

from specbatch.config import JobConfig
from specbatch.fences import epoch_run_id
from specbatch.job.inputs import JobError
from specbatch.job.launch import LedgerWatcher, WorkerGroupError
from specbatch.job.lock import check_epoch
from specbatch.job.manifest import load_manifest
from specbatch.job.worker import WorkerProgress, mark_group_shards, run_worker
from specbatch.storage import location_name

log = logging.getLogger(__name__)

WORKER_FLOW = "specbatch-worker"
POLL_S = 1.0


@flow(name=WORKER_FLOW, persist_result=False, log_prints=False)
def specbatch_worker(job_dir: str, worker_id: int, num_workers: int, run_id: str) -> dict:
    """One worker of a `pool` job: its shards of JOB_DIR (a URL every machine reaches) → ledger parts."""
    config = JobConfig.model_validate(load_manifest(job_dir).config)
    progress = run_worker(job_dir, config, worker_id, num_workers, run_id)
    return asdict(progress)


def register_worker_deployment(pool: str) -> str:
    """Create or update the deployment `specbatch-worker/POOL` on work pool POOL; returns its name."""
    from prefect.exceptions import ObjectNotFound
    from prefect.types.entrypoint import EntrypointType

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise JobError(f"there is no work pool {pool!r} on {PREFECT_API_URL.value()}: create it with "
                           f"`prefect work-pool create {pool} --type process`, or set workers.pool") from None

    deployment: Any = specbatch_worker.to_deployment(
        name=pool, entrypoint_type=EntrypointType.MODULE_PATH,
        description="One worker of a specbatch job with workers.placement=pool (started by specbatch-job).",
        job_variables={"env": {"PREFECT_LOGGING_EXTRA_LOGGERS": "specbatch"}},
    )
    deployment.apply(work_pool_name=pool)
    return f"{WORKER_FLOW}/{pool}"


@dataclass
class _Slot:
    worker_id: int
    attempt: int = 0
    run: FlowRun | None = None
    done: bool = False


@dataclass(frozen=True)
class PoolResult:
    num_slots: int
    stopped: bool
    progress: WorkerProgress
    flow_runs: dict[int, list[str]]  # worker id -> names of its flow runs, in order


def run_pool_workers(
    job_dir: str,
    config: JobConfig,
    parent_key: str,
    stop_requested: threading.Event | None = None,
    on_round: Callable[[WorkerProgress], None] | None = None,
    epoch: int = 0,
) -> PoolResult:
    """Run the job's `workers.slots` worker flow runs on the pool until each has completed.

    `parent_key` names this parent run (the flow run's id): it goes into every idempotency key. `epoch`
    (the job lease's number) goes into every worker's run id, so their parts are fenced with it.
    Raises `WorkerGroupError` when a worker id has failed `1 + workers.worker_retries` times.
    """
    stop_requested = stop_requested or threading.Event()
    deployment = register_worker_deployment(config.workers.pool)
    slots = [_Slot(worker_id) for worker_id in range(config.workers.slots)]
    names: dict[int, list[str]] = {slot.worker_id: [] for slot in slots}
    mark_group_shards(job_dir, len(slots), "running", epoch)
    watcher = LedgerWatcher(job_dir)
    for slot in slots:
        _start(slot, deployment, job_dir, parent_key, len(slots), names, epoch)
    cancelled = False
    with get_client(sync_client=True) as client:
        _warn_without_workers(client, config.workers.pool)
        while not all(slot.done for slot in slots):
            if stop_requested.is_set() and not cancelled:
                _cancel(client, slots)  # then wait for the workers to commit and end
                cancelled = True
            time.sleep(POLL_S)
            for slot in (s for s in slots if not s.done):
                assert slot.run is not None
                slot.run = client.read_flow_run(slot.run.id)
                state = slot.run.state
                if state is None or not state.is_final():
                    continue
                if state.is_completed() or cancelled:
                    slot.done = True
                elif slot.attempt < config.workers.worker_retries:
                    log.warning("worker %d's flow run %s ended %s; starting it again", slot.worker_id,
                                slot.run.name, state.name)
                    slot.attempt += 1
                    _start(slot, deployment, job_dir, parent_key, len(slots), names, epoch)
                else:
                    raise WorkerGroupError(f"worker {slot.worker_id}'s flow runs {names[slot.worker_id]} all "
                                           f"failed (last: {state.name}: {state.message}); committed work is "
                                           "kept and a new run of the job redoes the rest")
            if on_round is not None and watcher.is_due():
                on_round(watcher.poll())
    if not stop_requested.is_set():
        check_epoch(job_dir, epoch)
        mark_group_shards(job_dir, len(slots), "done", epoch)
    return PoolResult(len(slots), stop_requested.is_set(), watcher.poll(), names)


def _start(slot: _Slot, deployment: str, job_dir: str, parent_key: str, num_slots: int,
           names: dict[int, list[str]], epoch: int = 0) -> None:
    key = f"{location_name(job_dir)}:{parent_key}:w{slot.worker_id}:a{slot.attempt}"
    parameters = {"job_dir": job_dir, "worker_id": slot.worker_id, "num_workers": num_slots,
                  "run_id": epoch_run_id(epoch, f"{parent_key[:8]}a{slot.attempt}")}
    run: Any = run_deployment(deployment, parameters=parameters, idempotency_key=key, timeout=0)
    slot.run = run
    names[slot.worker_id].append(run.name)
    log.info("worker %d of %d: flow run %s (%s)", slot.worker_id, num_slots, run.name, key)


def _warn_without_workers(client: Any, pool: str) -> None:
    """Worker runs wait in the pool until a Prefect worker polls it: say so when none is online."""
    from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

    is_online = WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
    if not client.read_workers_for_work_pool(pool, worker_filter=is_online):
        log.warning("no Prefect worker is polling work pool %r yet; the worker runs wait until one starts "
                    "(`prefect worker start --pool %s --limit 1` on each machine)", pool, pool)


def _cancel(client: Any, slots: list[_Slot]) -> None:
    """Cancel the running worker runs: their workers get SIGTERM, commit, and record in-flight requests
    as cancelled."""
    for slot in slots:
        if slot.run is not None and not slot.done:
            client.set_flow_run_state(slot.run.id, Cancelling(), force=True)
