"""The small promises of a job directory (issue 36): manifest files, the journal, report.md tables,
OpenAI batch output ids and the status a stopped or failed run leaves."""

from __future__ import annotations

import stat
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.data.shards import ShardInfo
from specbatch.job import flow
from specbatch.job.finalize import finalize
from specbatch.job.manifest import JOURNAL_NAME, load_manifest, new_manifest, save_manifest, update_manifest
from specbatch.job.openai_output import output_line
from specbatch.report import QueryResult, markdown_table


def _job(tmp_path: Path) -> Path:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a"}\n')
    manifest = new_manifest("j", dataset, "jsonl", JobConfig())
    manifest.set_shards([ShardInfo("shard-00000.parquet", 3, 0)])
    save_manifest(tmp_path / "j", manifest)
    return tmp_path / "j"


def test_manifest_is_0644_and_a_killed_saves_temporary_file_goes(tmp_path):
    job_dir = _job(tmp_path)
    assert stat.S_IMODE((job_dir / "manifest.json").stat().st_mode) == 0o644
    (job_dir / ".manifest.k1ll3d.tmp").write_text("{half")  # a save killed before its rename
    update_manifest(job_dir, lambda m: None)
    assert not list(job_dir.glob(".manifest.*.tmp"))


def test_garbage_journal_lines_are_not_parts(tmp_path):
    job_dir = _job(tmp_path)
    (job_dir / JOURNAL_NAME).write_text("part-w00-r1-00000\n\x00\x01junk\nnot a part\n\npart-w01-r1-00002\n")
    assert load_manifest(job_dir).parts == ["part-w00-r1-00000", "part-w01-r1-00002"]


def test_a_newline_in_a_cell_keeps_the_markdown_table_one_row_per_line():
    result = QueryResult("q", "Q", "", ["domain", "n"], [("code\nprose|x", 1), ("a\r\nb", 2)])
    lines = markdown_table(result).splitlines()
    assert lines == ["| domain | n |", "|---|---|", "| code\\nprose\\|x | 1 |", "| a\\nb | 2 |"]


def test_openai_output_never_invents_a_custom_id():
    dropped = {"request_id": "rec-000000004", "status": "dropped", "drop_reason": "duplicate_id",
               "drop_message": "custom_id 'a' was already used by an earlier record"}
    assert output_line(dropped, None, 4)["custom_id"] is None
    own = {**dropped, "request_id": "a", "drop_reason": "unsupported_method", "drop_message": "GET"}
    assert output_line(own, None, 0)["custom_id"] == "a"


def test_a_stop_with_nothing_cancelled_leaves_the_job_cancelled_and_a_failed_finalize_failed(tmp_path):
    job_dir = _job(tmp_path)
    assert finalize(job_dir).num_records == 3 and load_manifest(job_dir).status == "running"
    finalize(job_dir, stopped=True)  # stopped before any request was admitted: no cancelled row
    assert load_manifest(job_dir).status == "cancelled"
    update_manifest(job_dir, lambda m: setattr(m, "status", "done"))
    try:
        raise RuntimeError("finalize failed on a resume")
    except RuntimeError:
        flow._write_error_log(str(job_dir))
    assert load_manifest(job_dir).status == "failed" and "finalize failed" in (job_dir / "error.log").read_text()


def test_a_stop_after_the_last_request_ends_completed_as_the_manifest_says_done():
    """A stop that comes after the worker group finished every request: finalize records `done`, so the
    run ends Completed (exit 0), not Cancelled with a "run it again" message."""
    outcome = {"stopped": True, "is_complete": True, "num_cancelled": 0}
    assert flow._final_state(outcome, "j") is outcome
    assert flow._final_state({**outcome, "is_complete": False}, "j").is_cancelled()
