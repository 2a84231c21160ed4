"""The last step of a job: its summary from the committed results, the exported results files
(results.jsonl, and openai_output.jsonl for OpenAI batch input), and its status in the manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specbatch.data.shards import SHARDS_FOLDER, read_shard
from specbatch.job.manifest import JobStatus, Manifest, load_manifest, update_manifest
from specbatch.job.openai_output import output_line
from specbatch.ledger import read_table, retire_cancelled_results
from specbatch.storage import Location, location_name, open_storage

DONE_STATUSES = ("completed", "dropped")  # a request with such a result never runs again; cancelled ones do


@dataclass(frozen=True)
class JobSummary:
    job_dir: str  # a local path or an object-store URL
    num_records: int
    num_completed: int
    num_dropped: int
    num_cancelled: int
    num_output_tokens: int
    drop_reasons: dict[str, int]

    @property
    def job_id(self) -> str:
        return location_name(self.job_dir)

    @property
    def is_complete(self) -> bool:
        return self.num_completed + self.num_dropped == self.num_records


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
                      counts["cancelled"], sum(r["num_output_tokens"] or 0 for r in results), reasons)


def finalize(job_dir: Location, stopped: bool = False) -> JobSummary:
    """Export results.jsonl (and an OpenAI batch output file) and record the job's status: `done`
    when complete, `cancelled` when `stopped` (even before any row was cancelled) or rows ended
    cancelled, else `running` (what is left runs on resume)."""
    summary = summarize(job_dir)
    manifest = load_manifest(job_dir)
    if summary.is_complete:  # every cancelled row left ran again since; keep them out of the exports
        retire_cancelled_results(job_dir)
    export_results_jsonl(job_dir)
    if manifest.dataset.format == "openai_batch":
        export_openai_output(job_dir)
    status: JobStatus = "done" if summary.is_complete else (
        "cancelled" if stopped or summary.num_cancelled else "running")

    def change(m: Manifest) -> None:
        m.status = status
        m.counters = {"num_completed": summary.num_completed, "num_dropped": summary.num_dropped,
                      "num_cancelled": summary.num_cancelled, "num_output_tokens": summary.num_output_tokens}

    update_manifest(job_dir, change)
    return summary


def mark_failed(job_dir: Location) -> None:
    """Record that a run of the job failed (its error is in error.log); a resume runs it again."""

    def change(m: Manifest) -> None:
        m.status = "failed"

    update_manifest(job_dir, change)


def export_results_jsonl(job_dir: Location) -> str:
    """JOB/results.jsonl, written whole, in dataset order; returns its path or URL."""
    storage = open_storage(job_dir)
    with storage.open_write("results.jsonl") as out:
        for row in _in_dataset_order(job_dir, read_table(storage, "results").to_pylist()):
            out.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
    return storage.url("results.jsonl")


def export_openai_output(job_dir: Location) -> str:
    """The OpenAI batch *output* format: one line per input line, by custom_id, in input order."""
    storage = open_storage(job_dir)
    endpoints = _shard_column(job_dir, "endpoint")
    with storage.open_write("openai_output.jsonl") as out:
        rows = _in_dataset_order(job_dir, read_table(storage, "results").to_pylist())
        for index, row in enumerate(rows):
            out.write((json.dumps(output_line(row, endpoints.get(row["request_id"]), index)) + "\n").encode())
    return storage.url("openai_output.jsonl")


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
