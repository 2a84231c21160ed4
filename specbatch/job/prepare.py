"""The first step of a job: create or resume its directory (manifest, ingest + shards).

`prepare` is idempotent: a new job ingests; an existing one is resumed after checking the
dataset's fingerprint and what changed in the config (`specbatch.job.drift`). Every step leaves the
job directory resumable: shards are rewritten from scratch if ingest did not finish, and workers
skip what already has a committed completed or dropped result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.data.ingest import resolve_dataset, unread_splits
from specbatch.data.shards import shard_dataset
from specbatch.engine.dtype_choice import AUTO, concrete_dtype
from specbatch.engine.loading import context_limit, load_tokenizer
from specbatch.job.drift import config_changes, record_config, refusal
from specbatch.job.inputs import JobError
from specbatch.job.manifest import (
    Manifest,
    fingerprint,
    has_manifest,
    load_manifest,
    new_manifest,
    save_manifest,
    update_manifest,
)
from specbatch.ledger import retire_cancelled_results
from specbatch.storage import Location, is_url, location_name

log = logging.getLogger(__name__)

def prepare(dataset: Location, job_dir: Location, config: JobConfig, force: bool = False,
            dataset_format: str | None = None, column_map: dict[str, str] | None = None,
            epoch: int = 0, notice: Callable[[str], None] = log.warning) -> Manifest:
    """Create or resume a job directory (a local path or an object-store URL); ingest the dataset
    into shards if not done yet. `epoch`: the runner's lease number on an object store, which fences
    its manifest writes (`update_manifest`). `notice`: what the user must hear though the job goes on
    (a forced resume over a changed dataset runs the records cut before the change)."""
    manifest = load_manifest(job_dir) if has_manifest(job_dir) else None
    if manifest is not None:  # a resume needs not repeat --format / --column, and may not change them
        if column_map and column_map != manifest.dataset.column_map:
            raise JobError(f"--column {column_map} differs from job {location_name(job_dir)}'s "
                           f"{manifest.dataset.column_map}: its shards were cut with that mapping; use a new --job-id")
        dataset_format = dataset_format or manifest.dataset.format
        column_map = column_map or manifest.dataset.column_map or None
    source = resolve_dataset(str(dataset), dataset_format, column_map)
    config = with_concrete_dtype(config, manifest)
    if manifest is not None:
        if fingerprint(source.path) != manifest.dataset.fingerprint:
            if not force:
                raise JobError(f"dataset {source.path} changed since job {location_name(job_dir)} started "
                               "(fingerprint differs); use a new --job-id, or --force to continue anyway")
            notice(f"dataset {source.path} changed since job {location_name(job_dir)} started: --force goes on "
                   f"with the {manifest.dataset.num_records} records read then; records added or changed "
                   "since are not run (a new --job-id runs them)")
        if manifest.status not in ("created", "ingesting"):
            changes = config_changes(manifest.config, config)
            refused = refusal(manifest, changes, config)
            if refused and not force:
                raise JobError(refused)
            retired = retire_cancelled_results(job_dir, conditional=bool(epoch))
            if retired:
                log.info("resuming: %d cancelled requests will run again", retired)
            return update_manifest(job_dir, lambda m: record_config(m, config, changes, forced=bool(refused)), epoch)
    if not is_url(job_dir):
        Path(job_dir).mkdir(parents=True, exist_ok=True)
    if skipped := unread_splits(source):
        notice(f"dataset {source.path} holds splits train, {', '.join(skipped)}: the job reads train only; "
               f"pass a split's folder ({Path(source.path) / skipped[0]}) to run another")
    manifest = new_manifest(location_name(job_dir), source.path, source.format, config, source.column_map)
    manifest.status, manifest.lease_epoch = "ingesting", epoch
    save_manifest(job_dir, manifest)
    tokenizer = load_tokenizer(config.models)
    shards = shard_dataset(source, job_dir, config, tokenizer, max_prompt_tokens(config),
                           unread_fields=manifest.dataset.unread_fields)
    manifest.set_shards(shards)
    manifest.status = "ready"
    save_manifest(job_dir, manifest)
    return manifest


def with_concrete_dtype(config: JobConfig, manifest: Manifest | None) -> JobConfig:
    """`models.dtype: auto` made concrete before it is recorded: a resume keeps the dtype the job's
    first outputs were made at (the manifest's), a new job takes what this machine runs fastest."""
    if config.models.dtype != AUTO:
        return config
    recorded = manifest.config.get("models", {}).get("dtype") if manifest is not None else None
    dtype = recorded if recorded not in (None, AUTO) else concrete_dtype(AUTO, config.models.device)
    log.info("models.dtype auto: %s", dtype)
    return config.model_copy(update={"models": config.models.model_copy(update={"dtype": dtype})})


def max_prompt_tokens(config: JobConfig) -> int:
    """Longest admissible prompt: room for one new token in the context. Not the KV capacity (a speed
    field): a prompt it cannot hold is dropped by the run (`exceeds_kv_capacity`), which a resume
    with more capacity runs again, where a drop in the shards would be for good."""
    limit = context_limit(config.models) - 1
    if config.capacity.max_context:
        limit = min(limit, config.capacity.max_context - 1)
    return max(limit, 1)

