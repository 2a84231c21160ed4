"""Scale limits: part names past five sequence digits, and part appends that do not rewrite the manifest."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specbatch import ledger
from specbatch.config import JobConfig
from specbatch.data.shards import ShardInfo
from specbatch.job import manifest as manifest_module
from specbatch.job.manifest import (
    JOURNAL_NAME,
    Manifest,
    load_manifest,
    manifest_path,
    new_manifest,
    save_manifest,
    update_manifest,
)
from specbatch.job.worker import _record_part
from specbatch.records import ResultRecord


def _commit(job_dir: Path, name: str, request_id: str) -> None:
    """A committed part as far as readers care: its results file."""
    (job_dir / "results").mkdir(parents=True, exist_ok=True)
    table = ledger.to_table([ResultRecord(request_id, "completed", "hi", [7])], ledger.RESULTS_SCHEMA)
    pq.write_table(table, ledger.part_path(job_dir, "results", name))


def _manifest(tmp_path: Path, parts: list[str] | None = None) -> Manifest:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a"}\n')
    manifest = new_manifest("job-1", dataset, "jsonl", JobConfig())
    manifest.set_shards([ShardInfo("shard-00000.parquet", 3, 0)])
    manifest.parts = list(parts or [])
    return manifest


def test_six_digit_seq_round_trips_and_sorts_after_five_digits(tmp_path: Path) -> None:
    assert ledger.part_name(3, "r-1", 123456) == "part-w03-r-1-123456"
    assert ledger.parse_part_name("part-w03-r-1-123456") == (3, "r-1", 123456)
    assert ledger.parse_part_name("part-w03-r-1-00042") == (3, "r-1", 42)  # old names read the same
    for seq, request_id in ((123456, "c"), (99999, "a"), (100000, "b")):
        _commit(tmp_path, ledger.part_name(3, "r-1", seq), request_id)
    assert ledger.committed_parts(tmp_path) == ["part-w03-r-1-99999", "part-w03-r-1-100000", "part-w03-r-1-123456"]
    assert ledger.committed_request_ids(tmp_path) == {"a", "b", "c"}
    assert ledger.read_table(tmp_path, "results").column("request_id").to_pylist() == ["a", "b", "c"]


def test_next_seq_continues_past_99999(tmp_path: Path) -> None:
    _commit(tmp_path, "part-w03-r1-99999", "a")
    names = []
    for request_id in ("b", "c"):  # a writer re-created after each part, as on a worker restart
        writer = ledger.PartWriter(tmp_path, worker_id=3, run_id="r1", durable=False)
        writer.add_result(ResultRecord(request_id, "completed", "hi", [7]))
        names.append(writer.flush())
    assert names == ["part-w03-r1-100000", "part-w03-r1-100001"]
    orphan = ledger.part_path(tmp_path, "rounds", "part-w03-r1-100002")
    orphan.write_bytes(b"half")
    assert ledger.remove_orphan_parts(tmp_path, worker_id=3) == ["rounds/part-w03-r1-100002.parquet"]
    assert ledger.committed_request_ids(tmp_path) == {"a", "b", "c"}


@pytest.mark.parametrize("num_parts", [50, 400])
def test_appending_parts_writes_bytes_linear_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_parts: int
) -> None:
    save_manifest(tmp_path, _manifest(tmp_path))
    rewritten: list[int] = []  # bytes of manifest.json per rewrite

    def counting_save(job_dir: Path, manifest: Manifest) -> None:
        save_manifest(job_dir, manifest)
        rewritten.append(manifest_path(job_dir).stat().st_size)

    monkeypatch.setattr(manifest_module, "save_manifest", counting_save)
    names = [ledger.part_name(i % 2, "r1", i) for i in range(num_parts)]
    for name in names:
        _record_part(tmp_path, name)
    journal = tmp_path / JOURNAL_NAME
    written = sum(rewritten) + (journal.stat().st_size if journal.exists() else 0)
    assert written == sum(len(name) + 1 for name in names)  # one line per part: O(N) bytes
    assert len(rewritten) == 0  # no manifest rewrite per part
    assert load_manifest(tmp_path).parts == names


def test_old_manifest_with_parts_loads_and_takes_appends_without_a_rewrite(tmp_path: Path) -> None:
    old = ["part-w00-r1-00000", "part-w00-r1-00001"]
    manifest_path(tmp_path).write_text(_manifest(tmp_path, old).model_dump_json(indent=2))  # as it was written
    before = manifest_path(tmp_path).read_bytes()
    assert load_manifest(tmp_path).parts == old
    _record_part(tmp_path, "part-w00-r2-00000")
    assert manifest_path(tmp_path).read_bytes() == before
    assert load_manifest(tmp_path).parts == [*old, "part-w00-r2-00000"]
    update_manifest(tmp_path, lambda m: setattr(m, "status", "done"))  # folds the journal in
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert Manifest.model_validate_json(manifest_path(tmp_path).read_text()).parts == [*old, "part-w00-r2-00000"]


def test_journal_survives_crashes_between_writes(tmp_path: Path) -> None:
    save_manifest(tmp_path, _manifest(tmp_path, ["part-w00-r1-00000"]))
    journal = tmp_path / JOURNAL_NAME
    # killed after a save and before the journal went (its part is in both), then mid-line (power loss)
    journal.write_text("part-w00-r1-00000\npart-w00-r1-00001\npart-w00-r1-0")
    assert load_manifest(tmp_path).parts == ["part-w00-r1-00000", "part-w00-r1-00001"]
    _record_part(tmp_path, "part-w00-r1-00002")
    assert journal.read_text() == "part-w00-r1-00000\npart-w00-r1-00001\npart-w00-r1-00002\n"
    assert load_manifest(tmp_path).parts == ["part-w00-r1-00000", "part-w00-r1-00001", "part-w00-r1-00002"]
