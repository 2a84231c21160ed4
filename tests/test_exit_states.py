"""Honest exit states: cancelled rows are never "done" (a resume runs them again, even rows a killed
run's worker committed after the retire step), and a run that ends with cancelled rows ends
`Cancelled` (exit 130), not as a success."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import typer
from job_helpers import write_config, write_jsonl
from prefect.testing.utilities import prefect_test_harness

from specbatch.cli.common import EXIT_STOPPED
from specbatch.cli.job import _exit_as
from specbatch.config import load_config
from specbatch.job import flow
from specbatch.job.worker import run_worker
from specbatch.ledger import read_table

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding"]


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def _job(tmp_path: Path, tiny_pair, num_records: int = 6) -> dict:
    records = [{"id": f"q{i}", "prompt": PROMPTS[i % 4], "max_new_tokens": 8} for i in range(num_records)]
    dataset = write_jsonl(tmp_path / "data.jsonl", records)
    config = write_config(tmp_path, tiny_pair, scheduler={"max_batch_rows": 2})
    return {"dataset": str(dataset), "config": str(config), "job_id": "j", "output": str(tmp_path / "out")}


def _cancel_after_first_round(job_dir: Path, config_path: str, run_id: str) -> None:
    """A worker that cancels its in-flight requests after one round, as a killed run's worker does."""
    stop = threading.Event()
    run_worker(job_dir, load_config(Path(config_path)), run_id=run_id, stop_requested=stop,
               on_round=lambda _: stop.set())


def _statuses(job_dir: Path) -> dict[str, list[str]]:
    rows = read_table(job_dir, "results").select(["request_id", "status"]).to_pylist()
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["request_id"], []).append(row["status"])
    return out


def test_cancelled_rows_committed_after_the_retire_step_run_again(harness, tmp_path, tiny_pair, monkeypatch):
    parameters = _job(tmp_path, tiny_pair)
    job_dir = Path(parameters["output"]) / "j"
    stopped = flow.LocalHooks(stop_requested=threading.Event())
    stopped.stop_requested.set()
    with flow.local_hooks(stopped):  # ingest only: stopped before the first round
        assert flow.specbatch_job(**parameters, return_state=True).is_cancelled()
    retire = flow.retire_cancelled_results

    def retire_then_late_commit(path: Path, **kwargs: bool) -> int:
        retired = retire(path, **kwargs)
        _cancel_after_first_round(path, parameters["config"], "killed-run")  # lands after the retire step
        return retired

    monkeypatch.setattr(flow, "retire_cancelled_results", retire_then_late_commit)
    state = flow.specbatch_job(**parameters, return_state=True)
    assert state.is_completed(), state.message
    outcome = state.result()
    assert outcome["is_complete"] and outcome["num_cancelled"] == 0, outcome
    assert _statuses(job_dir) == {f"q{i}": ["completed"] for i in range(6)}  # late cancelled rows retired
    _exit_as(state, job_dir)  # exit 0: returns


def test_a_run_that_ends_with_cancelled_rows_ends_cancelled_and_exits_130(harness, tmp_path, tiny_pair,
                                                                         monkeypatch):
    parameters = _job(tmp_path, tiny_pair)
    job_dir = Path(parameters["output"]) / "j"

    def worker_cancelled_on_its_own(path: Path, config, run_id: str, **_) -> flow.WorkerProgress:
        _cancel_after_first_round(path, parameters["config"], run_id)  # no stop asked of the flow
        return flow.WorkerProgress()

    monkeypatch.setattr(flow, "run_worker", worker_cancelled_on_its_own)
    state = flow.specbatch_job(**parameters, return_state=True)
    assert state.is_cancelled() and "cancelled" in (state.message or ""), state
    assert state.result(raise_on_failure=False)["num_cancelled"] > 0
    with pytest.raises(typer.Exit) as exited:
        _exit_as(state, job_dir)
    assert exited.value.exit_code == EXIT_STOPPED
    monkeypatch.undo()
    state = flow.specbatch_job(**parameters, return_state=True)  # the resume runs every cancelled request
    assert state.is_completed() and state.result()["is_complete"], state
    assert _statuses(job_dir) == {f"q{i}": ["completed"] for i in range(6)}
