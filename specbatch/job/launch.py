"""Launch a job's worker processes.

`workers.num_processes == 1` needs no launch: the flow's task runs `run_worker` in its own process,
so a progress display sees every round (`choose_launcher` says "in-process"). For N > 1 every
worker is its own process with its own shards (shard i goes to worker i % N), its own
copy of the models on its device and its own ledger parts (named by worker id):

- `accelerate` (the default when it is installed): `accelerate launch --multi_gpu --num_processes N
  --num_machines 1 --mixed_precision no --dynamo_backend no -m specbatch.job.worker JOB_DIR --run-id R`,
  one process per GPU, or N gloo processes on CPU (the worker then makes `Accelerator(cpu=True)`).
  Not `--cpu --num_processes N`: measured with accelerate 1.x, that silently starts one process.
- `subprocess`: N plain `python -m specbatch.job.worker JOB_DIR --run-id R --worker-id i --num-workers N`,
  when accelerate is not installed or `SPECBATCH_LAUNCHER=subprocess` is set.

The processes run in a session of their own and die with their parent (PR_SET_PDEATHSIG), so a
launcher that is killed leaves no worker writing behind a retry. On a stop (Ctrl-C, SIGTERM) the
group gets SIGTERM; each worker cancels what is in flight, commits and exits. A worker that crashes
loses only what it had not committed; accelerate then stops the others (they commit on SIGTERM),
plain subprocesses run on. Either way `WorkerGroupError` is raised and a retry of the launch
resumes: committed requests are skipped. Process output goes to JOB_DIR/logs/workers-RUN_ID.log
(for a job on an object store, to a local folder: `Storage.local_dir`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specbatch.config import JobConfig
from specbatch.job.processes import free_port, signal_groups, spawn, stop_groups, tail
from specbatch.job.worker import WorkerProgress
from specbatch.ledger import committed_parts, part_key
from specbatch.storage import Location, open_storage

log = logging.getLogger(__name__)

Launcher = Literal["in-process", "accelerate", "subprocess"]
LAUNCHERS: tuple[Launcher, ...] = ("in-process", "accelerate", "subprocess")
STOP_GRACE_S = 60.0  # how long stopped workers may take to commit before SIGKILL
POLL_S = 0.2


class WorkerGroupError(RuntimeError):
    """Worker processes failed; what they committed stays, and a retry redoes the rest."""


@dataclass(frozen=True)
class LaunchResult:
    launcher: Launcher | Literal["pool"]  # "pool": worker flow runs on a work pool (specbatch.job.pool)
    num_processes: int
    stopped: bool  # a stop was requested: in-flight requests were recorded as cancelled
    progress: WorkerProgress  # this launch's counters (read back from the ledger for processes)
    log_path: Path | None  # worker processes' output; None in-process


def choose_launcher(num_processes: int) -> Launcher:
    if num_processes == 1:
        return "in-process"
    forced = os.environ.get("SPECBATCH_LAUNCHER", "")
    if forced in LAUNCHERS:
        return forced
    return "accelerate" if importlib.util.find_spec("accelerate") else "subprocess"


def launch_workers(
    job_dir: Location,
    config: JobConfig,
    run_id: str,
    stop_requested: threading.Event | None = None,
    on_round: Callable[[WorkerProgress], None] | None = None,
    launcher: Launcher | None = None,
) -> LaunchResult:
    """Run the job's worker processes to completion or until `stop_requested` is set."""
    stop_requested = stop_requested or threading.Event()
    launcher = launcher or choose_launcher(config.workers.num_processes)
    if launcher == "in-process":
        raise ValueError("one worker runs in the caller's process (run_worker), not through a launch")
    return _launch_processes(job_dir, config, run_id, launcher, stop_requested, on_round)


def worker_commands(job_dir: Location, run_id: str, num_processes: int, launcher: Launcher) -> list[list[str]]:
    """The command lines of one launch: a single `accelerate launch`, or one per worker."""
    worker = ["-m", "specbatch.job.worker", str(job_dir), "--run-id", run_id]
    if launcher == "accelerate":
        return [[sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                 "--num_processes", str(num_processes), "--num_machines", "1", "--mixed_precision", "no",
                 "--dynamo_backend", "no", "--main_process_port", str(free_port()), *worker]]
    return [[sys.executable, *worker, "--worker-id", str(i), "--num-workers", str(num_processes)]
            for i in range(num_processes)]


def worker_env(config: JobConfig, num_processes: int) -> dict[str, str]:
    """The parent's environment, with the CPU threads split between the processes."""
    env = dict(os.environ)
    num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    num_threads = config.models.num_threads or max(1, num_cpus // num_processes)
    env.setdefault("OMP_NUM_THREADS", str(num_threads))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _launch_processes(job_dir: Location, config: JobConfig, run_id: str, launcher: Launcher,
                      stop_requested: threading.Event,
                      on_round: Callable[[WorkerProgress], None] | None) -> LaunchResult:
    num_processes = config.workers.num_processes
    log_path = open_storage(job_dir).local_dir() / "logs" / f"workers-{run_id}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    watcher = LedgerWatcher(job_dir)
    commands = worker_commands(job_dir, run_id, num_processes, launcher)
    log.info("launching %d worker processes (%s); output in %s", num_processes, launcher, log_path)
    with log_path.open("ab") as output:
        processes = [spawn(command, worker_env(config, num_processes), output) for command in commands]
        try:
            codes = _wait(processes, stop_requested, watcher, on_round)
        finally:
            stop_groups(processes, STOP_GRACE_S)
    progress = watcher.poll()
    if on_round is not None:
        on_round(progress)
    failed = [code for code in codes if code != 0]
    if failed and not stop_requested.is_set():
        raise WorkerGroupError(f"worker processes exited with {codes} ({launcher}); committed work is kept "
                               f"and a retry redoes the rest. Last lines of {log_path}:\n{tail(log_path)}")
    return LaunchResult(launcher, num_processes, stop_requested.is_set(), progress, log_path)


def _wait(processes: list[subprocess.Popen], stop_requested: threading.Event, watcher: LedgerWatcher,
          on_round: Callable[[WorkerProgress], None] | None) -> list[int]:
    """Wait for every process; forward a stop as SIGTERM to the groups; report ledger progress."""
    signalled_at: float | None = None
    while any(p.poll() is None for p in processes):
        running = [p for p in processes if p.poll() is None]
        if stop_requested.is_set() and signalled_at is None:
            signal_groups(running, signal.SIGTERM)
            signalled_at = time.monotonic()
        if signalled_at is not None and time.monotonic() - signalled_at > STOP_GRACE_S:
            signal_groups(running, signal.SIGKILL)
        if on_round is not None and watcher.is_due():
            on_round(watcher.poll())
        time.sleep(POLL_S)
    return [p.returncode for p in processes]


class LedgerWatcher:
    """Progress of worker processes, read from the parts they commit after this watcher started."""

    def __init__(self, job_dir: Location, every_s: float = 1.0) -> None:
        self.storage = open_storage(job_dir)
        self.every_s = every_s
        self.progress = WorkerProgress()
        self._seen = set(committed_parts(self.storage))
        self._last_poll = time.monotonic()

    def is_due(self) -> bool:
        return time.monotonic() - self._last_poll >= self.every_s

    def poll(self) -> WorkerProgress:
        self._last_poll = time.monotonic()
        for name in committed_parts(self.storage):
            if name not in self._seen:
                self._seen.add(name)
                self._count(part_key("requests", name))
        return self.progress

    def _count(self, key: str) -> None:
        columns = ["status", "num_output_tokens", "num_proposed", "num_accepted"]  # WorkerProgress.add's arguments
        for request in self.storage.read_parquet(key, columns=columns).to_pylist():
            self.progress.add(**request)


@contextmanager
def stop_on_signals(stop_requested: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop_requested` instead of raising (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
