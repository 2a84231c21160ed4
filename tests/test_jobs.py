"""Jobs that lose nothing: bad input becomes dropped rows, kill -9 and SIGTERM resume exactly once,
a changed dataset is refused, and every table is plain Parquet that DuckDB reads directly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from job_helpers import assert_completed_as, kill_then_resume, reference_run, results, submit, write_config, write_jsonl
from test_ingest import JSONL_CORPUS, damage_row_group

GOOD_PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding",
                "class Foo:", "import os", "The lazy dog", "print(i * i)"]


def dataset_records(n: int = 24) -> list[dict]:
    return [{"id": f"q{i:03d}", "prompt": GOOD_PROMPTS[i % len(GOOD_PROMPTS)] * (1 + i % 3),
             "max_new_tokens": 4 + (i * 7) % 20, "domain": ("code", "prose")[i % 2]} for i in range(n)]


def test_bad_records_become_dropped_rows_and_the_job_completes(tmp_path, tiny_pair):
    corpus = [(line, reason) for line, reason in JSONL_CORPUS if reason != "record_too_large"]
    corpus.append((json.dumps({"id": "too-long", "prompt": "x y " * 400}).encode(), "prompt_too_long"))
    dataset = tmp_path / "bad.jsonl"
    dataset.write_bytes(b"\n".join(line for line, _ in corpus) + b"\n")
    config = write_config(tmp_path, tiny_pair)
    run = submit(dataset, config, "bad", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    rows = results(tmp_path / "out" / "bad")
    expected = [reason for line, reason in corpus if line.strip()]
    assert len(rows) == len(expected) and len({r["request_id"] for r in rows}) == len(rows)
    dropped = sorted(r["drop_reason"] for r in rows if r["status"] == "dropped")
    assert dropped == sorted(reason for reason in expected if reason is not None)
    assert sum(r["status"] == "completed" for r in rows) == expected.count(None)
    assert all(r["drop_message"] for r in rows if r["status"] == "dropped")
    assert len(dropped) >= 25 and len(set(dropped)) >= 18  # many kinds of bad record, 19+ reason codes
    exported = (tmp_path / "out" / "bad" / "results.jsonl").read_text().splitlines()
    assert len(exported) == len(rows)


@pytest.fixture(scope="module")
def reference_job(tmp_path_factory, tiny_pair):
    """An uninterrupted run: what every interrupted-and-resumed run must reproduce."""
    dataset, config, job_dir = reference_run(tmp_path_factory.mktemp("reference"), tiny_pair, dataset_records())
    return dataset, config, {r["request_id"]: r for r in results(job_dir)}


@pytest.mark.parametrize("crash_at", [
    pytest.param("ingest_shard:2", marks=pytest.mark.slow),
    pytest.param("round:12", marks=pytest.mark.slow),
    "part_committed:2",
    pytest.param("manifest_write:4", marks=pytest.mark.slow),
])
def test_kill_9_then_resume_gives_each_record_once(tmp_path, reference_job, crash_at):
    dataset, config, reference = reference_job
    assert_completed_as(kill_then_resume(dataset, config, "job", tmp_path, crash_at), reference)


@pytest.mark.slow  # 32 s; the default suite's kill -9 resume checks the mechanism, test_ingest the dropped rows
def test_a_damaged_parquet_row_group_is_dropped_once_across_kill_9_and_resume(tmp_path, tiny_pair):
    """The damaged group's rows are dropped (ids by position), the others complete; a kill -9 between
    parts and a resume give each row once."""
    records = dataset_records(24)
    dataset = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(records), dataset, row_group_size=8, write_page_checksum=True)
    damage_row_group(dataset, 1)
    rows = kill_then_resume(dataset, write_config(tmp_path, tiny_pair), "job", tmp_path, "part_committed:2")
    damaged = [f"rec-{position:09d}" for position in range(8, 16)]
    assert [r["request_id"] for r in rows] == sorted([r["id"] for r in records[:8] + records[16:]] + damaged)
    by_id = {r["request_id"]: r for r in rows}
    assert all(by_id[r["id"]]["status"] == "completed" for r in records[:8] + records[16:])
    assert {(by_id[i]["status"], by_id[i]["drop_reason"]) for i in damaged} == {("dropped", "unreadable_row_group")}
    assert "row 3 of row group 1 in " in by_id["rec-000000011"]["drop_message"]


@pytest.mark.slow
def test_sigterm_cancels_in_flight_then_resume_completes(tmp_path, tiny_pair):
    records = [{**r, "max_new_tokens": 120} for r in dataset_records(40)]
    dataset = write_jsonl(tmp_path / "data.jsonl", records)
    config = write_config(tmp_path, tiny_pair, drafter={"kind": "none"})
    command = [sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--config", str(config),
               "--job-id", "j", "--output", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "j" / "results").glob("*.parquet")):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    first = results(tmp_path / "j")
    assert any(r["status"] == "cancelled" for r in first)
    resumed = submit(dataset, config, "j", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    rows = results(tmp_path / "j")
    assert sorted(r["request_id"] for r in rows) == sorted(r["id"] for r in records)
    assert all(r["status"] == "completed" for r in rows)


@pytest.mark.slow  # two whole jobs and a refusal through the CLI (~70 s on 2 cores)
def test_changed_dataset_is_refused_unless_forced(tmp_path, tiny_pair):
    dataset = write_jsonl(tmp_path / "data.jsonl", dataset_records(4))
    config = write_config(tmp_path, tiny_pair)
    assert submit(dataset, config, "j", tmp_path).returncode == 0
    write_jsonl(dataset, dataset_records(5))
    refused = submit(dataset, config, "j", tmp_path)
    assert refused.returncode == 2 and "changed" in refused.stderr and "Traceback" not in refused.stderr
    assert submit(dataset, config, "j", tmp_path, "--force").returncode == 0


@pytest.mark.parametrize("problem", ["missing_dataset", "bad_config", "bad_model", "bad_override"])
def test_unusable_input_exits_2_before_any_work(tmp_path, tiny_pair, problem):
    dataset = write_jsonl(tmp_path / "data.jsonl", dataset_records(2))
    config = write_config(tmp_path, tiny_pair)
    extra: list[str] = []
    if problem == "missing_dataset":
        dataset = tmp_path / "nope.jsonl"
    elif problem == "bad_config":
        config.write_text("scheduler:\n  max_batch_rows: -3\n")
    elif problem == "bad_model":
        extra = ["--set", f"models.target={tmp_path}/no-such-model"]
    else:
        extra = ["--set", "scheduler.lookahead=sometimes"]
    run = submit(dataset, config, "j", tmp_path, *extra)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "error" in run.stderr and "Traceback" not in run.stderr
    assert not list((tmp_path / "j" / "results").glob("*.parquet")) if (tmp_path / "j").exists() else True


REFUSE_AND_LIST_HEAVY_IMPORTS = """
import sys
from specbatch.cli import app
try:
    app(["submit", *sys.argv[1:]])
except SystemExit as exit:
    print(exit.code, sorted({"torch", "transformers", "prefect"} & set(sys.modules)))
"""


@pytest.mark.parametrize("problem", ["missing_dataset", "bad_model"])
def test_unusable_input_is_refused_before_torch_transformers_or_prefect_import(tmp_path, problem):
    """The input checks come first, so a wrong path costs a second, not the ~10 s those imports take
    (and no Prefect server boots for a job that cannot run)."""
    dataset = write_jsonl(tmp_path / "data.jsonl", dataset_records(2))
    args = [str(dataset), "--job-id", "j", "--output", str(tmp_path)]
    if problem == "missing_dataset":
        args[0] = str(tmp_path / "nope.jsonl")
    else:
        args += ["--set", f"models.target={tmp_path}/no-such-model"]
    run = subprocess.run([sys.executable, "-c", REFUSE_AND_LIST_HEAVY_IMPORTS, *args], capture_output=True, text=True)
    assert run.stdout.strip().splitlines()[-1] == "2 []", run.stdout + run.stderr
    assert "error" in run.stderr and "Traceback" not in run.stderr


def test_every_table_is_parquet_duckdb_reads_and_openai_output(tmp_path, tiny_pair):
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": GOOD_PROMPTS[i], "max_tokens": 6}} for i in range(3)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})
    dataset = write_jsonl(tmp_path / "batch.jsonl", lines)
    config = write_config(tmp_path, tiny_pair)
    assert submit(dataset, config, "oa", tmp_path).returncode == 0
    job = tmp_path / "oa"
    con = duckdb.connect()
    for table in ("results", "requests", "rounds", "steps"):
        count = con.execute(f"SELECT count(*) FROM read_parquet('{job}/{table}/*.parquet')").fetchone()[0]
        assert count > 0, table
    output = [json.loads(line) for line in (job / "openai_output.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in output) == ["bad", "c0", "c1", "c2"]
    bad = next(line for line in output if line["custom_id"] == "bad")
    assert bad["response"] is None and bad["error"]["code"] == "unsupported_endpoint"
    good = next(line for line in output if line["custom_id"] == "c0")
    assert good["response"]["body"]["choices"][0]["text"] is not None
    status = subprocess.run([sys.executable, "-m", "specbatch.cli", "status", "oa", "--output", str(tmp_path)],
                            capture_output=True, text=True, env={"COLUMNS": "200", **__import__("os").environ})
    assert status.returncode == 0 and "completed" in status.stdout
