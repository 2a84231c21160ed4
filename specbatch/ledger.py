"""The job ledger: fixed Arrow schemas for `results`, `requests`, `rounds`, `steps`, and a part writer.

A job directory holds one folder per table. Records are buffered and written as *parts*: the same
part name in every table folder, `part-w{worker:02d}-{run_id}-{seq:05d}.parquet` (seq 100000 and up
take more digits, so order parts with `part_order`, not by name). Each file is written whole
(`specbatch.storage`: a `.tmp` file renamed on a local disk, one PUT on an object store); the `results`
file is written last, so its existence is the commit point of the whole part. Readers
(`committed_request_ids`, `read_table`, `sql/views.sql`) only count a part whose results file
exists. Every part writes all four files, even empty ones, so that
`read_parquet('JOB/<table>/*.parquet')` finds a file for every table of a job that committed anything.
A file that is not valid Parquet (damaged on disk: empty, truncated) is skipped by every reader with a
warning, so its part's requests count as not done; `specbatch.quarantine` moves such parts aside.

Each table's schema is derived from its record in `specbatch.records`; the ledger adds no column.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from specbatch.fences import fenced, latest_fence
from specbatch.records import RequestRecord, ResultRecord, RoundRecord, StepRecord, arrow_schema
from specbatch.storage import TMP_SUFFIX, Location, StaleWriteError, Storage, open_storage

log = logging.getLogger(__name__)

# A drop that is one run's verdict on its KV capacity, not on the record: capacity is speed-only config,
# so a resume (`retire_cancelled_results(..., capacity_drops=True)`) runs such a request again.
RERUN_DROP_REASONS = frozenset({"exceeds_kv_capacity"})
TABLES = ("rounds", "steps", "requests", "results")  # write order: results last (the commit point)
PART_SUFFIX = ".parquet"
_PART_RE = re.compile(r"^part-w(?P<worker>\d+)-(?P<run>.+)-(?P<seq>\d+)$")

SCHEMAS: dict[str, pa.Schema] = {
    "rounds": arrow_schema(RoundRecord),
    "steps": arrow_schema(StepRecord),
    "requests": arrow_schema(RequestRecord),
    "results": arrow_schema(ResultRecord),
}
ROUNDS_SCHEMA, STEPS_SCHEMA = SCHEMAS["rounds"], SCHEMAS["steps"]
REQUESTS_SCHEMA, RESULTS_SCHEMA = SCHEMAS["requests"], SCHEMAS["results"]


def to_table(records: Iterable[Any], schema: pa.Schema) -> pa.Table:
    """Columns from record attributes (dataclasses or any object with the field names)."""
    records = list(records)
    columns = [pa.array([getattr(r, f.name) for r in records], type=f.type) for f in schema]
    for column, f in zip(columns, schema, strict=True):
        if not f.nullable and column.null_count:
            raise ValueError(f"column {f.name!r} may not be null")
    return pa.Table.from_arrays(columns, schema=schema)


def part_name(worker_id: int, run_id: str, seq: int) -> str:
    return f"part-w{worker_id:02d}-{run_id}-{seq:05d}"


def part_key(table: str, name: str) -> str:
    return f"{table}/{name}{PART_SUFFIX}"


def part_path(job_dir: Path, table: str, name: str) -> Path:
    """The part's file in a local job directory."""
    return Path(job_dir) / part_key(table, name)


class PartWriter:
    """Buffers one worker's records and writes them as committed parts.

    A flush is due every `every_requests` result records, or `every_s` seconds after the last flush
    when anything is buffered. The caller records the returned part name in the manifest.
    `durable` fsyncs files and folders (about 25 ms a part here) so a commit also survives power
    loss; without it a part is still atomic against a killed process. On an object store each file
    is one upload, durable once it completes.
    """

    def __init__(
        self,
        job_dir: Location,
        worker_id: int,
        run_id: str,
        every_requests: int = 64,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        durable: bool = True,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        if not run_id or "/" in run_id or run_id.endswith(TMP_SUFFIX):
            raise ValueError(f"bad run_id {run_id!r}")
        self.storage = open_storage(job_dir)
        self.worker_id = worker_id
        self.run_id = run_id
        self.every_requests = every_requests
        self.every_s = every_s
        self._clock = clock
        self.durable = durable
        self.before_commit = before_commit  # raises if this writer may no longer commit (a lost lease)
        self._buffers: dict[str, list[Any]] = {table: [] for table in TABLES}
        self._last_flush = clock()
        self._seq = self._next_seq()

    def _next_seq(self) -> int:
        """Continue after any part this worker and run already wrote (a writer re-created in a run)."""
        mine = (self.worker_id, self.run_id)
        parsed = (_PART_RE.match(name) for name in committed_parts(self.storage))
        seqs = [int(m["seq"]) for m in parsed if m and (int(m["worker"]), m["run"]) == mine]
        return max(seqs, default=-1) + 1

    def add_round(self, record: Any) -> None:
        self._buffers["rounds"].append(record)

    def add_step(self, record: Any) -> None:
        self._buffers["steps"].append(record)

    def add_request(self, record: Any) -> None:
        self._buffers["requests"].append(record)

    def add_result(self, record: Any) -> None:
        self._buffers["results"].append(record)

    @property
    def num_buffered(self) -> int:
        return sum(len(records) for records in self._buffers.values())

    def is_flush_due(self) -> bool:
        if len(self._buffers["results"]) >= self.every_requests:
            return True
        return self.num_buffered > 0 and self._clock() - self._last_flush >= self.every_s

    def maybe_flush(self) -> str | None:
        return self.flush() if self.is_flush_due() else None

    def flush(self) -> str | None:
        """Write one part (all four tables, results last); returns its name, or None if empty."""
        if self.num_buffered == 0:
            return None
        name = part_name(self.worker_id, self.run_id, self._seq)
        tables = {table: to_table(self._buffers[table], SCHEMAS[table]) for table in TABLES}
        for table in TABLES:  # results last; each written whole (and synced) before the next
            if table == "results" and self.before_commit is not None:
                self.before_commit()
            self.storage.write_parquet(part_key(table, name), tables[table], self.durable)
        log.debug("committed part %s (%s)", name, {t: tables[t].num_rows for t in TABLES})
        self._seq += 1
        self._buffers = {table: [] for table in TABLES}
        self._last_flush = self._clock()
        return name


def _storage(job_dir: Location | Storage) -> Storage:
    return job_dir if isinstance(job_dir, Storage) else open_storage(job_dir)


def committed_parts(job_dir: Location | Storage) -> list[str]:
    """Part names whose results file exists (the commit point), in `part_order`; on an object store
    only those the newest fence lets count (`specbatch.fences`: not a stale lease holder's)."""
    storage = _storage(job_dir)
    names = [name[: -len(PART_SUFFIX)] for name in storage.names("results", PART_SUFFIX)]
    return sorted(fenced(names, latest_fence(storage)), key=part_order)


def committed_request_ids(job_dir: Location | Storage, statuses: Iterable[str] | None = None) -> set[str]:
    """Request ids in committed results parts, optionally only those with a given status."""
    wanted = None if statuses is None else set(statuses)
    columns = ["request_id"] if wanted is None else ["request_id", "status"]
    ids: set[str] = set()
    storage = _storage(job_dir)
    for name in committed_parts(storage):
        table = read_part(storage, part_key("results", name), columns=columns)
        if table is None:
            continue
        if wanted is None:
            ids.update(table.column("request_id").to_pylist())
            continue
        for request_id, status in zip(*(table.column(c).to_pylist() for c in columns), strict=True):
            if status in wanted:
                ids.add(request_id)
    return ids


def remove_orphan_parts(job_dir: Location | Storage, worker_id: int | None = None) -> list[str]:
    """Delete uncommitted files so a resumed job does not double count; returns their paths.

    Orphans are `*.tmp` files and parts in rounds/steps/requests whose results file is missing (the
    worker was killed mid-flush). Call it before any writer of the job starts, or with `worker_id`
    (only that worker's parts) before that worker's writer starts. A *committed* part may hold
    rounds and steps of requests that were still in flight and then lost in a crash; those rows
    stay, because that work really was done and wasted, and the re-run adds its own rows.
    """
    storage = _storage(job_dir)
    committed = set(committed_parts(storage))
    prefix = "" if worker_id is None else f"part-w{worker_id:02d}-"
    removed: list[str] = []
    for table in TABLES:
        for name in storage.names(table):
            is_tmp = name.endswith(TMP_SUFFIX)
            is_orphan = name.endswith(PART_SUFFIX) and name[: -len(PART_SUFFIX)] not in committed
            if name.startswith(prefix) and (is_tmp or is_orphan):
                storage.delete(f"{table}/{name}")
                removed.append(f"{table}/{name}")
    if removed:
        log.info("removed %d uncommitted part files from %s", len(removed), storage.location)
    return removed


def read_table(job_dir: Location | Storage, table: str) -> pa.Table:
    """All committed parts of one table, in part-name order (empty, with the schema, if none)."""
    schema = SCHEMAS[table]
    storage = _storage(job_dir)
    present = set(storage.names(table, PART_SUFFIX))
    names = [name for name in committed_parts(storage) if name + PART_SUFFIX in present]
    tables = [read_part(storage, part_key(table, name), schema=schema) for name in names]
    whole = [t for t in tables if t is not None]
    return pa.concat_tables(whole) if whole else schema.empty_table()


def read_part(storage: Storage, key: str, columns: list[str] | None = None,
              schema: pa.Schema | None = None) -> pa.Table | None:
    """One part file, or None (and a warning) when it is not valid Parquet: `ArrowInvalid`, or on a
    local disk any error but a missing or forbidden file (pyarrow raises a corrupt footer or page as
    a plain `OSError`). Elsewhere an I/O error is raised: a network error is not damage, and only a
    file known to be damaged may count as absent."""
    try:
        return storage.read_parquet(key, columns=columns, schema=schema)
    except (FileNotFoundError, PermissionError):
        raise
    except (pa.ArrowInvalid, OSError) as error:
        if not isinstance(error, pa.ArrowInvalid) and not storage.is_local:
            raise
        log.warning("skipping damaged part file %s (%s); the next run of the job moves its part to "
                    "quarantine/ and runs its requests again", storage.url(key), error)
        return None


def parse_part_name(name: str) -> tuple[int, str, int]:
    """(worker_id, run_id, seq) of a part name such as `part-w03-20240101T0000-00012`."""
    match = _PART_RE.match(name)
    if match is None:
        raise ValueError(f"not a part name: {name!r}")
    return int(match["worker"]), match["run"], int(match["seq"])


def part_order(name: str) -> tuple[int, str, int]:
    """Sort key (worker, run, seq) by number: `-100000` comes after `-99999`, which names do not."""
    try:
        return parse_part_name(name)
    except ValueError:
        return -1, name, -1  # not a part name: first, by name


def remove_fenced_out_parts(job_dir: Location | Storage) -> list[str]:
    """Delete the files of parts that the newest fence does not let count (a stale lease holder's,
    `specbatch.fences`), results first; returns the part names. A part fenced out stays fenced out
    under every later fence, so this is safe at any time; it keeps `JOB/results/*.parquet` (what the
    duckdb command line reads) to the committed set."""
    storage = _storage(job_dir)
    fence = latest_fence(storage)
    if fence is None:
        return []
    names = [name[: -len(PART_SUFFIX)] for name in storage.names("results", PART_SUFFIX)]
    stale = sorted(set(names) - set(fenced(names, fence)), key=part_order)
    for name in stale:
        for table in reversed(TABLES):  # results first: a reader never sees half of it as committed
            storage.delete(part_key(table, name))
    if stale:
        log.warning("removed %d parts of a superseded lease holder from %s: %s", len(stale), storage.location, stale)
    return stale


def retire_cancelled_results(job_dir: Location | Storage, capacity_drops: bool = False,
                             conditional: bool = False) -> int:
    """Remove `cancelled` rows (with `capacity_drops`, also rows dropped for one of `RERUN_DROP_REASONS`)
    from committed results parts so a resumed job runs them again.

    Each affected results file is rewritten atomically; its rounds/steps/requests rows stay (the
    cancelled attempt's work really was done). With `conditional` (an object-store lease holder), each
    rewrite is conditional on the version read (`StaleWriteError` if another runner rewrote it since).
    Returns the number of rows retired.
    """
    retired = 0
    storage = _storage(job_dir)
    for name in committed_parts(storage):
        key = part_key("results", name)
        version = storage.version(key) if conditional else None
        table = read_part(storage, key, schema=RESULTS_SCHEMA)
        if table is None:
            continue
        retire = pc.equal(table.column("status"), "cancelled")
        if capacity_drops:
            capacity = pc.is_in(table.column("drop_reason"), pa.array(sorted(RERUN_DROP_REASONS)))
            retire = pc.or_(retire, pc.and_(pc.equal(table.column("status"), "dropped"), pc.fill_null(capacity, False)))
        kept = table.filter(pc.invert(retire))
        if kept.num_rows < table.num_rows:
            retired += table.num_rows - kept.num_rows
            if not conditional:
                storage.write_parquet(key, kept, durable=True)
            elif not storage.write_if(key, _parquet_bytes(kept), version):
                raise StaleWriteError(f"{storage.url(key)} was rewritten by another runner")
    return retired


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
