"""Run the real `specbatch` CLI in a subprocess on the tiny pair, and read a job's tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import yaml


def write_config(tmp_path: Path, pair, **sections) -> Path:
    target, draft, _ = pair
    config = {"models": {"target": str(target), "draft": str(draft)}, "drafter": {"kind": "draft"},
              "scheduler": {"max_batch_rows": 6, "lookahead": "fixed:3"},
              "io": {"shard_size": 8, "part_every_requests": 5}}
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def submit(dataset: Path, config: Path, job_id: str, output: Path, *extra: str, env: dict | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--config", str(config),
               "--job-id", job_id, "--output", str(output), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def results(job_dir: Path) -> list[dict]:
    """Every committed result row, read with DuckDB straight from the Parquet parts."""
    con = duckdb.connect()
    rows = con.execute(f"SELECT * FROM read_parquet('{job_dir}/results/*.parquet') ORDER BY request_id").fetchall()
    names = [d[0] for d in con.description]
    return [dict(zip(names, row, strict=True)) for row in rows]


def reference_run(root: Path, pair, records: list[dict]) -> tuple[Path, Path, Path]:
    """An uninterrupted job over `records` (what interrupted-and-resumed runs must reproduce):
    its dataset, config and job directory."""
    dataset = write_jsonl(root / "data.jsonl", records)
    config = write_config(root, pair)
    run = submit(dataset, config, "ref", root / "out")
    assert run.returncode == 0, run.stderr
    return dataset, config, root / "out" / "ref"


def kill_then_resume(dataset: Path, config: Path, job_id: str, output: Path, crash_at: str) -> list[dict]:
    """kill -9 a submit at `crash_at` (SPECBATCH_CRASH_AT), resume it, and return the job's results."""
    killed = submit(dataset, config, job_id, output, env={"SPECBATCH_CRASH_AT": crash_at})
    assert killed.returncode == -signal.SIGKILL
    resumed = submit(dataset, config, job_id, output)
    assert resumed.returncode == 0, resumed.stderr
    return results(output / job_id)


def assert_completed_as(rows: list[dict], reference: dict[str, dict]) -> None:
    """Every reference request once, completed, with the reference's output tokens."""
    assert [r["request_id"] for r in rows] == sorted(reference)
    for row in rows:
        assert row["status"] == "completed"
        assert row["output_token_ids"] == reference[row["request_id"]]["output_token_ids"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
