"""One runner per job: a second `specbatch submit` (or a flow run from a deployment) of a running job
exits 2 naming the holder, touching nothing; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from job_helpers import results, submit, write_config, write_jsonl
from prefect.testing.utilities import prefect_test_harness

from specbatch.job.flow import UNUSABLE_INPUT, specbatch_job
from specbatch.job.lock import LOCK_NAME, job_lock
from specbatch.ledger import parse_part_name

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding"]
HOLD = "import sys, time; from specbatch.job.lock import job_lock\nwith job_lock(sys.argv[1]):\n" \
       "    print('held', flush=True); time.sleep(600)\n"


def _records(n: int, max_new_tokens: int) -> list[dict]:
    return [{"id": f"q{i:03d}", "prompt": PROMPTS[i % 4], "max_new_tokens": max_new_tokens} for i in range(n)]


def _wait_for(condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow  # a refusal and a resumed job through the CLI (~50 s on 2 cores)
def test_a_held_lock_refuses_then_a_dead_holders_lock_is_taken_over(tmp_path, tiny_pair):
    dataset = write_jsonl(tmp_path / "data.jsonl", _records(3, 3))
    config = write_config(tmp_path, tiny_pair)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "j")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = submit(dataset, config, "j", tmp_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"job j is running (pid {holder.pid} on {socket.gethostname()})" in refused.stderr
        assert "Traceback" not in refused.stderr and sorted(os.listdir(tmp_path / "j")) == [LOCK_NAME]
    finally:
        holder.kill()  # kill -9: the kernel drops its flock, its pid stays in the file
        holder.wait()
    assert json.loads((tmp_path / "j" / LOCK_NAME).read_text())["pid"] == holder.pid
    resumed = submit(dataset, config, "j", tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(r["request_id"] for r in results(tmp_path / "j")) == ["q000", "q001", "q002"]


@pytest.mark.slow
def test_two_submits_of_one_job_one_runs_the_other_exits_2(tmp_path, tiny_pair):
    dataset = write_jsonl(tmp_path / "data.jsonl", _records(200, 100))  # minutes of work: stopped below
    config = write_config(tmp_path, tiny_pair, drafter={"kind": "none"}, scheduler={"max_batch_rows": 2})
    command = [sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--config", str(config),
               "--job-id", "j", "--output", str(tmp_path)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: any((tmp_path / "j" / "results").glob("*.parquet")))
        second = submit(dataset, config, "j", tmp_path, timeout=120)
        assert first.poll() is None, "the first run ended before the second started"
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"job j is running (pid {first.pid} on {socket.gethostname()})" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    done = [r["request_id"] for r in results(tmp_path / "j") if r["status"] != "cancelled"]
    assert len(done) == len(set(done))
    assert len({parse_part_name(p.stem)[1] for p in (tmp_path / "j" / "results").glob("*.parquet")}) == 1  # one run


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_a_flow_run_of_a_running_job_ends_unusable(harness, tmp_path, tiny_pair):
    """What a deployment run does: the flow itself takes the lock before ingest."""
    dataset = write_jsonl(tmp_path / "data.jsonl", _records(2, 2))
    config = write_config(tmp_path, tiny_pair)
    with job_lock(tmp_path / "out" / "j"):
        state = specbatch_job(dataset=str(dataset), config=str(config), job_id="j", output=str(tmp_path / "out"),
                              return_state=True)
    assert state.name == UNUSABLE_INPUT and f"job j is running (pid {os.getpid()} on" in state.message
    assert not (tmp_path / "out" / "j" / "manifest.json").exists()
    state = specbatch_job(dataset=str(dataset), config=str(config), job_id="j", output=str(tmp_path / "out"),
                          return_state=True)
    assert state.is_completed(), state.message
