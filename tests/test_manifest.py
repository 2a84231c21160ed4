"""Manifest: fingerprints, atomic save/load, and locked updates from several processes."""

from __future__ import annotations

import hashlib
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from specbatch.config import JobConfig
from specbatch.data.shards import ShardInfo
from specbatch.job.manifest import (
    Manifest,
    ManifestError,
    fingerprint,
    load_manifest,
    manifest_path,
    new_manifest,
    save_manifest,
    update_manifest,
)

NUM_UPDATES = 40


def make_manifest(tmp_path: Path) -> Manifest:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a"}\n')
    manifest = new_manifest("job-1", dataset, "jsonl", JobConfig(), column_map={"prompt": "text"})
    manifest.set_shards([ShardInfo("shard-00000.parquet", 3, 1), ShardInfo("shard-00001.parquet", 2, 0)])
    return manifest


def test_fingerprint_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    content = b"x" * 3_000_000  # spans several read chunks
    path.write_bytes(content)
    assert fingerprint(path) == "sha256:" + hashlib.sha256(content).hexdigest()
    path.write_bytes(content[:-1] + b"y")
    assert fingerprint(path) != "sha256:" + hashlib.sha256(content).hexdigest()


def test_fingerprint_of_a_directory(tmp_path: Path) -> None:
    directory = tmp_path / "saved"
    (directory / "sub").mkdir(parents=True)
    (directory / "a.arrow").write_bytes(b"aaa")
    (directory / "sub" / "b.json").write_bytes(b"{}")
    first = fingerprint(directory)
    assert fingerprint(directory) == first
    (directory / "a.arrow").rename(directory / "c.arrow")
    assert fingerprint(directory) != first
    (directory / "c.arrow").rename(directory / "a.arrow")
    assert fingerprint(directory) == first
    (directory / "sub" / "b.json").write_bytes(b"{ }")
    assert fingerprint(directory) != first


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    manifest = make_manifest(tmp_path)
    save_manifest(job_dir, manifest)
    loaded = load_manifest(job_dir)
    assert loaded == manifest
    assert loaded.dataset.num_records == 5 and loaded.dataset.num_dropped_at_ingest == 1
    assert loaded.dataset.fingerprint == fingerprint(tmp_path / "d.jsonl")
    assert loaded.dataset.column_map == {"prompt": "text"}
    assert [shard.status for shard in loaded.shards] == ["pending", "pending"]
    assert loaded.config == JobConfig().model_dump(mode="json")
    assert {"python", "specbatch"} <= loaded.versions.keys()
    assert sorted(path.name for path in job_dir.iterdir()) == ["manifest.json"], "no temporary files left"


def test_missing_and_corrupt_manifests(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_manifest(tmp_path)
    manifest_path(tmp_path).write_text('{"job_id": "half')
    with pytest.raises(ManifestError, match="not a valid specbatch manifest"):
        load_manifest(tmp_path)


def test_update_mutates_or_replaces(tmp_path: Path) -> None:
    save_manifest(tmp_path, make_manifest(tmp_path))

    def claim(manifest: Manifest) -> None:
        manifest.shards[0].status, manifest.shards[0].worker_id = "running", 3

    update_manifest(tmp_path, claim)
    replaced = update_manifest(tmp_path, lambda m: m.model_copy(update={"status": "running"}))
    loaded = load_manifest(tmp_path)
    assert loaded == replaced and loaded.status == "running"
    assert (loaded.shards[0].status, loaded.shards[0].worker_id) == ("running", 3)


def _count_updates(job_dir: Path, worker: int) -> None:
    def change(manifest: Manifest) -> None:
        manifest.counters["updates"] = manifest.counters.get("updates", 0) + 1
        manifest.parts.append(f"results/w{worker}-{len(manifest.parts):04d}.parquet")

    for _ in range(NUM_UPDATES):
        update_manifest(job_dir, change)


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    save_manifest(tmp_path, make_manifest(tmp_path))
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_updates, args=(tmp_path, worker)) for worker in range(2)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=60)
        assert process.exitcode == 0
    manifest = load_manifest(tmp_path)
    assert manifest.counters["updates"] == 2 * NUM_UPDATES
    assert len(manifest.parts) == len(set(manifest.parts)) == 2 * NUM_UPDATES


def test_manifest_does_not_import_torch() -> None:
    code = "import sys, specbatch.job.manifest; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
