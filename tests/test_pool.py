"""One job across "machines": `workers.placement=pool` with real processes and nothing shared but the
Prefect API and the object store.

A moto S3 server holds the dataset and the job; a Prefect server on 127.0.0.1; a process work pool;
two Prefect workers (`--limit 1`, one flow run each, as on one GPU machine each) started from two
different empty directories with their own PREFECT_HOME. `specbatch submit` runs the parent flow
against that server; it registers `specbatch-worker/POOL` and starts two worker flow runs. One worker's
flow-run process is killed with SIGKILL after it committed a part; the parent starts that worker id
again. Every record ends up exactly once, both worker ids are in `rounds`, the greedy outputs equal
those of an uninterrupted local run, and `specbatch status` / `report` read the job over s3://.

Run with `pytest -m deployment` (minutes; not part of the default run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from job_helpers import submit, write_config, write_jsonl
from test_deployment import _env, _prefect, _start, _wait_healthy

from specbatch import ledger
from specbatch.job.processes import free_port, stop_groups
from specbatch.lab.services import make_bucket, s3_server

pytestmark = pytest.mark.deployment

PREFECT = str(Path(sys.executable).with_name("prefect"))
PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(3):", "Speculative decoding",
           "import numpy as np", "Once upon a time"]


def _flow_run_processes(worker: int) -> list[int]:
    """Descendants of a Prefect worker that run a flow (they carry PREFECT__FLOW_RUN_ID; Prefect starts
    them in a session of their own, so they are found by parent pid, not by process group)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    family, grew = {worker}, True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in family} - family
        family |= children
        grew = bool(children)
    pids = []
    for pid in sorted(family - {worker}):
        try:
            if b"PREFECT__FLOW_RUN_ID=" in Path(f"/proc/{pid}/environ").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


def _outputs(rows: list[dict]) -> dict[str, list[int]]:
    return {row["request_id"]: row["output_token_ids"] for row in rows}


def test_pool_job_over_two_workers_survives_a_killed_worker(tmp_path, tiny_pair):
    records = [{"id": f"p{i:03d}", "prompt": PROMPTS[i % len(PROMPTS)] + " " * (i % 3), "max_new_tokens": 12}
               for i in range(40)]
    dataset = write_jsonl(tmp_path / "prompts.jsonl", records)
    config = write_config(tmp_path, tiny_pair, io={"shard_size": 4, "part_every_requests": 2},
                          workers={"pool": "specbatch-test", "lease_s": 4})
    reference = submit(dataset, config, "ref", tmp_path / "local")  # uninterrupted, local
    assert reference.returncode == 0, reference.stderr
    expected = _outputs(ledger.read_table(tmp_path / "local" / "ref", "results").to_pylist())

    with s3_server(tmp_path / "moto.log") as s3_env:
        from s3fs import S3FileSystem

        bucket = make_bucket("pool-jobs")
        S3FileSystem().put_file(str(dataset), f"{bucket}/data/prompts.jsonl")
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        env = {**_env(tmp_path / "prefect-home", api_url), **s3_env}
        server = _start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env,
                        tmp_path / "server.log")
        workers: list[subprocess.Popen] = []
        try:
            _wait_healthy(api_url, server)
            _prefect(["work-pool", "create", "specbatch-test", "--type", "process"], env)
            for name in ("machine-a", "machine-b"):  # nothing shared but the API and the object store
                home = tmp_path / name
                home.mkdir()
                worker_env = {**env, "PREFECT_HOME": str(home / ".prefect"), "PWD": str(home),
                              "PREFECT_PROFILES_PATH": str(home / ".prefect" / "profiles.toml")}
                with (tmp_path / f"{name}.log").open("ab") as log:
                    workers.append(subprocess.Popen(
                        [PREFECT, "worker", "start", "--pool", "specbatch-test", "--limit", "1", "--name", name],
                        cwd=home, env=worker_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True))
            parent = subprocess.Popen(
                [sys.executable, "-m", "specbatch.cli", "submit", f"{bucket}/data/prompts.jsonl", "--config",
                 str(config), "--job-id", "pool-1", "--output", f"{bucket}/jobs", "--set", "workers.placement=pool",
                 "--set", "workers.slots=2"],
                cwd=tmp_path, env={**env, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            killed = _kill_a_worker_after_its_first_part(f"{bucket}/jobs/pool-1", workers, parent)
            out, err = parent.communicate(timeout=600)
            status = subprocess.run([sys.executable, "-m", "specbatch.cli", "status", f"{bucket}/jobs/pool-1"],
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            report = subprocess.run([sys.executable, "-m", "specbatch.cli", "report", f"{bucket}/jobs/pool-1"],
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            job = f"{bucket}/jobs/pool-1"
            results = ledger.read_table(job, "results").to_pylist()
            worker_ids = set(ledger.read_table(job, "rounds").column("worker_id").to_pylist())
            manifest = json.loads(S3FileSystem().cat_file(f"{job}/manifest.json"))
            runs = subprocess.run([PREFECT, "--no-prompt", "flow-run", "ls", "--limit", "20"],
                                  env={**env, "COLUMNS": "300"},
                                  capture_output=True, text=True, timeout=120).stdout
        finally:
            stop_groups(workers, grace_s=30)
            stop_groups([server], grace_s=30)
    assert killed, "no worker flow run was found to kill"
    assert parent.returncode == 0, out + err
    ids = [row["request_id"] for row in results if row["status"] == "completed"]
    assert sorted(ids) == sorted(r["id"] for r in records) and len(ids) == len(set(ids))  # each exactly once
    assert {row["status"] for row in results} == {"completed"}
    assert worker_ids == {0, 1}
    assert _outputs([row for row in results if row["status"] == "completed"]) == expected
    assert manifest["status"] == "done" and {s["status"] for s in manifest["shards"]} == {"done"}
    assert runs.count("specbatch-worker") == 3 and "CRASHED" in runs, runs  # the killed run, and its successor
    assert status.returncode == 0 and "completed" in status.stdout, status.stdout + status.stderr
    assert report.returncode == 0 and (tmp_path / "reports" / "pool-1" / "report.md").exists(), report.stderr


def _kill_a_worker_after_its_first_part(job: str, workers: list[subprocess.Popen], parent: subprocess.Popen) -> bool:
    """SIGKILL the flow-run process of the first Prefect worker whose flow run has committed a part."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and parent.poll() is None:
        workers_with_parts = {ledger.parse_part_name(name)[0] for name in ledger.committed_parts(job)}
        for worker in workers:
            pids = _flow_run_processes(worker.pid)
            if pids and workers_with_parts:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                return True
        time.sleep(0.3)
    return False
