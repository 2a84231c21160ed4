"""Every report query equals the same figure computed by hand in Python from the job's rows.

The jobs are written by `report_jobs`; the expected figures come from `report_oracle`, which reads
only the Parquet rows on disk. To check another job, add a module-scoped fixture that returns its
job directories and put the fixture's name in `JOB_SETS`.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
from report_jobs import write_dropped_only_job, write_plain_job, write_real_jobs, write_speculative_job
from report_oracle import EXPECTED, expected_drops, expected_throughput, rows
from rich.console import Console

from specbatch import ledger, report


@pytest.fixture(scope="module")
def fake_jobs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Jobs served by the real engine over the simulated backend (see report_jobs)."""
    root = tmp_path_factory.mktemp("outputs")
    jobs = [root / "none-job", root / "spec-job"]
    write_plain_job(jobs[0])
    write_speculative_job(jobs[1])
    return jobs


@pytest.fixture(scope="module")
def real_jobs(tmp_path_factory: pytest.TempPathFactory, tiny_pair) -> list[Path]:
    return write_real_jobs(tmp_path_factory.mktemp("real"), tiny_pair)


def assert_rows_equal(actual: list[dict], expected: list[dict]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert set(got) == set(want)
        for column, value in want.items():
            if isinstance(value, float | np.floating):
                assert got[column] == pytest.approx(float(value), rel=1e-9, abs=1e-12), column
            else:
                assert got[column] == value, column


JOB_SETS = ["fake_jobs", "real_jobs"]  # fixtures that return job directories to report on together


@pytest.fixture(scope="module", params=JOB_SETS)
def jobs(request: pytest.FixtureRequest) -> list[Path]:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def con(jobs: list[Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = report.connect(jobs)
    yield connection
    connection.close()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_query_equals_the_figure_computed_by_hand(con, jobs: list[Path], name: str) -> None:
    by_job_id = sorted(jobs, key=lambda job: job.name)  # the queries order rows by job_id
    assert_rows_equal(report.run_query(con, name).records(), EXPECTED[name](by_job_id))


def test_every_record_is_in_results_once(con) -> None:
    duplicates = "SELECT count(*) - count(DISTINCT (job_id, request_id)) FROM results"
    assert con.execute(duplicates).fetchall() == [(0,)]


def test_views_count_only_committed_parts(fake_jobs: list[Path]) -> None:
    con, spec = report.connect(fake_jobs), fake_jobs[1]
    assert (spec / "rounds" / "part-w00-run1-00099.parquet").exists()  # the half-written part
    for table in ledger.TABLES:
        got = con.execute(f"SELECT count(*) FROM {table} WHERE job_id = 'spec-job'").fetchall()[0][0]
        assert got == len(rows(spec, table)) == ledger.read_table(spec, table).num_rows
    runs = con.execute("SELECT DISTINCT run_id FROM rounds WHERE job_id = 'spec-job' ORDER BY 1").fetchall()
    assert runs == [("run-2",), ("run1",)]


def test_baseline_job_variable(fake_jobs: list[Path]) -> None:
    result = report.run_query(report.connect(fake_jobs, baseline="spec-job"), "throughput_vs_cost")
    assert_rows_equal(result.records(), expected_throughput(fake_jobs, baseline="spec-job"))
    assert result.column("speedup")[1] == pytest.approx(1.0)
    with pytest.raises(report.ReportError, match="baseline"):
        report.connect(fake_jobs, baseline="nope")


def test_a_job_without_committed_parts_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(report.ReportError, match="no committed parts"):
        report.connect([tmp_path / "empty-job"])
    with pytest.raises(report.ReportError, match="distinct names"):
        report.connect([tmp_path / "a" / "j", tmp_path / "b" / "j"])


def _assert_not_blank(png: Path) -> None:
    from matplotlib.image import imread

    assert png.stat().st_size > 5_000, png
    pixels = imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300, png
    assert float(pixels[..., :3].std()) > 0.05, png


def test_build_report_writes_tables_plots_and_html(jobs: list[Path], tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    report_md = report.build_report(jobs, console=console, out_dir=tmp_path)
    assert report_md == tmp_path / "report.md"
    text = report_md.read_text()
    printed = console.export_text()
    for title in report.QUERIES.values():
        assert f"## {title}" in text and title in printed
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == [
        "acceptance_by_position.png",
        "latency_cdf.png",
        "prefix_cache.png",
        "round_timeline.png",
        "throughput_vs_cost.png",
    ]
    for png in pngs:
        _assert_not_blank(png)
        assert f"]({png.name})" in text
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs) and "<table>" in page


def test_report_of_a_job_with_no_rounds(tmp_path: Path) -> None:
    job = tmp_path / "all-dropped"
    write_dropped_only_job(job)
    report_md = report.build_report([job], console=Console(record=True, width=200))
    text = report_md.read_text()
    assert "No rows" in text
    latency = report.run_query(report.connect([job]), "latency").records()
    assert {(r["num_samples"], r["num_left_out"], r["num_dropped_left_out"]) for r in latency} == {(0, 2, 2)}
    for png in job.glob("*.png"):
        _assert_not_blank(png)


README_DUCKDB = (  # the command the README shows, with JOB for the job directory
    """duckdb -cmd "SET VARIABLE job_dir = 'JOB'" -cmd ".read sql/views.sql" """
    """-csv -c ".read sql/drops.sql" """
)
README_PYTHON = (  # the same without the duckdb CLI binary
    """.venv/bin/python -c "from specbatch.report import connect; con = connect(['JOB']); """
    """con.sql(open('sql/drops.sql').read()).write_csv('/dev/stdout')" """
)
REPO = Path(__file__).resolve().parent.parent


def duckdb_cli() -> str:
    """The `duckdb` binary that duckdb-cli (test extras) puts in this venv's bin, found even when PATH
    lacks that bin; else one on PATH."""
    found = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which("duckdb")
    assert found, "no duckdb CLI binary: the test extras install it (pip install -e '.[test]', or duckdb-cli)"
    return found


def _run_readme_line(command: str) -> str:
    """Run a README command line from the repository root, with this venv's python and duckdb."""
    command = command.replace(".venv/bin/python", sys.executable)
    if command.startswith("duckdb "):
        command = shlex.quote(duckdb_cli()) + command.removeprefix("duckdb")
    done = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", [README_PYTHON, README_DUCKDB], ids=["python", "duckdb-cli"])
def test_the_readme_command_line_works(fake_jobs: list[Path], command: str) -> None:
    lines = _run_readme_line(command.replace("JOB", str(fake_jobs[1]))).strip().splitlines()
    assert lines[0].split(",")[:4] == ["job_id", "status", "reason", "num_requests"]
    assert len(lines) - 1 == len(expected_drops(fake_jobs[1:]))


def test_the_readme_duckdb_line_runs_as_written(fake_jobs: list[Path]) -> None:
    """The duckdb line of the README's "Reports with DuckDB", word for word but the job directory,
    with the CLI version the test extras pin: the same minor as the Python duckdb package."""
    readme = (REPO / "README.md").read_text()
    line = next(text for text in readme.splitlines() if text.startswith("duckdb -cmd"))
    assert line.startswith(README_DUCKDB.split(" -csv")[0].replace("JOB", "outputs/demo"))
    assert "pip install duckdb-cli" in readme
    version = subprocess.run([duckdb_cli(), "-version"], capture_output=True, text=True, check=True).stdout
    assert version.split()[0].removeprefix("v").split(".")[:2] == duckdb.__version__.split(".")[:2], version
    output = _run_readme_line(line.replace("outputs/demo", str(fake_jobs[1])))
    assert "committed_tokens_per_s" in output and fake_jobs[1].name in output


def test_a_source_checkout_reads_the_top_level_sql():
    """One copy of the queries: `sql/` at the repository's top, read in place (a wheel carries a copy)."""
    assert report.sql_dir() == REPO / "sql"
    assert (report.sql_dir() / "views.sql").is_file()


def test_the_prefix_cache_query_sees_the_fake_jobs_copies(fake_jobs: list[Path]) -> None:
    """The fake jobs' prompts share their first tokens, so the query is checked on real copies."""
    con = report.connect(fake_jobs)
    rows = report.run_query(con, "prefix_cache").records()
    assert rows and all(row["num_reused_tokens"] > 0 and 0 < row["hit_rate"] <= 1 for row in rows)


def test_parts_written_before_a_column_existed_read_it_as_null(tmp_path: Path, fake_jobs: list[Path]) -> None:
    import pyarrow.parquet as pq

    old = tmp_path / fake_jobs[0].name
    shutil.copytree(fake_jobs[0], old)
    for table, column in (("rounds", "reuse_ms"), ("rounds", "num_reused_tokens"), ("requests", "num_reused_tokens")):
        for part in (old / table).glob("*.parquet"):
            pq.write_table(pq.read_table(part).drop_columns([column]), part)
    con = report.connect([old])
    assert report.run_query(con, "prefix_cache").records()[0]["num_reused_tokens"] is None
    assert report.run_query(con, "scheduler_overhead").records()[0]["reuse_share"] == 0
