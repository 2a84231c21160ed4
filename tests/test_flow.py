"""The `specbatch-job` flow: on a temporary Prefect server (`prefect_test_harness`), its tasks' logic
through `.fn()`, and `specbatch submit` end to end (the real CLI on Prefect's temporary local server)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prefect.artifacts import Artifact
from prefect.testing.utilities import prefect_test_harness

from specbatch.config import load_config
from specbatch.job.flow import (
    UNUSABLE_INPUT,
    LocalHooks,
    finalize_job,
    ingest_and_shard,
    local_hooks,
    run_workers,
    specbatch_job,
)
from specbatch.job.prefect_local import local_prefect_env
from specbatch.ledger import read_table

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding proposes"]


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def _inputs(tmp_path: Path, tiny_pair, num_records: int = 6) -> tuple[Path, Path, set[str]]:
    target, draft, _ = tiny_pair
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i}", "prompt": PROMPTS[i % 4], "max_new_tokens": 6}) + "\n"
                               for i in range(num_records)))
    config = tmp_path / "job.yaml"
    config.write_text(f"models: {{target: {target}, draft: {draft}}}\ndrafter: {{kind: draft}}\n"
                      "io: {shard_size: 4}\n")
    return dataset, config, {f"q{i}" for i in range(num_records)}


def _request_ids(job_dir: Path) -> list[str]:
    return sorted(read_table(job_dir, "results").column("request_id").to_pylist())


def test_flow_runs_a_job_and_publishes_a_summary(harness, tmp_path, tiny_pair):
    dataset, config, ids = _inputs(tmp_path, tiny_pair)
    output = tmp_path / "out"
    state = specbatch_job(dataset=str(dataset), config=str(config), overrides=["drafter.kind=draft"],
                          job_id="flow-1", output=str(output), return_state=True)
    assert state.is_completed(), state.message
    outcome = state.result()
    assert (outcome["num_completed"], outcome["launcher"], outcome["stopped"]) == (len(ids), "in-process", False)
    assert _request_ids(output / "flow-1") == sorted(ids)
    artifact = Artifact.get("specbatch-flow-1")
    assert artifact is not None and f"| completed | {len(ids)} |" in artifact.data


def test_unusable_input_fails_cleanly_without_retries(harness, tmp_path, tiny_pair):
    _, config, _ = _inputs(tmp_path, tiny_pair)
    state = specbatch_job(dataset=str(tmp_path / "missing.jsonl"), config=str(config), job_id="flow-2",
                          output=str(tmp_path / "out"), return_state=True)
    assert state.is_failed() and state.name == UNUSABLE_INPUT
    assert "not found" in state.message
    bad = specbatch_job(dataset=str(tmp_path / "missing.jsonl"), overrides=["scheduler.lookahead=bogus"],
                        output=str(tmp_path / "out"), return_state=True)
    assert bad.name == UNUSABLE_INPUT and "scheduler.lookahead" in bad.message


def test_local_stop_ends_cancelled_and_the_job_resumes(harness, tmp_path, tiny_pair):
    dataset, config, ids = _inputs(tmp_path, tiny_pair)
    parameters = {"dataset": str(dataset), "config": str(config), "job_id": "flow-3", "output": str(tmp_path / "o")}
    started = []
    stopped = LocalHooks(stop_requested=threading.Event(), on_start=lambda *args: started.append(args))
    stopped.stop_requested.set()  # as if Ctrl-C came before the first round
    with local_hooks(stopped):
        state = specbatch_job(**parameters, return_state=True)
    assert state.is_cancelled() and started == [(len(ids), 0)]
    assert state.result(raise_on_failure=False)["stopped"] is True
    rounds = []
    with local_hooks(LocalHooks(on_round=rounds.append)):
        state = specbatch_job(**parameters, return_state=True)
    assert state.is_completed() and rounds and rounds[-1].num_done == len(ids)
    assert _request_ids(tmp_path / "o" / "flow-3") == sorted(ids)


def test_task_logic_without_a_server(tmp_path, tiny_pair):
    dataset, config, ids = _inputs(tmp_path, tiny_pair)
    job_dir = tmp_path / "out" / "fn-1"
    job_config = load_config(config).model_dump(mode="json")
    assert ingest_and_shard.fn(str(dataset), str(job_dir), job_config) == {"num_records": len(ids), "num_shards": 2}
    first = run_workers.fn(str(job_dir))
    assert (first["num_done"], first["launcher"], first["stopped"]) == (len(ids), "in-process", False)
    assert run_workers.fn(str(job_dir))["num_done"] == 0  # a retry after success redoes nothing
    outcome = finalize_job.fn(str(job_dir), first)
    assert outcome["is_complete"] and outcome["num_completed"] == len(ids)
    assert (job_dir / "results.jsonl").read_text().count("\n") == len(ids)
    missing = ingest_and_shard.fn(str(tmp_path / "nope.jsonl"), str(tmp_path / "out" / "fn-2"), job_config)
    assert missing.name == UNUSABLE_INPUT


def test_an_empty_dataset_is_a_notice_not_silence(tmp_path, tiny_pair):
    _, config, _ = _inputs(tmp_path, tiny_pair)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    notices: list[str] = []
    job_config = load_config(config).model_dump(mode="json")
    with local_hooks(LocalHooks(on_notice=notices.append)):
        prepared = ingest_and_shard.fn(str(empty), str(tmp_path / "out" / "empty"), job_config)
    assert prepared["num_records"] == 0
    assert notices == [f"dataset {empty} holds no records: nothing to run"]


def test_local_prefect_env_is_isolated_unless_an_api_is_configured(tmp_path):
    env = local_prefect_env(tmp_path / "out", {})
    assert env["PREFECT_HOME"] == str((tmp_path / "out" / ".prefect").resolve())
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert env["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "CRITICAL"
    shared = local_prefect_env(tmp_path / "out", {"SPECBATCH_PREFECT_HOME": str(tmp_path / "shared")})
    assert shared["PREFECT_HOME"] == str((tmp_path / "shared").resolve())
    configured = local_prefect_env(tmp_path / "out", {"PREFECT_API_URL": "http://server:4200/api"})
    assert "PREFECT_HOME" not in configured and "PREFECT_API_URL" not in configured


def test_submit_runs_the_flow_locally_quietly(tmp_path, tiny_pair):
    dataset, config, ids = _inputs(tmp_path, tiny_pair)
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PREFECT_", "SPECBATCH_PREFECT_HOME"))}
    env.update(HOME=str(home), COLUMNS="120")
    command = [sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--config", str(config),
               "--job-id", "cli-1", "--output", "out"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr and "Prefect" not in run.stdout + run.stderr
    assert re.search(rf"completed\s+│\s+{len(ids)}\s", run.stdout), run.stdout
    assert _request_ids(tmp_path / "out" / "cli-1") == sorted(ids)
    assert (tmp_path / "out" / ".prefect" / "prefect.db").exists()  # Prefect's state: under OUTPUT only
    assert not list(home.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "job.yaml", "out", "prompts.jsonl"]
