"""What a resumed job may change in its config: speed, freely (recorded in the manifest); outputs, not
without `--force` (rows before and after would answer different questions).

Which field is which is `specbatch.config.changes_outputs`. A GGUF file's bytes count as its field:
other bytes under the target's path (`models.target file`) change outputs, a draft's only speed. One
derived limit is checked too: a new draft may not shorten the context ingest cut prompts to (the
smaller of both models' positions), or a prompt that fit would no longer fit its slot.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from specbatch.config import JobConfig, changes_outputs, config_to_dict
from specbatch.engine.loading import context_limit
from specbatch.engine.model_paths import ModelLoadError
from specbatch.job.manifest import Manifest, model_fingerprints

Changes = dict[str, tuple[Any, Any]]  # field path (or "FIELD file": a GGUF's fingerprint) -> (old value, new value)
FILE_SUFFIX = " file"


def config_changes(old: dict[str, Any], config: JobConfig) -> Changes:
    """Fields whose value differs; the old config is re-validated first, so a field added since (at
    its default) is no change."""
    with suppress(ValidationError):  # else written by another version: compare as stored
        old = config_to_dict(JobConfig.model_validate(old))
    return dict(_diff(old, config_to_dict(config), ""))


def _diff(old: Any, new: Any, path: str) -> list[tuple[str, tuple[Any, Any]]]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [item for key in keys for item in _diff(old.get(key), new.get(key), f"{path}{key}.")]
    return [] if old == new else [(path.rstrip("."), (old, new))]


def file_changes(old: dict[str, str], now: dict[str, str]) -> Changes:
    """GGUF fingerprints (`Manifest.model_files`) that differ, as "FIELD file"; a field with none on
    one side (an older manifest, a model that is no GGUF now) is the config's change, not the file's."""
    return {f"{field}{FILE_SUFFIX}": (fp, now[field]) for field, fp in old.items() if now.get(field, fp) != fp}


def refusal(manifest: Manifest, changes: Changes, config: JobConfig) -> str | None:
    """Why the job may not resume with `changes` or other GGUF bytes (those that change outputs,
    listed), or None."""
    changes = {**changes, **file_changes(manifest.model_files, model_fingerprints(config))}
    refused = {path: change for path, change in changes.items() if changes_outputs(path.removesuffix(FILE_SUFFIX))}
    if "models.draft" in changes and _context_shrinks(manifest.config, config):
        refused["models.draft"] = changes["models.draft"]
    if not refused:
        return None
    listed = "; ".join(f"{path}: {old!r} → {new!r}" for path, (old, new) in refused.items())
    return (f"the config of job {manifest.job_id} changed in ways that change outputs: {listed}. Use a new "
            "--job-id, or --force to resume anyway (speed settings such as scheduler.*, drafter.*, workers.* "
            "may change on resume)")


def _context_shrinks(old: dict[str, Any], config: JobConfig) -> bool:
    try:
        before = context_limit(JobConfig.model_validate(old).models)
    except (ValidationError, ModelLoadError):
        return False  # the old draft is gone: its context cannot be compared
    return context_limit(config.models) < before


def record_config(manifest: Manifest, config: JobConfig, changes: Changes, forced: bool) -> None:
    """Take the new config and GGUF fingerprints; append what changed to `config_history`."""
    now = model_fingerprints(config)
    changes = {**changes, **file_changes(manifest.model_files, now)}
    manifest.config, manifest.model_files = config_to_dict(config), now
    if changes:
        manifest.config_history.append({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                        "changed": {path: list(change) for path, change in changes.items()},
                                        "forced": forced})
