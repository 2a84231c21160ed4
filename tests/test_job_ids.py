"""Job ids name directories that DuckDB globs: glob and list characters, NUL and the like are refused
(exit 2), and `specbatch report` refuses directories whose paths DuckDB would read as a glob."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from job_helpers import submit, write_config, write_jsonl
from report_jobs import write_plain_job

from specbatch import report
from specbatch.job.inputs import JobError, check_job_id

BAD_IDS = ["a*", "job?", "j[1]", "{a,b}", "a,b", "a\x00b", "a b", "-flag", ".hidden", "..", "a/b", "a\\b", "é",
           "x" * 129, ""]


@pytest.mark.parametrize("job_id", ["job-20240101-120000", "demo", "run_2.v3", "A" * 128])
def test_plain_ids_pass(job_id):
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_special_ids_are_refused(job_id):
    with pytest.raises(JobError, match="letters, digits"):
        check_job_id(job_id)


def test_submit_refuses_a_glob_id_with_exit_2_before_any_work(tmp_path, tiny_pair):
    dataset = write_jsonl(tmp_path / "data.jsonl", [{"id": "q0", "prompt": "def add(a, b):", "max_new_tokens": 2}])
    run = submit(dataset, write_config(tmp_path, tiny_pair), "j*", tmp_path / "out", timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "letters, digits" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_report_refuses_a_directory_duckdb_would_glob(tmp_path):
    for name in ("a1", "a2", "a?"):
        write_plain_job(tmp_path / name)
    mixed = duckdb.connect()
    mixed.execute(f"SELECT count(*) FROM glob('{tmp_path}/a?/results/*.parquet')")
    assert mixed.fetchone()[0] > 1  # what the report would read: the parts of every job a?
    with pytest.raises(report.ReportError, match="glob"):
        report.connect([tmp_path / "a?"])
    run = subprocess.run([sys.executable, "-m", "specbatch.cli", "report", str(tmp_path / "a?")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "glob" in run.stderr and "Traceback" not in run.stderr
    report.connect([tmp_path / "a1"]).close()  # a plain name still reports


def test_report_refuses_a_comma_or_control_character(tmp_path):
    for path in (tmp_path / "a,b", tmp_path / "tab\there"):
        write_plain_job(path)
        with pytest.raises(report.ReportError):
            report.connect([Path(path)])
