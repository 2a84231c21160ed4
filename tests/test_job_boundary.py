"""A job directory is a boundary (issue 36): links planted in it never make a run write or delete
outside it; a damaged part never wedges a job."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_ledger import _request, _result, _round, _step

from specbatch import ledger
from specbatch.job.inputs import JobError
from specbatch.job.lock import check_not_running, job_lock
from specbatch.job.manifest import append_part, manifest_lock
from specbatch.quarantine import damaged_parts, quarantine_damaged_parts
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


@pytest.mark.parametrize("planted", [".job.lock", "manifest.parts.log"])
def test_a_hard_link_planted_in_a_job_directory_is_never_written_through(tmp_path, planted):
    """The files a run writes in place (its lock's holder line, the parts journal) refuse a second name:
    a hard link to any file of the user's would be truncated and overwritten."""
    victim, job_dir = _victim(tmp_path), tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    os.link(victim, job_dir / planted)
    with pytest.raises((JobError, LinkInJobError), match=f"{planted} is a hard link"):
        if planted == ".job.lock":
            with job_lock(job_dir):
                pass
        else:
            append_part(job_dir, "part-w00-r-00000")
    assert victim.read_text() == "keep me"


def test_a_job_directory_that_is_a_link_is_refused(tmp_path):
    """A linked job directory would put the whole job in the link's target: refused, nothing written there."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "jobs").mkdir()
    job_dir = tmp_path / "jobs" / "j"
    os.symlink(target, job_dir)
    with pytest.raises(JobError, match=f"job directory {job_dir} is a symbolic link"), job_lock(job_dir):
        pass
    with pytest.raises(JobError, match="is a symbolic link"):
        check_not_running(job_dir)  # what `submit` checks before Prefect starts
    assert list(target.iterdir()) == []


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


def _commit_parts(job_dir: Path, request_ids: list[str]) -> list[str]:
    writer = ledger.PartWriter(job_dir, worker_id=0, run_id="r1", durable=False)
    names = []
    for request_id in request_ids:
        writer.add_round(_round())
        writer.add_step(_step(request_id))
        writer.add_request(_request(request_id))
        writer.add_result(_result(request_id))
        names.append(writer.flush())
    return names


def test_damaged_parts_are_skipped_by_readers_then_quarantined(tmp_path, caplog):
    from specbatch.report import connect

    job_dir = tmp_path / "j"
    first, emptied, truncated = _commit_parts(job_dir, ["a", "b", "c"])
    ledger.part_path(job_dir, "results", emptied).write_bytes(b"")  # a zero-byte results file
    rounds = ledger.part_path(job_dir, "rounds", truncated)
    rounds.write_bytes(rounds.read_bytes()[:-20])  # a truncated rounds file
    assert ledger.committed_request_ids(job_dir) == {"a", "c"}  # b's part counts as absent: b runs again
    assert ledger.read_table(job_dir, "rounds").num_rows == 2 and "skipping damaged part file" in caplog.text
    assert damaged_parts(job_dir) == {emptied: f"results/{emptied}.parquet", truncated: f"rounds/{truncated}.parquet"}
    con = connect([job_dir])  # the report leaves both parts out instead of failing in DuckDB
    assert con.execute("SELECT list(request_id ORDER BY request_id) FROM results").fetchone()[0] == ["a"]

    assert sorted(quarantine_damaged_parts(job_dir)) == sorted([emptied, truncated])
    assert ledger.committed_parts(job_dir) == [first] and ledger.committed_request_ids(job_dir) == {"a"}
    quarantine = job_dir / "quarantine"
    moved = sorted(p.relative_to(quarantine).as_posix() for p in quarantine.rglob("*.parquet"))
    assert moved == sorted(f"{table}/{name}.parquet" for table in ledger.TABLES for name in (emptied, truncated))
    assert damaged_parts(job_dir) == {} and quarantine_damaged_parts(job_dir) == []


@pytest.mark.parametrize("table", ["rounds", "steps", "requests"])
def test_the_report_leaves_out_a_committed_part_whose_file_was_deleted(tmp_path, caplog, table):
    """A committed part whose rounds (or steps, requests) file was deleted by hand failed the whole
    report in DuckDB ("No files found"), a traceback."""
    from specbatch.report import connect

    job_dir = tmp_path / "j"
    kept, deleted = _commit_parts(job_dir, ["a", "b"])
    ledger.part_path(job_dir, table, deleted).unlink()
    con = connect([job_dir])
    assert con.execute("SELECT list(request_id ORDER BY request_id) FROM results").fetchone()[0] == ["a"]
    assert f"leaving out part {deleted} ({table}/{deleted}.parquet is missing)" in caplog.text
    assert ledger.committed_parts(job_dir) == [kept, deleted]  # nothing moved or deleted by the report


def _overwrite_inside(path: Path, where: str) -> None:
    """16 bytes overwritten inside a part file, its size and trailing magic intact: in the footer's
    metadata, or in the first data page's header."""
    data = bytearray(path.read_bytes())
    footer_bytes = int.from_bytes(data[-8:-4], "little")
    at = len(data) - 8 - footer_bytes + 2 if where == "footer" else 4
    data[at: at + 16] = b"\xff" * 16
    path.write_bytes(data)


@pytest.mark.parametrize("where", ["footer", "page"])
def test_a_part_overwritten_inside_is_skipped_then_quarantined(tmp_path, where):
    from specbatch.report import connect

    job_dir = tmp_path / "j"
    first, hit = _commit_parts(job_dir, ["a", "b"])
    _overwrite_inside(ledger.part_path(job_dir, "results", hit), where)
    assert ledger.committed_request_ids(job_dir) == {"a"}  # a reader skips it, as any damaged file
    assert ledger.read_table(job_dir, "results").column("request_id").to_pylist() == ["a"]
    found = damaged_parts(job_dir, deep=True)
    assert found == {hit: f"results/{hit}.parquet"}
    assert damaged_parts(job_dir) == (found if where == "footer" else {})  # the footer alone: no page read
    con = connect([job_dir])  # the report leaves it out instead of failing in DuckDB
    assert con.execute("SELECT list(request_id) FROM results").fetchone()[0] == ["a"]
    assert quarantine_damaged_parts(job_dir) == [hit]
    assert ledger.committed_parts(job_dir) == [first] and (job_dir / "quarantine" / "results").is_dir()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbatch.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("damage", ["emptied", "overwritten"])
def test_a_damaged_part_wedges_nothing_status_report_and_resume(tmp_path, tiny_pair, damage):
    from specbatch.config import load_config
    from specbatch.job.flow import run_workers
    from specbatch.job.prepare import prepare

    target, draft, _ = tiny_pair
    ids = [f"r{i}" for i in range(6)]
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "prompt": "def add(a, b):", "max_new_tokens": 3}) + "\n"
                               for i in ids))
    job_dir = tmp_path / "job"
    prepare(dataset, job_dir, load_config(None, [f"models.target={target}", f"models.draft={draft}",
                                                 "drafter.kind=draft", "io.part_every_requests=2",
                                                 "scheduler.max_batch_rows=2"]))
    run_workers.fn(str(job_dir))
    names = ledger.committed_parts(job_dir)
    assert len(names) >= 2
    if damage == "emptied":
        ledger.part_path(job_dir, "results", names[0]).write_bytes(b"")
        ledger.part_path(job_dir, "rounds", names[1]).write_bytes(b"")
    else:  # size and trailing magic intact: a results data page, a rounds footer
        _overwrite_inside(ledger.part_path(job_dir, "results", names[0]), "page")
        _overwrite_inside(ledger.part_path(job_dir, "rounds", names[1]), "footer")
    for command in (("status", str(job_dir)), ("report", str(job_dir))):
        done = _cli(*command, cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    run_workers.fn(str(job_dir))  # the resume moves both parts aside and runs their requests again
    assert sorted(ledger.read_table(job_dir, "results").column("request_id").to_pylist()) == ids
    assert {p.stem for p in (job_dir / "quarantine" / "results").iterdir()} == set(names[:2])


def test_status_of_a_job_whose_results_part_is_damaged_says_so_in_one_line(tmp_path, tiny_pair):
    """`status` showed `completed 0` with no word of why but what logging's last resort printed: a bare
    line (two here: pyarrow's thrift error ends in a line break). Now one `warning:` line naming the file."""
    from specbatch.config import load_config
    from specbatch.job.flow import run_workers
    from specbatch.job.prepare import prepare

    target, draft, _ = tiny_pair
    dataset = tmp_path / "data.jsonl"
    dataset.write_text(json.dumps({"id": "r0", "prompt": "def add(a, b):", "max_new_tokens": 3}) + "\n")
    job_dir = tmp_path / "job"
    prepare(dataset, job_dir, load_config(None, [f"models.target={target}", f"models.draft={draft}"]))
    run_workers.fn(str(job_dir))
    [name] = ledger.committed_parts(job_dir)
    _overwrite_inside(ledger.part_path(job_dir, "results", name), "footer")
    done = _cli("status", str(job_dir), cwd=tmp_path)
    assert done.returncode == 0 and re.search(r"completed\s+│ 0 ", done.stdout), done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("warning: skipping damaged part file") and f"results/{name}.parquet" in line, line


def test_report_replaces_links_planted_at_its_outputs(tmp_path):
    from rich.console import Console

    from specbatch.report import build_report

    victim, job_dir = _victim(tmp_path), tmp_path / "j"
    _commit_parts(job_dir, ["a"])
    for name in ("report.md", "report.html", "latency_cdf.png"):
        os.symlink(victim, job_dir / name)
    build_report([job_dir], console=Console(file=io.StringIO()))
    assert victim.read_text() == "keep me"
    assert not any((job_dir / name).is_symlink() for name in ("report.md", "report.html", "latency_cdf.png"))
