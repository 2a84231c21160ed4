"""Damaged ledger parts: found by a footer check, moved aside, their requests run again.

A part file can be damaged after its commit (a disk that lost a write the job did not fsync, a
file truncated by hand, a zero-byte object uploaded by another tool). Readers skip a file that is not
valid Parquet (`ledger.read_part`); before a run's workers start, the flow moves every part with
a damaged file, all four of its files, into `quarantine/<table>/` with a warning, `results` first
(so the part stops counting before its other files go), and the workers run its requests again.

The check needs no read of the whole file: Parquet ends with the 4 magic bytes `PAR1` and is at least
12 bytes long. On a local disk both are checked (one seek per file); on an object store the size,
which the listing gives, since an upload appears whole or not at all.
"""

from __future__ import annotations

import logging
from contextlib import suppress

from specbatch.ledger import PART_SUFFIX, TABLES, committed_parts, part_key
from specbatch.storage import Location, Storage, open_storage

log = logging.getLogger(__name__)

QUARANTINE_FOLDER = "quarantine"
_MAGIC = b"PAR1"
_MIN_BYTES = 12  # magic, footer length, magic


def damaged_parts(job_dir: Location | Storage, names: list[str] | None = None) -> dict[str, str]:
    """Committed parts (or `names`) with a file that is not whole Parquet: part name -> that file's key."""
    storage = job_dir if isinstance(job_dir, Storage) else open_storage(job_dir)
    names = committed_parts(storage) if names is None else names
    damaged: dict[str, str] = {}
    for table in TABLES:
        sizes = storage.sizes(table, PART_SUFFIX)
        for name in names:
            key, size = part_key(table, name), sizes.get(name + PART_SUFFIX)
            if name in damaged or size is None:
                continue
            tail = storage.read_tail(key, len(_MAGIC)) if size >= _MIN_BYTES else b""
            if size < _MIN_BYTES or tail not in (None, _MAGIC):
                damaged[name] = key
    return damaged


def quarantine_damaged_parts(job_dir: Location | Storage) -> list[str]:
    """Move each damaged part's files into quarantine/ (results first); returns the parts' names.
    Call it only while no worker of the job runs (the flow does, holding the job's lock)."""
    storage = job_dir if isinstance(job_dir, Storage) else open_storage(job_dir)
    damaged = damaged_parts(storage)
    for name, key in damaged.items():
        log.warning("part %s of %s is damaged (%s is not whole Parquet): moved to %s/, its requests run "
                    "again", name, storage.location, key, QUARANTINE_FOLDER)
        for table in reversed(TABLES):  # results first: the part stops counting before the rest moves
            with suppress(FileNotFoundError):  # a part without this table's file
                storage.move(part_key(table, name), f"{QUARANTINE_FOLDER}/{part_key(table, name)}")
    return list(damaged)
