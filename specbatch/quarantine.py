"""Damaged ledger parts: found by reading what Parquet says about itself, moved aside, their
requests run again.

A part file can be damaged after its commit (a disk that lost a write the job did not fsync, a
file truncated or overwritten by hand, a zero-byte object uploaded by another tool). Readers skip a
file that does not read as Parquet (`ledger.read_part`); before a run's workers start, the flow moves
every part with a damaged file, all four of its files, into `quarantine/<table>/` with a warning,
`results` first (so the part stops counting before its other files go), and the workers run its
requests again.

On a local disk every file's footer is read and parsed (`pq.read_metadata`: the file's last bytes,
no data pages), and any error reading it is damage; with `deep`, the `results` files, which every
reader (resume, status, finalize, report) reads whole anyway, are read whole too, so bytes
overwritten inside a data page are found as well. On an object store an upload appears whole or
not at all, so the listing's sizes are checked (at least 12 bytes: magic, footer length, magic),
with no read.
"""

from __future__ import annotations

import logging
from contextlib import suppress

import pyarrow.parquet as pq

from specbatch.ledger import PART_SUFFIX, TABLES, committed_parts, part_key
from specbatch.storage import Location, Storage, open_storage

log = logging.getLogger(__name__)

QUARANTINE_FOLDER = "quarantine"
_MIN_BYTES = 12  # magic, footer length, magic


def damaged_parts(job_dir: Location | Storage, names: list[str] | None = None, deep: bool = False) -> dict[str, str]:
    """Committed parts (or `names`) with a file that is not whole Parquet: part name -> that file's key.
    `deep`: read the results files whole (see the module doc)."""
    storage = job_dir if isinstance(job_dir, Storage) else open_storage(job_dir)
    names = committed_parts(storage) if names is None else names
    damaged: dict[str, str] = {}
    for table in reversed(TABLES):  # results first: its damage is the one that changes what is done
        sizes = storage.sizes(table, PART_SUFFIX)
        for name in names:
            key, size = part_key(table, name), sizes.get(name + PART_SUFFIX)
            if name in damaged or size is None:
                continue
            if size < _MIN_BYTES or (storage.is_local and _unreadable(storage, key, deep and table == "results")):
                damaged[name] = key
    return damaged


def _unreadable(storage: Storage, key: str, whole: bool) -> bool:
    """True when the file's footer (with `whole`, the file) does not read as Parquet; a file deleted
    meanwhile is not damaged."""
    path = storage.url(key)
    try:
        if whole:
            pq.read_table(path)
        else:
            pq.read_metadata(path)
    except FileNotFoundError:
        return False
    except Exception as error:  # ArrowInvalid, OSError (a corrupt footer or page), whatever the reader raises
        log.debug("%s does not read as Parquet: %s", path, error)
        return True
    return False


def quarantine_damaged_parts(job_dir: Location | Storage) -> list[str]:
    """Move each damaged part's files into quarantine/ (results first); returns the parts' names.
    Call it only while no worker of the job runs (the flow does, holding the job's lock)."""
    storage = job_dir if isinstance(job_dir, Storage) else open_storage(job_dir)
    damaged = damaged_parts(storage, deep=True)
    for name, key in damaged.items():
        log.warning("part %s of %s is damaged (%s is not whole Parquet): moved to %s/, its requests run "
                    "again", name, storage.location, key, QUARANTINE_FOLDER)
        for table in reversed(TABLES):  # results first: the part stops counting before the rest moves
            with suppress(FileNotFoundError):  # a part without this table's file
                storage.move(part_key(table, name), f"{QUARANTINE_FOLDER}/{part_key(table, name)}")
    return list(damaged)
