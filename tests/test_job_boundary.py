"""A job directory is a boundary (issue 36): links planted in it never make a run write or delete
outside it; a damaged part never wedges a job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specbatch import ledger
from specbatch.job.inputs import JobError
from specbatch.job.lock import job_lock
from specbatch.job.manifest import append_part, manifest_lock
from specbatch.storage import LinkInJobError, open_storage


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "precious.txt"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("keep me")
    return victim


@pytest.mark.parametrize("planted", [".job.lock", "results.jsonl.tmp", "rounds"])
def test_a_job_directory_with_a_link_is_refused_before_anything_is_written(tmp_path, planted):
    victim, job_dir = _victim(tmp_path), tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    os.symlink(victim.parent if planted == "rounds" else victim, job_dir / planted)
    with pytest.raises(JobError, match=f"contains symbolic links \\({planted} -> "), job_lock(job_dir):
        pass
    assert victim.read_text() == "keep me" and sorted(p.name for p in victim.parent.iterdir()) == ["precious.txt"]


def test_local_storage_never_writes_or_deletes_through_a_link(tmp_path):
    victim, job_dir = _victim(tmp_path), tmp_path / "j"
    storage = open_storage(job_dir)
    storage.write_bytes("results.jsonl", b"old")
    os.symlink(victim, job_dir / "results.jsonl.tmp")  # a planted temporary name: replaced, never followed
    storage.write_bytes("results.jsonl", b"new")
    assert victim.read_text() == "keep me" and not (job_dir / "results.jsonl").is_symlink()
    assert (job_dir / "results.jsonl").read_bytes() == b"new"

    orphan = victim.parent / "part-w00-r-00000.parquet"
    orphan.write_bytes(b"not ours")
    os.symlink(victim.parent, job_dir / "rounds")  # a linked table folder: refused, nothing deleted there
    with pytest.raises(LinkInJobError, match="rounds is a symbolic link"):
        ledger.remove_orphan_parts(job_dir)
    with pytest.raises(LinkInJobError):
        storage.write_bytes("rounds/part-w00-r-00001.parquet", b"x")
    assert orphan.exists() and sorted(p.name for p in victim.parent.iterdir()) == [orphan.name, "precious.txt"]

    for name in (".manifest.lock", "manifest.parts.log"):
        os.symlink(victim, job_dir / name)
    with pytest.raises(LinkInJobError), manifest_lock(job_dir):
        pass
    (job_dir / ".manifest.lock").unlink()
    with pytest.raises(LinkInJobError):
        append_part(job_dir, "part-w00-r-00000")
    assert victim.read_text() == "keep me"
