"""A job from dataset to outputs: prepare (manifest, ingest + shards), run workers, finalize.

`prepare` is idempotent: a new job ingests; an existing one is resumed after checking the
dataset's fingerprint. Every step leaves the job directory resumable: shards are rewritten from
scratch if ingest did not finish, and workers skip what already has a committed result.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from specbatch.config import JobConfig, config_to_dict
from specbatch.data.ingest import resolve_dataset
from specbatch.data.shards import shard_dataset
from specbatch.engine.loading import context_limit, load_tokenizer
from specbatch.job.manifest import (
    Manifest,
    fingerprint,
    load_manifest,
    manifest_path,
    new_manifest,
    save_manifest,
    update_manifest,
)
from specbatch.ledger import read_table, retire_cancelled_results

log = logging.getLogger(__name__)


class JobError(ValueError):
    """A job that cannot start as asked (changed dataset, bad job id); exit code 2."""


@dataclass(frozen=True)
class JobSummary:
    job_dir: Path
    num_records: int
    num_completed: int
    num_dropped: int
    num_cancelled: int
    num_output_tokens: int
    drop_reasons: dict[str, int]

    @property
    def is_complete(self) -> bool:
        return self.num_completed + self.num_dropped == self.num_records


def check_job_id(job_id: str) -> str:
    if not job_id or job_id in (".", "..") or "/" in job_id or "\\" in job_id:
        raise JobError(f"job id {job_id!r} must be a plain directory name")
    return job_id


def prepare(dataset: Path, job_dir: Path, config: JobConfig, force: bool = False,
            dataset_format: str | None = None, column_map: dict[str, str] | None = None) -> Manifest:
    """Create or resume a job directory; ingest the dataset into shards if not done yet."""
    manifest = load_manifest(job_dir) if manifest_path(job_dir).exists() else None
    if manifest is not None:  # a resume needs not repeat --format / --column
        dataset_format = dataset_format or manifest.dataset.format
        column_map = column_map or manifest.dataset.column_map or None
    source = resolve_dataset(dataset, dataset_format, column_map)
    if manifest is not None:
        if fingerprint(source.path) != manifest.dataset.fingerprint and not force:
            raise JobError(f"dataset {source.path} changed since job {job_dir.name} started "
                           "(fingerprint differs); use a new --job-id, or --force to continue anyway")
        if manifest.status not in ("created", "ingesting"):
            retired = retire_cancelled_results(job_dir)
            if retired:
                log.info("resuming: %d cancelled requests will run again", retired)
            return update_manifest(job_dir, lambda m: _set_config(m, config))
    job_dir.mkdir(parents=True, exist_ok=True)
    manifest = new_manifest(job_dir.name, source.path, source.format, config, source.column_map)
    manifest.status = "ingesting"
    save_manifest(job_dir, manifest)
    tokenizer = load_tokenizer(config.models)
    shards = shard_dataset(source.path, job_dir, config, tokenizer, max_prompt_tokens(config),
                           source.format, source.column_map)
    manifest.set_shards(shards)
    manifest.status = "ready"
    save_manifest(job_dir, manifest)
    return manifest


def max_prompt_tokens(config: JobConfig) -> int:
    """Longest admissible prompt: room for one new token (and its drafts) in context and KV."""
    k_max = 0 if config.drafter.kind == "none" else config.scheduler.max_lookahead
    limit = context_limit(config.models) - 1
    if config.capacity.max_context:
        limit = min(limit, config.capacity.max_context - 1)
    if config.capacity.kv_tokens:
        limit = min(limit, config.capacity.kv_tokens - k_max - 2)
    return max(limit, 1)


def _set_config(manifest: Manifest, config: JobConfig) -> None:
    manifest.config = config_to_dict(config)


def summarize(job_dir: Path) -> JobSummary:
    manifest = load_manifest(job_dir)
    results = read_table(job_dir, "results").select(["status", "drop_reason", "num_output_tokens"]).to_pylist()
    counts = {"completed": 0, "dropped": 0, "cancelled": 0}
    reasons: dict[str, int] = {}
    for row in results:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        if row["status"] == "dropped":
            reasons[row["drop_reason"]] = reasons.get(row["drop_reason"], 0) + 1
    return JobSummary(job_dir, manifest.dataset.num_records, counts["completed"], counts["dropped"],
                      counts["cancelled"], sum(r["num_output_tokens"] or 0 for r in results), reasons)


def finalize(job_dir: Path) -> JobSummary:
    """Export results.jsonl (and an OpenAI batch output file) and record the job's status."""
    summary = summarize(job_dir)
    manifest = load_manifest(job_dir)
    export_results_jsonl(job_dir)
    if manifest.dataset.format == "openai_batch":
        export_openai_output(job_dir)
    status = "done" if summary.is_complete else ("cancelled" if summary.num_cancelled else "running")

    def change(m: Manifest) -> None:
        m.status = status
        m.counters = {"num_completed": summary.num_completed, "num_dropped": summary.num_dropped,
                      "num_cancelled": summary.num_cancelled, "num_output_tokens": summary.num_output_tokens}

    update_manifest(job_dir, change)
    return summary


def export_results_jsonl(job_dir: Path) -> Path:
    path = job_dir / "results.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for row in read_table(job_dir, "results").to_pylist():
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def export_openai_output(job_dir: Path) -> Path:
    """The OpenAI batch *output* format: one line per input line, by custom_id."""
    from specbatch.job.openai_output import output_line

    endpoints = _endpoints(job_dir)
    path = job_dir / "openai_output.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for index, row in enumerate(read_table(job_dir, "results").to_pylist()):
            out.write(json.dumps(output_line(row, endpoints.get(row["request_id"]), index)) + "\n")
    tmp.replace(path)
    return path


def _endpoints(job_dir: Path) -> dict[str, str | None]:
    import pyarrow.parquet as pq

    endpoints: dict[str, str | None] = {}
    for shard in sorted((job_dir / "shards").glob("*.parquet")):
        table = pq.read_table(shard, columns=["request_id", "endpoint"])
        endpoints.update(zip(table.column("request_id").to_pylist(), table.column("endpoint").to_pylist()))
    return endpoints
