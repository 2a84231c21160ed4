"""The first step of a job: create or resume its directory (manifest, ingest + shards).

`prepare` is idempotent: a new job ingests; an existing one is resumed after checking the
dataset's fingerprint. Every step leaves the job directory resumable: shards are rewritten from
scratch if ingest did not finish, and workers skip what already has a committed result.
"""

from __future__ import annotations

import logging
import time
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
from specbatch.ledger import retire_cancelled_results

log = logging.getLogger(__name__)


class JobError(ValueError):
    """A job that cannot start as asked (changed dataset, bad job id); exit code 2."""


def default_job_id() -> str:
    return f"job-{time.strftime('%Y%m%d-%H%M%S')}"


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
