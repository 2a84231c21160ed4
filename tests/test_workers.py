"""Worker processes on CPU: `accelerate launch` with two gloo processes, each on its own shards; a
worker killed with SIGKILL mid-run, and the retry that completes the job with every record once."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from specbatch.config import load_config
from specbatch.job.flow import run_workers
from specbatch.job.launch import WorkerGroupError, choose_launcher, launch_workers, worker_commands
from specbatch.job.manifest import load_manifest
from specbatch.job.prepare import prepare
from specbatch.ledger import parse_part_name, read_table

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding proposes"]


def _job(tmp_path: Path, tiny_pair, job_id: str, num_records: int, max_new_tokens: int, *overrides: str):
    target, draft, _ = tiny_pair
    dataset = tmp_path / f"{job_id}.jsonl"
    dataset.write_text("".join(
        json.dumps({"id": f"r{i:03d}", "prompt": PROMPTS[i % 4] + " x" * (i % 5), "max_new_tokens": max_new_tokens})
        + "\n" for i in range(num_records)))
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft",
                                "workers.num_processes=2",
                                "io.shard_size=3", *overrides])
    job_dir = tmp_path / job_id
    prepare(dataset, job_dir, config)
    return job_dir, config, {f"r{i:03d}" for i in range(num_records)}


def _shard_of_request(job_dir: Path) -> dict[str, int]:
    shards = [shard.name for shard in load_manifest(job_dir).shards]
    return {request_id: index for index, name in enumerate(shards)
            for request_id in pq.read_table(job_dir / "shards" / name, columns=["request_id"]).column(0).to_pylist()}


def _worker_of_request(job_dir: Path) -> dict[str, int]:
    owners = {}
    for path in (job_dir / "results").glob("*.parquet"):
        worker_id = parse_part_name(path.stem)[0]
        for request_id in pq.read_table(path, columns=["request_id"]).column(0).to_pylist():
            owners[request_id] = worker_id
    return owners


def test_launcher_choice_and_commands(tmp_path, monkeypatch):
    assert choose_launcher(1) == "in-process"
    assert choose_launcher(2) == "accelerate"
    monkeypatch.setenv("SPECBATCH_LAUNCHER", "subprocess")
    assert choose_launcher(2) == "subprocess"
    [accelerate] = worker_commands(tmp_path, "r1", 2, "accelerate")
    assert accelerate[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert "--multi_gpu" in accelerate and "--cpu" not in accelerate  # --cpu starts one process
    assert accelerate[accelerate.index("--num_processes") + 1] == "2"
    plain = worker_commands(tmp_path, "r1", 3, "subprocess")
    assert [command[command.index("--worker-id") + 1] for command in plain] == ["0", "1", "2"]


def test_two_processes_split_the_shards(tmp_path, tiny_pair):
    job_dir, config, ids = _job(tmp_path, tiny_pair, "split", 16, 6)
    seen = []
    result = launch_workers(job_dir, config, "split", on_round=seen.append)
    assert (result.launcher, result.num_processes, result.stopped) == ("accelerate", 2, False)
    assert seen and seen[-1].num_done == len(ids)
    results = read_table(job_dir, "results").column("request_id").to_pylist()
    assert sorted(results) == sorted(ids)  # no gap, no overlap
    shard_of, worker_of = _shard_of_request(job_dir), _worker_of_request(job_dir)
    assert all(worker_of[request_id] == shard_of[request_id] % 2 for request_id in ids)
    assert set(read_table(job_dir, "rounds").column("worker_id").to_pylist()) == {0, 1}
    assert set(read_table(job_dir, "requests").column("worker_id").to_pylist()) == {0, 1}
    assert {shard.status for shard in load_manifest(job_dir).shards} == {"done"}


def _worker_pid(job_dir: Path, rank: str, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            try:
                cmdline = process.info["cmdline"] or []
                ours = "specbatch.job.worker" in cmdline and str(job_dir) in cmdline
                if ours and process.environ().get("RANK") == rank:
                    return process.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.1)
    raise AssertionError(f"worker {rank} never started")


def _wait_for_part(job_dir: Path, worker_id: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not list((job_dir / "results").glob(f"part-w{worker_id:02d}-*.parquet")):
        assert time.monotonic() < deadline, f"worker {worker_id} committed nothing"
        time.sleep(0.05)


def test_killed_worker_then_retry_completes_every_record_once(tmp_path, tiny_pair):
    job_dir, _, ids = _job(tmp_path, tiny_pair, "kill", 20, 16, "io.part_every_requests=2",
                           "scheduler.max_batch_rows=2")
    failures: list[BaseException] = []

    def first_attempt() -> None:
        try:
            run_workers.fn(str(job_dir))
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            failures.append(error)

    thread = threading.Thread(target=first_attempt)
    thread.start()
    pid = _worker_pid(job_dir, "1")
    _wait_for_part(job_dir, 1)  # worker 1 committed a part and is still running
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], WorkerGroupError), failures
    after_crash = read_table(job_dir, "results").column("request_id").to_pylist()
    assert 0 < len(after_crash) < len(ids)  # committed work of both workers kept, the rest missing

    outcome = run_workers.fn(str(job_dir))  # what the task's retry runs
    assert not outcome["stopped"]
    results = read_table(job_dir, "results").select(["request_id", "status"]).to_pylist()
    assert sorted(row["request_id"] for row in results) == sorted(ids)  # every record exactly once
    assert {row["status"] for row in results} == {"completed"}
    shard_of, worker_of = _shard_of_request(job_dir), _worker_of_request(job_dir)
    assert all(worker_of[request_id] == shard_of[request_id] % 2 for request_id in ids)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(job_dir) in (p.info["cmdline"] or [])]
    assert not leftovers


@pytest.mark.slow
def test_plain_subprocess_launcher(tmp_path, tiny_pair, monkeypatch):
    monkeypatch.setenv("SPECBATCH_LAUNCHER", "subprocess")
    job_dir, config, ids = _job(tmp_path, tiny_pair, "plain", 12, 6)
    result = launch_workers(job_dir, config, "plain")
    assert result.launcher == "subprocess"
    assert sorted(read_table(job_dir, "results").column("request_id").to_pylist()) == sorted(ids)
    assert set(read_table(job_dir, "rounds").column("worker_id").to_pylist()) == {0, 1}
