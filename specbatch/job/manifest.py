"""`JOB_DIR/manifest.json`: what a job is (config, dataset and GGUF model fingerprints, versions) and
how far it got.

Several worker processes update one manifest, so every change goes through `update_manifest`, which
holds an exclusive `fcntl.flock` on `JOB_DIR/.manifest.lock` around load -> change -> save. Saves are
atomic (temporary file, fsync, `os.replace`, fsync of the directory): a reader, or a job killed at
any point, sees either the old manifest or the new one, never half of one.

Committed parts are not saved that way: rewriting the whole manifest per part is quadratic in parts.
`append_part` adds one fsynced line to the journal `JOB_DIR/manifest.parts.log`; `load_manifest`
folds the journal into `Manifest.parts`, and the next save writes them into manifest.json and drops
the journal. The results folder stays the source of truth for what is committed (see ledger.py).

A job on an object store has neither `flock` nor rename. There the manifest has one writer, the
holder of the job's lease (the flow: ingest, shard status, finalize), and each save is one PUT; worker
processes never write it, and `parts` is not journaled (the results folder lists committed parts).
A holder that stalls past its lease could still write after a takeover, so `update_manifest` takes
the holder's epoch (its lease number): the save is a conditional PUT on the version it loaded
(`Storage.write_if`), and it records the epoch in `lease_epoch`; a manifest whose `lease_epoch` is
newer than the writer's is never written (`LeaseLostError`). Once a new holder has saved the
manifest, no earlier holder's write can land.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from specbatch.config import JobConfig, config_to_dict
from specbatch.engine.model_paths import gguf_file
from specbatch.faults import crash_point
from specbatch.job.lease import LeaseLostError
from specbatch.ledger import parse_part_name
from specbatch.storage import Location, Storage, fsync_dir, is_url, open_input, open_no_follow, open_storage

if TYPE_CHECKING:
    from specbatch.data.shards import ShardInfo

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".manifest.lock"
JOURNAL_NAME = "manifest.parts.log"
MANIFEST_MODE = 0o644  # as the job's other files under the usual umask
_VERSIONED_PACKAGES = ("specbatch", "torch", "transformers", "tokenizers", "datasets", "pyarrow")
_CHUNK_BYTES = 1 << 20
_MAX_SAVE_TRIES = 8  # conditional saves of an object-store manifest that another writer keeps beating

JobStatus = Literal["created", "ingesting", "ready", "running", "done", "cancelled", "failed"]
ShardStatus = Literal["pending", "running", "done"]


class ManifestError(ValueError):
    """A manifest that exists but cannot be read; the CLI prints it and exits with code 2."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DatasetInfo(_Model):
    path: str
    format: str
    fingerprint: str
    num_records: int = 0
    num_dropped_at_ingest: int = 0
    column_map: dict[str, str] = {}
    unread_fields: dict[str, str] = {}  # kept as metadata, though another engine reads them for ours: field -> ours


class ShardEntry(_Model):
    name: str
    num_records: int
    num_dropped: int
    max_request_tokens: int | None = None  # longest prompt + max_new_tokens; None: unknown (older manifests)
    shared_prefix_tokens: int = 0  # positions of the prefixes its prompts share (0 in older manifests)
    status: ShardStatus = "pending"
    worker_id: int | None = None


class Manifest(_Model):
    job_id: str
    created_at: str  # ISO 8601, UTC
    status: JobStatus = "created"
    dataset: DatasetInfo
    config: dict[str, Any]
    config_history: list[dict[str, Any]] = []  # per resume that changed it: {at, changed: {field: [old, new]}, forced}
    model_files: dict[str, str] = {}  # config field naming a GGUF file (models.target, ...) -> its `fingerprint`
    versions: dict[str, str]
    shards: list[ShardEntry] = []
    parts: list[str] = []  # committed part names, in commit order (manifest.json + the journal)
    counters: dict[str, int | float] = {}  # raw totals (records done, dropped, ...); rates are derived
    lease_epoch: int = 0  # object store: the lease number of the runner that last saved it (0 on a local disk)

    def set_shards(self, shards: Iterable[ShardInfo]) -> None:
        """Record the shards ingest wrote; all start `pending`."""
        self.shards = [
            ShardEntry(name=shard.name, num_records=shard.num_records, num_dropped=shard.num_dropped,
                       max_request_tokens=shard.max_request_tokens, shared_prefix_tokens=shard.shared_prefix_tokens)
            for shard in shards
        ]
        self.dataset.num_records = sum(entry.num_records for entry in self.shards)
        self.dataset.num_dropped_at_ingest = sum(entry.num_dropped for entry in self.shards)


def new_manifest(
    job_id: str,
    dataset_path: Location,
    dataset_format: str,
    config: JobConfig,
    column_map: dict[str, str] | None = None,
) -> Manifest:
    """A fresh manifest for a job about to ingest; fingerprints the dataset (one streamed read)."""
    dataset = DatasetInfo(
        path=str(dataset_path) if is_url(dataset_path) else str(Path(dataset_path).resolve()),
        format=dataset_format,
        fingerprint=fingerprint(dataset_path),
        column_map=dict(column_map or {}),
    )
    return Manifest(
        job_id=job_id,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        dataset=dataset,
        config=config_to_dict(config),
        model_files=model_fingerprints(config),
        versions=collect_versions(),
    )


def model_fingerprints(config: JobConfig) -> dict[str, str]:
    """`fingerprint` of each GGUF file the job's models use, by config field: the config holds only
    a path, and other bytes under it (another quantization, a package upgrade) are another model."""
    models = config.models
    named = {"models.target": models.target, "models.tokenizer": models.tokenizer,
             "models.draft": models.draft if config.drafter.model_kind == "draft" else None}
    return {field: fingerprint(file) for field, name in named.items()
            if name is not None and (file := gguf_file(name)) is not None}


def fingerprint(path: Location) -> str:
    """`sha256:<hex>` over the file's bytes (the same for a local file and its copy in an object
    store); for a directory over (relative path, size, bytes) of every file in sorted order, so
    renaming, adding or changing any file changes it."""
    digest = hashlib.sha256()
    if is_url(path):
        with open_input(path) as stream:
            _hash_stream(digest, stream)
        return f"sha256:{digest.hexdigest()}"
    path = Path(path)
    if not path.is_dir():
        _hash_file(digest, path)
        return f"sha256:{digest.hexdigest()}"
    files = sorted((file.relative_to(path).as_posix(), file) for file in path.rglob("*") if file.is_file())
    for relative, file in files:
        name = relative.encode("utf-8")
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(file.stat().st_size.to_bytes(8, "little"))
        _hash_file(digest, file)
    return f"sha256:{digest.hexdigest()}"


def collect_versions() -> dict[str, str]:
    """Installed versions, read from package metadata so that nothing heavy (torch) is imported."""
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def manifest_path(job_dir: Path) -> Path:
    return Path(job_dir) / MANIFEST_NAME


def has_manifest(job_dir: Location) -> bool:
    return open_storage(job_dir).exists(MANIFEST_NAME)


def load_manifest(job_dir: Location) -> Manifest:
    """The job's manifest; `FileNotFoundError` if there is none, `ManifestError` if it is unreadable."""
    storage = open_storage(job_dir)
    text = storage.read_text(MANIFEST_NAME)
    try:
        manifest = Manifest.model_validate_json(text)
    except ValidationError as error:
        raise ManifestError(f"{storage.url(MANIFEST_NAME)} is not a valid specbatch manifest: {error}") from error
    if storage.is_local:
        manifest.parts.extend(_journaled_parts(job_dir, manifest.parts))
    return manifest


def _journaled_parts(job_dir: Location, known: list[str]) -> list[str]:
    """Journal lines not in `known`, once each: a crash between a save and the journal's removal
    leaves both holding a part. The text after the last newline is a line torn by a crash."""
    try:
        text = (Path(job_dir) / JOURNAL_NAME).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    seen = set(known)
    added: list[str] = []
    for name in text.split("\n")[:-1]:
        if _is_part_name(name) and name not in seen:  # a garbage line is not a part
            seen.add(name)
            added.append(name)
    return added


def _is_part_name(name: str) -> bool:
    try:
        parse_part_name(name)
    except ValueError:
        return False
    return True


def save_manifest(job_dir: Location, manifest: Manifest) -> None:
    """Write atomically: a temporary file in the same directory, fsync, rename, fsync the directory
    (on an object store: one PUT).

    `manifest.parts` then holds the journal's parts too (it was loaded with them), so the journal
    goes. While workers run, save only through `update_manifest`: its lock keeps out `append_part`.
    """
    if is_url(job_dir):
        crash_point("manifest_write")
        _save_object_manifest(open_storage(job_dir), manifest)
        return
    job_dir = Path(job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=job_dir, prefix=".manifest.", suffix=".tmp")
    try:
        os.fchmod(fd, MANIFEST_MODE)  # mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(manifest.model_dump_json(indent=2))
            file.flush()
            os.fsync(file.fileno())
        crash_point("manifest_write")
        os.replace(tmp, manifest_path(job_dir))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(job_dir)
    (job_dir / JOURNAL_NAME).unlink(missing_ok=True)


def update_manifest(job_dir: Location, change: Callable[[Manifest], Manifest | None], epoch: int = 0) -> Manifest:
    """Load, apply `change` (mutate in place or return a new manifest), save; under the job lock. On
    an object store, fenced by `epoch` (the writer's lease number; 0: unfenced), see the module doc."""
    if is_url(job_dir):
        return _update_object_manifest(job_dir, change, epoch)
    with manifest_lock(job_dir):
        manifest = load_manifest(job_dir)
        changed = change(manifest)
        manifest = manifest if changed is None else changed
        save_manifest(job_dir, manifest)
        if not is_url(job_dir):  # a save killed before its rename left its temporary file; none runs now
            for stale in Path(job_dir).glob(".manifest.*.tmp"):
                stale.unlink(missing_ok=True)
        return manifest


def _save_object_manifest(storage: Storage, manifest: Manifest) -> None:
    """One PUT; with `manifest.lease_epoch` (the writer's), a conditional one that never replaces a
    manifest a newer lease holder saved (ingest's saves, which load nothing first)."""
    data = manifest.model_dump_json(indent=2).encode()
    if not manifest.lease_epoch:
        storage.write_bytes(MANIFEST_NAME, data)
        return
    for _ in range(_MAX_SAVE_TRIES):
        version = storage.version(MANIFEST_NAME)
        if version is not None:
            try:
                saved_by = int(json.loads(storage.read_text(MANIFEST_NAME)).get("lease_epoch") or 0)
            except (ValueError, AttributeError, FileNotFoundError):  # not a manifest: nothing to respect
                saved_by = 0
            if saved_by > manifest.lease_epoch:
                raise _stale(manifest.job_id, saved_by, manifest.lease_epoch)
        if storage.write_if(MANIFEST_NAME, data, version):
            return
    raise LeaseLostError(f"{storage.url(MANIFEST_NAME)} kept changing under this run ({_MAX_SAVE_TRIES} tries): "
                         "another runner writes this job")


def _stale(job_id: str, saved_by: int, epoch: int) -> LeaseLostError:
    return LeaseLostError(f"job {job_id}'s manifest was written by the runner of lease {saved_by} while this run "
                          f"(lease {epoch}) stalled; this run stops without writing more, the other run owns the "
                          "job now")


def _update_object_manifest(job_dir: Location, change: Callable[[Manifest], Manifest | None],
                            epoch: int) -> Manifest:
    storage = open_storage(job_dir)
    for _ in range(_MAX_SAVE_TRIES):
        version = storage.version(MANIFEST_NAME)  # before the read: a write in between fails the save
        manifest = load_manifest(job_dir)
        if epoch and manifest.lease_epoch > epoch:
            raise _stale(manifest.job_id, manifest.lease_epoch, epoch)
        changed = change(manifest)
        manifest = manifest if changed is None else changed
        manifest.lease_epoch = max(manifest.lease_epoch, epoch)
        crash_point("manifest_write")
        if storage.write_if(MANIFEST_NAME, manifest.model_dump_json(indent=2).encode(), version):
            return manifest
        log.info("%s changed while it was updated; loading it again", storage.url(MANIFEST_NAME))
    raise LeaseLostError(f"{storage.url(MANIFEST_NAME)} kept changing under this run ({_MAX_SAVE_TRIES} tries): "
                         "another runner writes this job")


def append_part(job_dir: Location, name: str) -> None:
    """List one committed part: an fsynced line on the journal, not a rewrite of the manifest
    (nothing on an object store, where only the lease holder writes the manifest)."""
    if "\n" in name:
        raise ValueError(f"bad part name {name!r}")
    if is_url(job_dir):
        return
    with manifest_lock(job_dir):
        fd = open_no_follow(Path(job_dir) / JOURNAL_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash: drop it
                os.ftruncate(fd, os.pread(fd, size, 0).rfind(b"\n") + 1)
            os.write(fd, f"{name}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if size == 0:
            fsync_dir(Path(job_dir))  # a new journal's folder entry


@contextmanager
def manifest_lock(job_dir: Location) -> Iterator[None]:
    """Exclusive lock between processes; released when the file is closed, even by `kill -9`. On an
    object store the job's lease stands in for it: only its holder writes the manifest."""
    if is_url(job_dir):
        yield
        return
    fd = open_no_follow(Path(job_dir) / LOCK_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb", buffering=0) as file:
        _hash_stream(digest, file)


def _hash_stream(digest: Any, file: Any) -> None:
    while chunk := file.read(_CHUNK_BYTES):
        digest.update(chunk)
