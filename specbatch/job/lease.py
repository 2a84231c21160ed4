"""A lease with expiry on an object store: the job's lock (and each worker id's) where there is no `flock`.

The lease is a numbered sequence of objects, `FOLDER/00000001.json`, `00000002.json`, ...; the newest
one holds it. Each says who (pid, host), until when (`expires_at`, wall-clock seconds) and whether it
was released. To take the lease a runner *creates* the next number only if it is absent (a
conditional PUT), and only when the newest lease has expired or was released, so of two runners racing
for it exactly one wins. The holder renews by rewriting its own object every `ttl_s / 4`; before each
renewal it checks that no newer number exists, and if one does (it stalled past its expiry and was
taken over), it marks itself `lost`: the caller must stop writing. A holder killed with `kill -9`
leaves a lease that expires `ttl_s` after its last renewal; releasing on a clean exit ends it at once.
The clocks of the machines involved must agree to well within `ttl_s` (NTP does that).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from specbatch.job.inputs import JobError
from specbatch.storage import Storage

log = logging.getLogger(__name__)

_SUFFIX = ".json"


class LeaseLostError(JobError):
    """This runner's lease on an object-store job was taken over (it stalled past its expiry); it must
    not write anything more: the new holder owns the job."""


class LeaseHeldError(RuntimeError):
    """Another runner holds a live lease; `holder` says who, for the message."""

    def __init__(self, holder: dict) -> None:
        self.holder = holder
        remaining = max(0.0, float(holder.get("expires_at", 0)) - time.time())
        super().__init__(f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                         f"lease expires in {remaining:.0f} s unless renewed")


@dataclass
class Lease:
    storage: Storage
    folder: str  # e.g. ".job-lease"
    ttl_s: float
    number: int = 0
    lost: bool = False

    def _key(self, number: int) -> str:
        return f"{self.folder}/{number:08d}{_SUFFIX}"

    def _body(self, released: bool = False) -> bytes:
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "released": released,
                           "expires_at": time.time() + self.ttl_s}).encode()

    def newest(self) -> tuple[int, dict | None]:
        """(number, content) of the newest lease object; (0, None) when there is none."""
        numbers = [int(name[: -len(_SUFFIX)]) for name in self.storage.names(self.folder, _SUFFIX)
                   if name[: -len(_SUFFIX)].isdigit()]
        if not numbers:
            return 0, None
        number = max(numbers)
        try:
            return number, json.loads(self.storage.read_text(self._key(number)))
        except FileNotFoundError:  # deleted between list and read: an old one being cleaned up
            return number, {"released": True}

    def try_acquire(self) -> None:
        """Take the lease or raise `LeaseHeldError`."""
        number, holder = self.newest()
        if holder is not None and not holder.get("released") and float(holder.get("expires_at", 0)) > time.time():
            raise LeaseHeldError(holder)
        if not self.storage.create(self._key(number + 1), self._body()):
            raise LeaseHeldError(self.newest()[1] or {})  # another runner took this number first
        self.number = number + 1
        for old in range(max(1, number - 8), number):  # keep the folder short; never the one just read
            self.storage.delete(self._key(old))

    def renew(self) -> bool:
        """Extend the lease; False (and `lost`) if a newer lease exists: someone took it over."""
        if self.newest()[0] != self.number:
            self.lost = True
            log.error("lost the lease %s/%s: another runner took it over", self.storage.location, self.folder)
            return False
        self.storage.write_bytes(self._key(self.number), self._body())
        return True

    def release(self) -> None:
        if not self.lost and self.newest()[0] == self.number:
            self.storage.write_bytes(self._key(self.number), self._body(released=True))


def check_lease(storage: Storage, folder: str) -> None:
    """Raise `LeaseHeldError` if a live lease is held in `folder` now."""
    _, holder = Lease(storage, folder, ttl_s=0).newest()
    if holder is not None and not holder.get("released") and float(holder.get("expires_at", 0)) > time.time():
        raise LeaseHeldError(holder)


@contextmanager
def hold_lease(storage: Storage, folder: str, ttl_s: float, wait_s: float = 0.0) -> Iterator[Lease]:
    """Take the lease (retrying for `wait_s`), keep it renewed while the block runs, release it after."""
    lease = Lease(storage, folder, ttl_s)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lease.try_acquire()
            break
        except LeaseHeldError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(1.0, ttl_s / 4))
    stop = threading.Event()

    def keep_renewed() -> None:
        while not stop.wait(ttl_s / 4):
            try:
                if not lease.renew():
                    return
            except Exception:  # a failed renewal is retried; the lease lasts ttl_s
                log.warning("could not renew the lease %s/%s", storage.location, folder, exc_info=True)

    renewer = threading.Thread(target=keep_renewed, name=f"lease-{folder}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        lease.release()
