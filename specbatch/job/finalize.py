"""The last step of a job: its summary from the committed results, the exported results files
(results.jsonl, and openai_output.jsonl for OpenAI batch input), and its status in the manifest.

On an object store a runner can stall inside finalize past its lease, and wake up after another runner
took the job over and finished it; its view of the results is then stale. So every file finalize
writes there is fenced by the runner's epoch (its lease number), not only checked once: the exports
are conditional PUTs on the versions they had before anything was read (another runner's export in
between makes them fail), retired results parts likewise, and the manifest refuses a writer older than
its last one (`update_manifest`). A runner whose write is refused stops with `LeaseLostError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from specbatch.data.shards import SHARDS_FOLDER, read_shard
from specbatch.job.lock import LeaseLostError, check_epoch
from specbatch.job.manifest import JobStatus, Manifest, load_manifest, update_manifest
from specbatch.job.openai_output import output_line
from specbatch.ledger import read_table, remove_fenced_out_parts, retire_cancelled_results
from specbatch.storage import Location, StaleWriteError, Storage, location_name, open_storage

DONE_STATUSES = ("completed", "dropped")  # a request with such a result never runs again; cancelled ones do
RESULTS_JSONL, OPENAI_OUTPUT = "results.jsonl", "openai_output.jsonl"
EXPORTS = (RESULTS_JSONL, OPENAI_OUTPUT)


@dataclass(frozen=True)
class JobSummary:
    job_dir: str  # a local path or an object-store URL
    num_records: int
    num_completed: int
    num_dropped: int
    num_cancelled: int
    num_output_tokens: int
    drop_reasons: dict[str, int]
    unread_fields: dict[str, str] = field(default_factory=dict)  # `DatasetInfo.unread_fields`

    @property
    def job_id(self) -> str:
        return location_name(self.job_dir)

    @property
    def is_complete(self) -> bool:
        return self.num_completed + self.num_dropped == self.num_records

    def rows(self) -> list[tuple[str, int | str]]:
        """(name, value) lines of the summary a person reads: the terminal's table, the run's artifact."""
        rows: list[tuple[str, int | str]] = [
            ("records", self.num_records), ("completed", self.num_completed), ("dropped", self.num_dropped),
            ("cancelled", self.num_cancelled), ("output tokens", self.num_output_tokens)]
        rows += [(f"dropped: {reason}", count) for reason, count in sorted(self.drop_reasons.items())]
        rows += [(f"not read: {name}", f"kept as metadata; specbatch reads {ours}")
                 for name, ours in sorted(self.unread_fields.items())]
        return rows


def summarize(job_dir: Location) -> JobSummary:
    """Counts of the committed results; a cancelled row of a request that ran again since is not counted."""
    manifest = load_manifest(job_dir)
    columns = ["request_id", "status", "drop_reason", "num_output_tokens"]
    rows = read_table(job_dir, "results").select(columns).to_pylist()
    done = {row["request_id"] for row in rows if row["status"] in DONE_STATUSES}
    results = [row for row in rows if row["status"] in DONE_STATUSES or row["request_id"] not in done]
    counts = {"completed": 0, "dropped": 0, "cancelled": 0}
    reasons: dict[str, int] = {}
    for row in results:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        if row["status"] == "dropped":
            reasons[row["drop_reason"]] = reasons.get(row["drop_reason"], 0) + 1
    return JobSummary(str(job_dir), manifest.dataset.num_records, counts["completed"], counts["dropped"],
                      counts["cancelled"], sum(r["num_output_tokens"] or 0 for r in results), reasons,
                      dict(manifest.dataset.unread_fields))


def finalize(job_dir: Location, stopped: bool = False, epoch: int = 0) -> JobSummary:
    """Export results.jsonl (and an OpenAI batch output file) and record the job's status: `done`
    when complete, `cancelled` when `stopped` (even before any row was cancelled) or rows ended
    cancelled, else `running` (what is left runs on resume). `epoch`: the runner's lease number on an
    object store (0: unfenced); a stale runner's writes are refused with `LeaseLostError`."""
    storage = open_storage(job_dir)
    versions = {name: storage.version(name) for name in EXPORTS}  # before any read: see the module doc
    check_epoch(job_dir, epoch)
    summary = summarize(job_dir)
    manifest = load_manifest(job_dir)
    try:
        check_epoch(job_dir, epoch)  # again: reading the results takes time
        if summary.is_complete:  # every cancelled row left ran again since; keep them out of the exports
            retire_cancelled_results(job_dir, conditional=bool(epoch))
        if epoch:  # this holder's run is over: parts no fence lets count leave results/
            remove_fenced_out_parts(storage)
        export_results_jsonl(job_dir, versions[RESULTS_JSONL])
        if manifest.dataset.format == "openai_batch":
            export_openai_output(job_dir, versions[OPENAI_OUTPUT])
    except StaleWriteError as error:  # only another runner writes these: this one lost the job
        raise LeaseLostError(f"{error}; this run (lease {epoch}) stops without writing more, the other run "
                             "owns the job now") from None
    status: JobStatus = "done" if summary.is_complete else (
        "cancelled" if stopped or summary.num_cancelled else "running")

    def change(m: Manifest) -> None:
        m.status = status
        m.counters = {"num_completed": summary.num_completed, "num_dropped": summary.num_dropped,
                      "num_cancelled": summary.num_cancelled, "num_output_tokens": summary.num_output_tokens}

    update_manifest(job_dir, change, epoch)
    return summary


def mark_failed(job_dir: Location, epoch: int = 0) -> None:
    """Record that a run of the job failed (its error is in error.log); a resume runs it again."""

    def change(m: Manifest) -> None:
        m.status = "failed"

    update_manifest(job_dir, change, epoch)


def export_results_jsonl(job_dir: Location, version: str | None | Literal["any"] = "any") -> str:
    """JOB/results.jsonl, written whole, in dataset order; returns its path or URL. With `version`,
    only over that version of the file (`StaleWriteError` otherwise)."""
    storage = open_storage(job_dir)
    rows = _in_dataset_order(job_dir, read_table(storage, "results").to_pylist())
    lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    _write_export(storage, RESULTS_JSONL, lines, version)
    return storage.url(RESULTS_JSONL)


def export_openai_output(job_dir: Location, version: str | None | Literal["any"] = "any") -> str:
    """The OpenAI batch *output* format: one line per input line, by custom_id, in input order."""
    storage = open_storage(job_dir)
    endpoints = _shard_column(job_dir, "endpoint")
    rows = _in_dataset_order(job_dir, read_table(storage, "results").to_pylist())
    lines = (json.dumps(output_line(row, endpoints.get(row["request_id"]), index)) + "\n"
             for index, row in enumerate(rows))
    _write_export(storage, OPENAI_OUTPUT, lines, version)
    return storage.url(OPENAI_OUTPUT)


def _write_export(storage: Storage, key: str, lines: Iterable[str], version: str | None | Literal["any"]) -> None:
    """Streamed whole where no version is asked for (a local job: its flock keeps one writer);
    else one conditional write."""
    if version == "any" or storage.is_local:
        with storage.open_write(key) as out:
            for line in lines:
                out.write(line.encode())
        return
    if not storage.write_if(key, "".join(lines).encode(), version):
        raise StaleWriteError(f"{storage.url(key)} was written by another runner while this one finalized")


def _in_dataset_order(job_dir: Location, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Result rows sorted by their record's position in the input: parts hold them in the order
    workers finished them, and ingest groups records (by domain, shared prefix, length) into shards."""
    positions = _shard_column(job_dir, "position")
    return sorted(rows, key=lambda row: positions.get(row["request_id"], len(positions)))


def _shard_column(job_dir: Location, column: str) -> dict[str, Any]:
    """request_id -> one shard column, over every shard."""
    storage = open_storage(job_dir)
    values: dict[str, Any] = {}
    for name in storage.names(SHARDS_FOLDER, ".parquet"):
        table = read_shard(storage.url(f"{SHARDS_FOLDER}/{name}")).select(["request_id", column])
        values.update(zip(table.column("request_id").to_pylist(), table.column(column).to_pylist(), strict=True))
    return values
