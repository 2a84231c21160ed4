"""One runner per job: `JOB_DIR/.job.lock`, held by whatever runs the flow for that directory.

Two runners of one job (two `specbatch submit`, or a submit and a deployment run) would otherwise
both process the same shards under different worker ids, and a second ingest deletes the first
one's shards. The lock is an exclusive `fcntl.flock`: the kernel drops it when the holder dies, even
by `kill -9`, so a stale lock is taken over without any clean-up. The holder's pid and host are
written into the file only for the message a second runner prints. Worker processes started by the
holder never take it (they hold their own `worker_lock`), and the file descriptor is not inherited.

A job on an object store has no `flock`: there the lock is a lease with expiry (`specbatch.job.lease`,
folder `.job-lease/`), renewed while the runner lives; a killed runner's lease is taken over once it
expires (`workers.lease_s` after its last renewal). The lease's number is the runner's *epoch*: it
writes a fence as it takes the lease, its workers name their parts by it and check it before each
commit (`check_epoch`), and parts of a superseded epoch never count (`specbatch.fences`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from specbatch.data.shards import SHARDS_FOLDER
from specbatch.fences import FENCES_FOLDER, write_fence
from specbatch.job.inputs import JobError
from specbatch.job.lease import Lease, LeaseHeldError, LeaseLostError, check_lease, hold_lease
from specbatch.ledger import TABLES, committed_parts
from specbatch.quarantine import QUARANTINE_FOLDER
from specbatch.storage import LinkInJobError, Location, is_url, links_in, location_name, open_no_follow, open_storage

LOCK_NAME = ".job.lock"
LEASE_FOLDER = ".job-lease"
WAIT_S = 2.0  # a runner retries this long: `check_not_running` of another CLI holds the lock for an instant


class JobRunningError(JobError):
    """Another process holds the job's lock; exit code 2, nothing was touched."""


@contextmanager
def job_lock(job_dir: Location, wait_s: float = WAIT_S, lease_s: float = 30.0) -> Iterator[int]:
    """Hold JOB_DIR/.job.lock (a job on an object store: its lease) for the whole run, or raise
    `JobRunningError` within `wait_s`. Yields the holder's epoch: the lease number on an object
    store (after writing its fence), 0 on a local disk (the kernel's lock needs no fencing)."""
    if is_url(job_dir):
        stack = ExitStack()
        try:
            storage = open_storage(job_dir)
            lease: Lease = stack.enter_context(hold_lease(storage, LEASE_FOLDER, lease_s, wait_s))
            write_fence(storage, lease.number, committed_parts(storage))
        except LeaseHeldError as error:
            stack.close()
            raise _running(location_name(job_dir), error) from None
        except Exception as error:  # no such bucket, no credentials, endpoint unreachable
            stack.close()
            raise JobError(f"cannot take the lease of job {location_name(job_dir)} at {job_dir}: {error}") from error
        with stack:
            yield lease.number
        return
    job_dir = Path(job_dir)
    check_not_a_link(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    check_no_links(job_dir)
    try:  # not inheritable (PEP 446)
        fd = open_no_follow(job_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    except LinkInJobError as error:
        raise JobError(str(error)) from None
    try:
        _lock_or_raise(fd, job_dir, time.monotonic() + wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        yield 0
    finally:
        os.close(fd)  # releases the lock


def check_epoch(job_dir: Location, epoch: int) -> None:
    """Raise `LeaseLostError` unless `epoch` is still the newest lease of the job (0: nothing to check).
    Called right before each commit; a part that loses the race with a takeover anyway is fenced out."""
    if not epoch or not is_url(job_dir):
        return
    newest, holder = Lease(open_storage(job_dir), LEASE_FOLDER, ttl_s=0).newest()
    if newest != epoch:
        raise LeaseLostError(f"job {location_name(job_dir)} was taken over by pid {(holder or {}).get('pid', '?')} "
                             f"on {(holder or {}).get('host', '?')} (lease {newest}) while this run (lease {epoch}) "
                             "stalled; this run stops without committing more, the other run owns the job now")


def check_not_a_link(job_dir: Path) -> None:
    """A job directory that is itself a symbolic link is refused: the job would be written into the
    link's target, wherever it points (a folder above it may be a link: `outputs/` on another disk)."""
    if job_dir.is_symlink():
        raise JobError(f"job directory {job_dir} is a symbolic link (to {os.readlink(job_dir)}); a job directory "
                       "must not be a link: remove it, or give --output the folder the link points into")


def check_no_links(job_dir: Path) -> None:
    """A job folder is a boundary: refuse one with symbolic links in it (a planted `.job.lock`,
    `results.jsonl.tmp` or `rounds/` link would make a run write or delete outside it)."""
    links = links_in(job_dir, (*TABLES, SHARDS_FOLDER, QUARANTINE_FOLDER, FENCES_FOLDER, "logs"))
    if links:
        shown = ", ".join(f"{link.relative_to(job_dir)} -> {os.readlink(link)}" for link in links[:3])
        raise JobError(f"job directory {job_dir} contains symbolic links ({shown}{', ...' if len(links) > 3 else ''}); "
                       "a job directory must not contain links: remove them and run again")


def check_not_running(job_dir: Location) -> None:
    """Raise `JobRunningError` if a runner holds the job's lock now (a fast check before starting)."""
    if is_url(job_dir):
        try:
            check_lease(open_storage(job_dir), LEASE_FOLDER)
        except LeaseHeldError as error:
            raise _running(location_name(job_dir), error) from None
        except Exception as error:  # no such bucket, no credentials, endpoint unreachable
            raise JobError(f"cannot read job {location_name(job_dir)} at {job_dir}: {error}") from error
        return
    check_not_a_link(Path(job_dir))
    path = Path(job_dir) / LOCK_NAME
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        _lock_or_raise(fd, Path(job_dir), deadline=0.0)
    finally:
        os.close(fd)


def _lock_or_raise(fd: int, job_dir: Path, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    pid, host = _holder(job_dir)
    raise JobRunningError(f"job {job_dir.name} is running (pid {pid} on {host}); wait for it to end, "
                          "or stop it, then run the same command to resume")


def _running(job_id: str, error: LeaseHeldError) -> JobRunningError:
    return JobRunningError(f"job {job_id} is running ({error}); wait for it to end, or stop it, then run "
                           "the same command to resume")


def _holder(job_dir: Path) -> tuple[str, str]:
    """(pid, host) written by the holder; '?' while it has not written them yet."""
    try:
        holder = json.loads((job_dir / LOCK_NAME).read_text(encoding="utf-8"))
        return str(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?", "?"
