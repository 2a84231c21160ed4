"""The `specbatch-job` Prefect flow: ingest + shard → run the worker group → finalize.

Thin: the tasks call `specbatch.job` and `specbatch.job.launch`. `specbatch submit` runs this flow in its
own process (with `local_hooks`, on Prefect's temporary local server, see `specbatch.job.prefect_local`); a
deployment runs the same flow in a process that a Prefect worker starts (`prefect.yaml`), and
`submit --deployment NAME` starts such a run (`run_deployment_job`).

Only the worker group retries. That is safe because a job resumes: cancelled results are retired,
workers skip every request with a committed result and redo the rest. A job that cannot start
(bad config, dataset or models, a changed dataset) ends the run in a `Failed` state named
`UnusableInput` with a one-line message, no traceback and no retry. A local stop (Ctrl-C, SIGTERM)
lets the workers commit, finalizes, and ends the run `Cancelled`; so does a run that ends with
`cancelled` rows for any other reason. The run holds the job's lock (`specbatch.job.lock`) from before
ingest to the end: a second runner of the same job ends `UnusableInput` at once.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.states import Cancelled, Failed, State

from specbatch.config import ConfigError, JobConfig, load_config
from specbatch.data.ingest import DatasetError
from specbatch.engine.model_paths import ModelLoadError
from specbatch.fences import epoch_run_id
from specbatch.job.finalize import DONE_STATUSES, JobSummary, finalize, mark_failed
from specbatch.job.inputs import JobError, check_inputs, check_job_id, default_job_id
from specbatch.job.launch import LaunchResult, choose_launcher, launch_workers, stop_on_signals
from specbatch.job.lock import LeaseLostError, check_epoch, job_lock
from specbatch.job.manifest import ManifestError, load_manifest
from specbatch.job.prefect_local import TEMPORARY_SERVER_ENV
from specbatch.job.prepare import prepare
from specbatch.job.worker import WorkerProgress, mark_group_shards, run_worker
from specbatch.ledger import committed_request_ids, remove_fenced_out_parts, retire_cancelled_results
from specbatch.quarantine import quarantine_damaged_parts
from specbatch.storage import is_url, join, location_name, open_storage

FLOW_NAME = "specbatch-job"
UNUSABLE_INPUT = "UnusableInput"  # state name of a run that stopped before any work
USAGE_ERRORS = (ConfigError, DatasetError, ModelLoadError, JobError, ManifestError)
WORKER_RETRIES = 2
WORKER_RETRY_DELAYS_S: list[float] = [5, 30]


@dataclass
class LocalHooks:
    """What an in-process caller (the CLI) lends the worker task; a deployment run has none."""

    stop_requested: threading.Event = field(default_factory=threading.Event)
    on_round: Callable[[WorkerProgress], None] | None = None  # progress, every round or ledger poll
    on_start: Callable[[int, int], None] | None = None  # (records in the job, records already done)
    on_notice: Callable[[str], None] | None = None  # e.g. "worker group failed; retrying"


_local_hooks: ContextVar[LocalHooks | None] = ContextVar("specbatch_local_hooks", default=None)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:  # a task's `.fn()` called outside a run
        return logging.getLogger(__name__)


def _notify(message: str) -> None:
    """A warning in the run's log, and on the terminal of a caller that runs the flow in-process."""
    _logger().warning(message)
    hooks = _local_hooks.get()
    if hooks is not None and hooks.on_notice is not None:
        hooks.on_notice(message)


def _not_unusable(task, task_run, state: State) -> bool:
    return state.name != UNUSABLE_INPUT


@task(name="ingest-and-shard", cache_policy=NO_CACHE)
def ingest_and_shard(dataset: str, job_dir: str, config: dict[str, Any], force: bool = False,
                     dataset_format: str | None = None, column_map: dict[str, str] | None = None,
                     epoch: int = 0) -> dict | State:
    """Create or resume the job directory; check the model paths before any work."""
    job_config = JobConfig.model_validate(config)
    try:
        check_inputs(dataset, job_config, dataset_format, column_map)
        manifest = prepare(dataset, job_dir, job_config, force, dataset_format, column_map, epoch, _notify)
    except USAGE_ERRORS as error:
        return Failed(name=UNUSABLE_INPUT, message=str(error))
    _logger().info("job %s: %d records in %d shards (%s)", manifest.job_id, manifest.dataset.num_records,
                   len(manifest.shards), manifest.status)
    if not manifest.dataset.num_records:
        _notify(f"dataset {dataset} holds no records: nothing to run")
    return {"num_records": manifest.dataset.num_records, "num_shards": len(manifest.shards)}


@task(name="run-workers", cache_policy=NO_CACHE, retries=WORKER_RETRIES,
      retry_delay_seconds=WORKER_RETRY_DELAYS_S, retry_condition_fn=_not_unusable)
def run_workers(job_dir: str, epoch: int = 0) -> dict | State:
    """Run the worker group (in-process, `workers.num_processes` processes, or `workers.slots` flow runs
    on a work pool) until the job is done. `epoch`: the job lease's number on an object store (its
    parts carry it; a lost lease ends the task `UnusableInput`, without a retry)."""
    path = job_dir if is_url(job_dir) else Path(job_dir)
    try:
        check_epoch(job_dir, epoch)
    except LeaseLostError as error:
        return _lease_lost(job_dir, error)
    config = JobConfig.model_validate(load_manifest(path).config)
    local = _local_hooks.get() is not None
    hooks = _local_hooks.get() or LocalHooks()
    attempt = _attempt()
    quarantine_damaged_parts(path)  # their requests run again
    if epoch:
        remove_fenced_out_parts(path)  # a superseded holder's, uploaded after this run's fence
    # a stopped or crashed attempt's cancelled rows run again, and requests a run's KV capacity dropped
    retired = retire_cancelled_results(path, capacity_drops=True, conditional=bool(epoch))
    if retired:
        _logger().info("%d cancelled or capacity-dropped requests will run again", retired)
    run_id = epoch_run_id(epoch, f"{time.strftime('%Y%m%dT%H%M%S')}-a{attempt}")
    if hooks.on_start is not None:
        hooks.on_start(load_manifest(path).dataset.num_records, len(committed_request_ids(path, DONE_STATUSES)))
    try:
        with stop_on_signals(hooks.stop_requested) if local else nullcontext():
            if config.workers.placement == "pool":
                result = _run_pool(job_dir, config, hooks, epoch)
            else:
                result = _run_local(path, config, run_id, hooks, epoch)
    except LeaseLostError as error:
        return _lease_lost(job_dir, error)
    except USAGE_ERRORS as error:
        return Failed(name=UNUSABLE_INPUT, message=str(error))
    except Exception as error:
        try:
            check_epoch(job_dir, epoch)  # a worker that found its lease lost: no retry
        except LeaseLostError as lost:
            return _lease_lost(job_dir, lost)
        if hooks.on_notice is not None and attempt <= WORKER_RETRIES:
            first_line = str(error).splitlines()[0] if str(error) else repr(error)
            hooks.on_notice(f"attempt {attempt} of the worker group failed ({first_line}); retrying, "
                            "committed requests are kept")
        raise
    progress = result.progress
    _logger().info("worker group done (%s, %d processes): %d requests, %d committed tokens%s",
                   result.launcher, result.num_processes, progress.num_done, progress.num_committed_tokens,
                   "; stopped" if result.stopped else "")
    return {"launcher": result.launcher, "num_processes": result.num_processes, "stopped": result.stopped,
            "run_id": run_id, **asdict(result.progress)}


def _lease_lost(job_dir: str, error: LeaseLostError) -> State:
    """End a run whose lease was taken over, first deleting its parts that no fence counts (they would
    linger in results/, where the duckdb command line reads every file)."""
    try:
        remove_fenced_out_parts(job_dir)
    except Exception:  # the new holder's runs remove them too
        logging.getLogger(__name__).warning("could not remove fenced-out parts of %s", job_dir, exc_info=True)
    return Failed(name=UNUSABLE_INPUT, message=str(error))


def _run_pool(job_dir: str, config: JobConfig, hooks: LocalHooks, epoch: int) -> LaunchResult:
    from specbatch.job.pool import run_pool_workers

    context = FlowRunContext.get()
    parent_key = str(context.flow_run.id) if context is not None and context.flow_run is not None else "local"
    pool = run_pool_workers(job_dir, config, parent_key, hooks.stop_requested, hooks.on_round, epoch)
    return LaunchResult("pool", pool.num_slots, pool.stopped, pool.progress, None)


def check_placement(config: JobConfig, job_dir: str) -> None:
    """A `pool` job needs a job directory every machine reaches and a Prefect server its workers poll."""
    if config.workers.placement != "pool":
        return
    if not is_url(job_dir):
        raise JobError(f"workers.placement=pool needs a job directory every machine reaches: an object-store "
                       f"URL such as s3://bucket/jobs for --output, not {job_dir}")
    if not os.environ.get("PREFECT_API_URL") or os.environ.get(TEMPORARY_SERVER_ENV) == "1":
        raise JobError("workers.placement=pool needs a Prefect server whose work pool the machines' workers "
                       "poll: set PREFECT_API_URL (see docs/deployment.md)")


def _run_local(job_dir: str | Path, config: JobConfig, run_id: str, hooks: LocalHooks, epoch: int = 0) -> LaunchResult:
    """The worker group on this machine. On an object store the flow marks the shards (workers never
    write a manifest there)."""
    num = config.workers.num_processes
    if is_url(job_dir):
        mark_group_shards(job_dir, num, "running", epoch)
    if choose_launcher(num) == "in-process":
        progress = run_worker(job_dir, config, run_id=run_id, stop_requested=hooks.stop_requested,
                              on_round=hooks.on_round)
        result = LaunchResult("in-process", 1, hooks.stop_requested.is_set(), progress, None)
    else:
        result = launch_workers(job_dir, config, run_id, hooks.stop_requested, hooks.on_round)
    if is_url(job_dir) and not result.stopped:
        check_epoch(job_dir, epoch)
        mark_group_shards(job_dir, num, "done", epoch)
    return result


@task(name="finalize", cache_policy=NO_CACHE)
def finalize_job(job_dir: str, workers: dict | None = None, epoch: int = 0) -> dict:
    """Export results, record the job's status, and publish a markdown summary artifact (not after the
    job's lease was lost: the new holder finalizes)."""
    summary = finalize(job_dir, stopped=bool((workers or {}).get("stopped")), epoch=epoch)
    outcome = {**(workers or {}), **summary_to_dict(summary)}  # the job's counts win over this run's
    if TaskRunContext.get() is not None:  # not when `.fn()` is called outside a run
        create_markdown_artifact(markdown=summary_markdown(outcome), key=_artifact_key(summary.job_id),
                                 description=f"specbatch job {summary.job_id}")
    return outcome


@flow(name=FLOW_NAME, persist_result=False, log_prints=False)
def specbatch_job(
    dataset: str,
    config: str | None = None,
    overrides: list[str] | None = None,
    job_id: str | None = None,
    output: str = "outputs",
    force: bool = False,
    dataset_format: str | None = None,
    column_map: dict[str, str] | None = None,
) -> dict | State:
    """Run one specbatch job: DATASET → OUTPUT/JOB_ID/ (manifest, shards, ledger tables, results).

    DATASET and OUTPUT may be object-store URLs (`s3://bucket/prefix`)."""
    logger = get_run_logger()
    try:
        job_config = load_config(Path(config) if config else None, overrides or [])
        job_dir = join(output, check_job_id(default_job_id() if job_id is None else job_id))
        check_placement(job_config, job_dir)
    except USAGE_ERRORS as error:
        return _unusable(str(error))
    logger.info("job directory %s", job_dir if is_url(job_dir) else Path(job_dir).resolve())
    try:
        with job_lock(job_dir, lease_s=job_config.workers.lease_s) as epoch:  # held through ingest and finalize
            return _run_job(dataset, job_dir, job_config, force, dataset_format, column_map, epoch)
    except JobError as error:  # running elsewhere, or its lease cannot be written
        return _unusable(str(error))


def _run_job(dataset: str, job_dir: str, job_config: JobConfig, force: bool, dataset_format: str | None,
             column_map: dict[str, str] | None, epoch: int = 0) -> dict | State:
    prepared = ingest_and_shard(dataset, job_dir, job_config.model_dump(mode="json"), force,
                                dataset_format, column_map, epoch, return_state=True)
    if prepared.name == UNUSABLE_INPUT:
        return _unusable(prepared.message or "unusable input")
    try:
        prepared.result()
        workers = run_workers(job_dir, epoch, return_state=True)
        if workers.name == UNUSABLE_INPUT:
            return _unusable(workers.message or "unusable input")
        launched = workers.result()  # raises if the worker group failed for good
        assert isinstance(launched, dict), "only an UnusableInput run returns a state"
        outcome = finalize_job(job_dir, launched, epoch)
    except LeaseLostError as error:
        _lease_lost(job_dir, error)
        return _unusable(str(error))
    except Exception:
        _write_error_log(job_dir, epoch)
        raise
    return _final_state(outcome, location_name(job_dir))


def _final_state(outcome: dict, job_name: str) -> dict | State:
    """The run's end: its outcome (Completed) when the job is complete, even if a stop came after its
    last request (the manifest says `done`); else Cancelled when stopped or rows ended cancelled."""
    if outcome.get("stopped") and not outcome["is_complete"]:
        return Cancelled(message=f"stopped; run the same job again to resume {job_name}", data=outcome)
    if outcome["num_cancelled"]:  # e.g. a killed run's worker committed them late: not a success
        return Cancelled(message=f"{outcome['num_cancelled']} requests ended cancelled; run the same job "
                                 f"again to resume {job_name}", data=outcome)
    if not outcome["is_complete"]:
        _logger().warning("job %s is not complete: %s", job_name, outcome)
    return outcome


def _unusable(message: str) -> State:
    get_run_logger().error("unusable input: %s", message)
    return Failed(name=UNUSABLE_INPUT, message=message)


def _write_error_log(job_dir: str, epoch: int = 0) -> None:
    """error.log, and the manifest's status `failed` (a failed resume of a done job is not done)."""
    storage = open_storage(job_dir)
    if storage.exists("manifest.json"):
        storage.write_bytes("error.log", traceback.format_exc().encode())
        try:
            mark_failed(job_dir, epoch)
        except Exception:  # the error being reported matters more than its status line
            logging.getLogger(__name__).warning("could not mark %s failed", job_dir, exc_info=True)


def _attempt() -> int:
    context = TaskRunContext.get()
    return context.task_run.run_count if context is not None and context.task_run.run_count else 1


def _artifact_key(job_id: str) -> str:
    return "specbatch-" + (re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-") or "job")


def summary_to_dict(summary: JobSummary) -> dict:
    data = asdict(summary)
    data["job_dir"] = str(summary.job_dir)
    data["is_complete"] = summary.is_complete
    return data


def summary_from_dict(data: dict) -> JobSummary:
    names = ("num_records", "num_completed", "num_dropped", "num_cancelled", "num_output_tokens",
             "drop_reasons")
    return JobSummary(str(data["job_dir"]), **{name: data[name] for name in names},
                      unread_fields=data.get("unread_fields", {}))


def summary_markdown(outcome: dict) -> str:
    rows = summary_from_dict(outcome).rows()
    if "launcher" in outcome:
        rows += [("workers", f"{outcome['num_processes']} ({outcome['launcher']})")]
    lines = [f"# specbatch job `{location_name(outcome['job_dir'])}`", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", f"Outputs: `{outcome['job_dir']}` (results/, requests/, rounds/, steps/, results.jsonl)"]
    return "\n".join(lines)


@contextmanager
def local_hooks(hooks: LocalHooks) -> Iterator[None]:
    """Lend `hooks` to the worker task of a flow run in this process (`specbatch submit`)."""
    token = _local_hooks.set(hooks)
    try:
        yield
    finally:
        _local_hooks.reset(token)


def deployment_name(name: str) -> str:
    """`local` → `specbatch-job/local`; a full `FLOW/DEPLOYMENT` name is kept."""
    return name if "/" in name else f"{FLOW_NAME}/{name}"


def run_deployment_job(name: str, parameters: dict, wait: bool = False,
                       on_state: Callable[[Any], None] | None = None, poll_s: float = 2.0) -> Any:
    """Start a run of a deployment on the configured Prefect API; with `wait`, poll until it ends.

    Returns the `FlowRun` (its last state read when waiting). `on_state` sees each new state.
    """
    from prefect import get_client
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ValueError("no Prefect server configured: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api)")
    flow_run = run_deployment(deployment_name(name), parameters=parameters, timeout=0)
    assert isinstance(flow_run, FlowRun)  # called from sync code: not a coroutine
    if on_state is not None:
        on_state(flow_run)
    if not wait:
        return flow_run
    last = flow_run.state.name if flow_run.state else None
    with get_client(sync_client=True) as client:
        while flow_run.state is None or not flow_run.state.is_final():
            time.sleep(poll_s)
            flow_run = client.read_flow_run(flow_run.id)
            if flow_run.state is not None and flow_run.state.name != last and on_state is not None:
                on_state(flow_run)
            last = flow_run.state.name if flow_run.state else None
    return flow_run
