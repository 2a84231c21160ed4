"""The README's deployment steps with real processes: a Prefect server on 127.0.0.1 (free port, temporary
PREFECT_HOME), a process work pool and worker, `prefect deploy --all` from the repository root, and
`prefect deployment run 'specbatch-job/local' ... --watch`; then the job's Parquet outputs. Every
process is stopped by its PID (its process group), the worker before the server.

Run with `pytest -m deployment` (a few minutes; not part of the default run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specbatch.job.processes import free_port, stop_groups

pytestmark = pytest.mark.deployment

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def _env(home: Path, api_url: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(home), "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
            "PREFECT_API_URL": api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
            "PREFECT_UI_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1", "PWD": str(REPO)}


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait_healthy(api_url: str, server: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "prefect server exited"
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("prefect server did not become healthy")


def _prefect(args: list[str], env: dict[str, str], timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    result = subprocess.run([PREFECT, "--no-prompt", *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    assert result.returncode == 0, f"prefect {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_prefect_yaml_holds_no_machine_path():
    text = (REPO / "prefect.yaml").read_text()
    assert 'directory: "{{ $PWD }}"' in text and str(REPO) not in text


def test_readme_deployment_steps(tmp_path, tiny_pair):
    target, draft, _ = tiny_pair
    config = tmp_path / "job.yaml"
    config.write_text(f"models: {{target: {target}, draft: {draft}}}\ndrafter: {{kind: draft}}\n"
                      "io: {shard_size: 4}\n")
    dataset = tmp_path / "prompts.jsonl"
    prompts = ["def add(a, b):", "The quick brown fox", "for i in range(3):", "Speculative decoding"]
    dataset.write_text("".join(json.dumps({"id": f"p{i}", "prompt": prompts[i % 4], "max_new_tokens": 8}) + "\n"
                               for i in range(10)))
    output = tmp_path / "outputs"
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = _env(tmp_path / "prefect-home", api_url)
    server = _start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env,
                    tmp_path / "server.log")
    try:
        _wait_healthy(api_url, server)
        _prefect(["work-pool", "create", "specbatch", "--type", "process"], env)
        _prefect(["deploy", "--all"], env)
        stored = _prefect(["deployment", "inspect", "specbatch-job/local"], env).stdout
        assert f"'directory': '{REPO}'" in stored  # `prefect deploy` filled in {{ $PWD }}
        worker = _start([PREFECT, "worker", "start", "--pool", "specbatch"], env, tmp_path / "worker.log")
        try:
            run = _prefect(["deployment", "run", "specbatch-job/local", "--param", f"dataset={dataset}",
                            "--param", "job_id=dep-1", "--param", f"output={output}",
                            "--param", f"config={config}", "--watch"], env, timeout_s=600)
            submitted = subprocess.run([sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--config",
                                        str(config), "--job-id", "dep-2", "--output", str(output),
                                        "--set", "workers.num_processes=2", "--deployment", "local", "--wait"],
                                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        finally:
            stop_groups([worker], grace_s=30)
    finally:
        stop_groups([server], grace_s=30)
    assert "Completed" in run.stdout, run.stdout
    assert submitted.returncode == 0 and "Completed" in submitted.stdout, submitted.stdout + submitted.stderr
    for job_id, worker_ids in (("dep-1", {0}), ("dep-2", {0, 1})):  # dep-2: two worker processes
        job_dir = output / job_id
        results = pq.read_table(job_dir / "results").to_pylist()
        assert sorted(row["request_id"] for row in results) == sorted(f"p{i}" for i in range(10))
        assert {row["status"] for row in results} == {"completed"}
        assert set(pq.read_table(job_dir / "rounds").column("worker_id").to_pylist()) == worker_ids
        assert json.loads((job_dir / "manifest.json").read_text())["status"] == "done"
    for process in (worker, server):
        with pytest.raises(ProcessLookupError):
            os.killpg(process.pid, 0)  # nothing left in either process group
