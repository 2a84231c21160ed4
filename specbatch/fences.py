"""Fencing on an object store: a part written by a holder that lost the job's lease never counts.

A lease (`specbatch.job.lease`) tells a stalled holder that it lost the job only when it next looks,
and on an object store a look followed by a write is a race: a holder can check that it still holds
the lease, stall, and upload a part after a new holder took the job over and decided what to re-run.
Fencing closes that race without any conditional write:

- Each holder of the job's lease has an *epoch*, its lease number. It goes into the run id of every
  part its workers write (`part-w00-e00000003-20240101T000000-a1-00000`): `epoch_run_id`.
- A new holder, right after it takes the lease and before anything reads the committed set, writes
  `fences/EPOCH.json`: the committed parts it accepts from earlier epochs (`write_fence`).
- A part counts (`fenced`) if it is listed in the newest fence or belongs to that fence's epoch or a
  later one. A stale holder's part uploaded after the fence is in neither, so no reader counts it,
  whatever the timing; one uploaded before the fence is listed, and the new holder skips its requests.

Each request is therefore in the committed set once. A part name without an epoch (a local job, or
one written before fencing) has epoch 0. A job with no fence (every local job) counts every part.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from specbatch.storage import Storage

FENCES_FOLDER = "fences"
_SUFFIX = ".json"
_EPOCH_RE = re.compile(r"^e(?P<epoch>\d{8})-")
_PART_RUN_RE = re.compile(r"^part-w\d+-(?P<run>.+)-\d+$")
_KEEP_FENCES = 4


@dataclass(frozen=True)
class Fence:
    epoch: int  # the lease number of the holder that wrote it
    parts: frozenset[str]  # parts of earlier epochs that stay committed


def epoch_run_id(epoch: int, run_id: str) -> str:
    """The run id of parts written under lease `epoch` (0: no lease, the run id as it is)."""
    return f"e{epoch:08d}-{run_id}" if epoch else run_id


def run_epoch(run_id: str) -> int:
    match = _EPOCH_RE.match(run_id)
    return int(match["epoch"]) if match else 0


def part_epoch(name: str) -> int:
    match = _PART_RUN_RE.match(name)
    return run_epoch(match["run"]) if match else 0


def latest_fence(storage: Storage) -> Fence | None:
    numbers = [int(n[: -len(_SUFFIX)]) for n in storage.names(FENCES_FOLDER, _SUFFIX) if n[: -len(_SUFFIX)].isdigit()]
    if not numbers:
        return None
    data = json.loads(storage.read_text(_key(max(numbers))))
    return Fence(int(data["epoch"]), frozenset(data["parts"]))


def fenced(names: Iterable[str], fence: Fence | None) -> list[str]:
    """The names that count under `fence` (all of them without one)."""
    if fence is None:
        return list(names)
    return [name for name in names if name in fence.parts or part_epoch(name) >= fence.epoch]


def write_fence(storage: Storage, epoch: int, committed: list[str]) -> None:
    """Record `committed` (the parts that count now) as the only parts of epochs before `epoch` that
    ever will; older fences go (only the newest is read)."""
    body = json.dumps({"epoch": epoch, "parts": sorted(committed)}).encode()
    if not storage.create(_key(epoch), body):
        raise RuntimeError(f"{storage.url(_key(epoch))} exists: lease epoch {epoch} was taken twice")
    for name in storage.names(FENCES_FOLDER, _SUFFIX)[:-_KEEP_FENCES]:
        storage.delete(f"{FENCES_FOLDER}/{name}")


def _key(epoch: int) -> str:
    return f"{FENCES_FOLDER}/{epoch:08d}{_SUFFIX}"
