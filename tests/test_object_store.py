"""Jobs on an object store: a real S3-compatible server (moto, started here) holds the dataset and the
job. The storage layer's commit primitives, the lease that replaces `flock`, the ledger, a whole job
through the CLI, `status` and `report` over `s3://`, and a second submit of a running job refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from job_helpers import write_config, write_jsonl
from test_ledger import _request, _result, _round

from specbatch import ledger
from specbatch.fences import epoch_run_id
from specbatch.job.finalize import export_results_jsonl
from specbatch.job.lease import Lease, LeaseHeldError, check_lease, hold_lease
from specbatch.job.lock import LEASE_FOLDER, JobRunningError, LeaseLostError, check_epoch, check_not_running, job_lock
from specbatch.lab.services import make_bucket, s3_server
from specbatch.storage import ObjectStorage, open_storage

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(3):", "Speculative decoding"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("s3") / "moto.log") as env:
        yield env


@pytest.fixture
def bucket(s3, request) -> str:
    return make_bucket(re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-"))


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(tmp_path / "job")
    request.getfixturevalue("s3")
    return open_storage(make_bucket("storage-primitives") + "/jobs/j1")


def test_storage_writes_whole_objects_and_creates_only_once(storage):
    storage.write_bytes("a/x.json", b"1")
    storage.write_bytes("a/x.json", b"2")  # a replace
    assert storage.read_bytes("a/x.json") == b"2"
    assert storage.create("a/lock", b"first") and not storage.create("a/lock", b"second")
    assert storage.read_bytes("a/lock") == b"first"
    with pytest.raises(RuntimeError), storage.open_write("a/half.parquet") as file:
        file.write(b"PAR1")
        raise RuntimeError("the writer failed")
    assert storage.names("a") == ["lock", "x.json"]  # nothing of the failed write is visible
    storage.write_parquet("t/p.parquet", pa.table({"v": [1, 2]}))
    storage.write_parquet("t/q.parquet", pa.table({"v": [1, 2], "w": ["a", "b"]}))
    assert storage.read_parquet("t/p.parquet").column("v").to_pylist() == [1, 2]
    assert storage.read_parquet("t/q.parquet", columns=["w"]).to_pydict() == {"w": ["a", "b"]}
    storage.delete("a/lock")
    storage.delete("a/lock")  # already gone: nothing
    assert not storage.exists("a/lock") and storage.names("missing") == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("a/lock")


def test_lease_has_one_holder_and_a_dead_holder_is_taken_over(bucket):
    storage = open_storage(f"{bucket}/jobs/j1")
    with hold_lease(storage, ".job-lease", ttl_s=30):
        with pytest.raises(LeaseHeldError, match=f"pid {os.getpid()}"):
            Lease(storage, ".job-lease", ttl_s=30).try_acquire()
        with pytest.raises(LeaseHeldError):
            check_lease(storage, ".job-lease")
    check_lease(storage, ".job-lease")  # released on exit: free at once
    stalled = Lease(storage, ".job-lease", ttl_s=0.5)
    stalled.try_acquire()  # never renewed, as if its holder were killed
    time.sleep(0.6)
    successor = Lease(storage, ".job-lease", ttl_s=30)
    successor.try_acquire()
    assert successor.number == stalled.number + 1
    assert not stalled.renew() and stalled.lost  # the stalled holder learns it must stop


def test_two_runners_racing_for_a_lease_get_one_winner(bucket):
    storage = open_storage(f"{bucket}/jobs/race")
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def contend() -> None:
        start.wait()
        try:
            Lease(storage, ".job-lease", ttl_s=30).try_acquire()
            outcomes.append("won")
        except LeaseHeldError:
            outcomes.append("refused")

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused", "refused", "refused", "won"]


def test_job_lock_on_an_object_store_refuses_a_second_runner(bucket):
    job_dir = f"{bucket}/jobs/locked"
    with job_lock(job_dir, wait_s=0):
        with pytest.raises(JobRunningError, match=r"job locked is running \(pid"):
            check_not_running(job_dir)
        with pytest.raises(JobRunningError), job_lock(job_dir, wait_s=0):
            pass
    check_not_running(job_dir)


def test_ledger_commits_on_an_object_store(bucket):
    job_dir = f"{bucket}/jobs/ledger"
    writer = ledger.PartWriter(job_dir, worker_id=3, run_id="r1")
    writer.add_round(_round())
    writer.add_request(_request("done"))
    writer.add_result(_result("done"))
    first = writer.flush()
    storage = open_storage(job_dir)
    assert isinstance(storage, ObjectStorage)
    storage.write_parquet(f"rounds/part-w03-r1-00001{ledger.PART_SUFFIX}", ledger.to_table([_round(1)],
                                                                                           ledger.ROUNDS_SCHEMA))
    assert ledger.committed_parts(job_dir) == [first]  # a part without its results object does not count
    assert ledger.committed_request_ids(job_dir) == {"done"}
    assert ledger.read_table(job_dir, "rounds").num_rows == 1
    assert ledger.remove_orphan_parts(job_dir, worker_id=3) == ["rounds/part-w03-r1-00001.parquet"]
    assert ledger.PartWriter(job_dir, worker_id=3, run_id="r1")._seq == 1  # continues after the committed part


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbatch.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.slow  # whole jobs and a report through the CLI on a moto server (~70 s on 2 cores)
def test_a_job_on_an_object_store_runs_reports_and_refuses_a_second_runner(bucket, tiny_pair, tmp_path):
    from s3fs import S3FileSystem

    records = [{"id": f"p{i}", "prompt": PROMPTS[i % 4], "max_new_tokens": 8} for i in range(12)]
    records.append({"id": "bad", "prompt": 7})  # a malformed record: dropped, and the job goes on
    local = write_jsonl(tmp_path / "prompts.jsonl", records)
    fs = S3FileSystem()
    fs.put_file(str(local), f"{bucket}/data/prompts.jsonl")
    config = write_config(tmp_path, tiny_pair, workers={"lease_s": 5})
    jobs = f"{bucket}/jobs"
    submit = ("submit", f"{bucket}/data/prompts.jsonl", "--config", str(config), "--job-id", "s3-1", "--output", jobs)

    with job_lock(f"{jobs}/s3-1", wait_s=0):  # a runner of this job (this test) holds its lease
        refused = _cli(*submit, cwd=tmp_path)
    assert refused.returncode == 2 and "job s3-1 is running (pid" in refused.stderr, refused.stdout + refused.stderr
    run = _cli(*submit, cwd=tmp_path)  # the lease was released: the job runs
    assert run.returncode == 0, run.stdout + run.stderr
    results = ledger.read_table(f"{jobs}/s3-1", "results").to_pylist()
    assert sorted(row["request_id"] for row in results) == sorted([f"p{i}" for i in range(12)] + ["bad"])
    assert {row["request_id"]: row["status"] for row in results}["bad"] == "dropped"
    manifest = json.loads(fs.cat_file(f"{jobs}/s3-1/manifest.json"))
    assert manifest["status"] == "done" and {s["status"] for s in manifest["shards"]} == {"done"}
    assert manifest["dataset"]["path"] == f"{bucket}/data/prompts.jsonl"
    exported = fs.cat_file(f"{jobs}/s3-1/results.jsonl").decode().splitlines()
    assert len(exported) == 13

    status = _cli("status", f"{jobs}/s3-1", cwd=tmp_path)
    assert status.returncode == 0 and "completed" in status.stdout and "done" in status.stdout, status.stdout
    report = _cli("report", f"{jobs}/s3-1", cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    assert (tmp_path / "reports" / "s3-1" / "report.md").exists()
    assert "Throughput versus cost" in report.stdout


@pytest.mark.slow  # four CLI start-ups against a moto server (~100 s on 2 cores)
def test_unusable_object_store_jobs_exit_2_before_any_work(bucket, tiny_pair, tmp_path):
    from s3fs import S3FileSystem

    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"id": "p0", "prompt": PROMPTS[0], "max_new_tokens": 4}])
    S3FileSystem().put_file(str(dataset), f"{bucket}/prompts.jsonl")
    config = str(write_config(tmp_path, tiny_pair))
    missing = _cli("submit", f"{bucket}/nothing-here.jsonl", "--config", config, "--output", f"{bucket}/jobs",
                   cwd=tmp_path)
    assert missing.returncode == 2 and "dataset not found" in missing.stderr, missing.stderr
    no_bucket = _cli("submit", f"{bucket}/prompts.jsonl", "--config", config, "--job-id", "nb", "--output",
                     "s3://no-such-bucket/jobs", cwd=tmp_path)
    assert no_bucket.returncode == 2 and "no-such-bucket" in no_bucket.stderr, no_bucket.stderr
    local_pool = _cli("submit", f"{bucket}/prompts.jsonl", "--config", config, "--job-id", "lp", "--output",
                      str(tmp_path / "jobs"), "--set", "workers.placement=pool", cwd=tmp_path)
    assert local_pool.returncode == 2 and "object-store" in local_pool.stderr, local_pool.stderr
    no_server = _cli("submit", f"{bucket}/prompts.jsonl", "--config", config, "--job-id", "ns", "--output",
                     f"{bucket}/jobs", "--set", "workers.placement=pool", cwd=tmp_path)
    assert no_server.returncode == 2 and "PREFECT_API_URL" in no_server.stderr, no_server.stderr
    assert not S3FileSystem().exists(f"{bucket}/jobs/ns/manifest.json")  # refused before ingest


def _expire(storage, folder: str = LEASE_FOLDER) -> None:
    """As if the holder of the newest lease in `folder` stalled past its expiry (no renewal came in time)."""
    number, _ = Lease(storage, folder, ttl_s=0).newest()
    body = {"pid": 1, "host": "stalled", "released": False, "expires_at": 0}
    storage.write_bytes(f"{folder}/{number:08d}.json", json.dumps(body).encode())


def _readers_see(job_dir: str) -> list[list[str]]:
    """The request ids each reader sees: committed ids, read_table, results.jsonl, the SQL view."""
    from specbatch.report import connect

    exported = open_storage(export_results_jsonl(job_dir).rsplit("/", 1)[0]).read_text("results.jsonl")
    return [sorted(ledger.committed_request_ids(job_dir)),
            sorted(ledger.read_table(job_dir, "results").column("request_id").to_pylist()),
            sorted(json.loads(line)["request_id"] for line in exported.splitlines()),
            sorted(row[0] for row in connect([job_dir]).execute("SELECT request_id FROM results").fetchall())]


def test_a_stalled_lease_holder_never_makes_a_part_visible_after_a_takeover(bucket):
    job_dir = f"{bucket}/jobs/stalled"
    storage = open_storage(job_dir)
    with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_a:
        writer_a = ledger.PartWriter(job_dir, 0, epoch_run_id(epoch_a, "ra"),
                                     before_commit=lambda: check_epoch(job_dir, epoch_a))
        writer_a.add_result(_result("r1"))
        first = writer_a.flush()  # committed before the stall
        _expire(storage)
        with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_b:  # a second submit takes the job over
            assert epoch_b == epoch_a + 1 and ledger.committed_parts(job_dir) == [first]
            writer_a.add_result(_result("r2"))  # the holder wakes up with a part to commit
            with pytest.raises(LeaseLostError, match="taken over"):
                writer_a.flush()
            assert ledger.committed_request_ids(job_dir) == {"r1"}
            writer_a.before_commit = None  # a part that checked before the takeover and uploaded after it
            late = writer_a.flush()
            assert storage.exists(f"results/{late}.parquet") and late not in ledger.committed_parts(job_dir)
            writer_b = ledger.PartWriter(job_dir, 0, epoch_run_id(epoch_b, "rb"))
            writer_b.add_result(_result("r2"))  # the new holder re-runs what was not committed at its fence
            writer_b.flush()
            assert _readers_see(job_dir) == [["r1", "r2"]] * 4
            assert f"results/{late}.parquet" in ledger.remove_orphan_parts(job_dir, worker_id=0)


@pytest.mark.parametrize("race", [False, True], ids=["checked", "raced"])
def test_stalled_worker_commits_nothing_twice(bucket, tiny_pair, tmp_path, monkeypatch, race):
    """A holder stalls after its first part; a second submit takes the job over and its worker runs to
    the end; then the first wakes up. It stops at its next commit check, or, racing past the check, its
    later parts are fenced out: every reader sees each request once, and the first run, finding its
    lease lost, removes its fenced-out parts from results/ (which the duckdb command line reads whole)."""
    from specbatch.config import load_config
    from specbatch.engine.build import load_models
    from specbatch.job import worker
    from specbatch.job.flow import UNUSABLE_INPUT, LocalHooks, local_hooks, run_workers
    from specbatch.job.prepare import prepare

    target, draft, _ = tiny_pair
    records = [{"id": f"r{i:02d}", "prompt": PROMPTS[i % 4], "max_new_tokens": 4} for i in range(10)]
    dataset = write_jsonl(tmp_path / "prompts.jsonl", records)
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft",
                                "io.part_every_requests=2", "scheduler.max_batch_rows=2", "workers.lease_s=600"])
    job_dir = f"{bucket}/jobs/stalled-worker"
    prepare(str(dataset), job_dir, config)
    storage, takeovers = open_storage(job_dir), []
    check_epoch_as_written = worker.check_epoch

    def stall_then_take_over(progress: object) -> None:
        if takeovers or not ledger.committed_parts(storage):
            return
        takeovers.append(True)
        _expire(storage)  # both of the stalled holder's leases run out
        _expire(storage, ".worker-00-lease")
        with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_b, monkeypatch.context() as patch:
            patch.setattr(worker, "check_epoch", check_epoch_as_written)
            worker.run_worker(job_dir, config, run_id=epoch_run_id(epoch_b, "b"), models=load_models(config))

    with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_a, local_hooks(LocalHooks(on_round=stall_then_take_over)):
        if race:  # every commit check of the stalled holder passes, as if each ran just before the takeover
            monkeypatch.setattr(worker, "check_epoch", lambda *_: None)
        state = run_workers.fn(job_dir, epoch_a)  # the worker stage of the flow, as `submit` runs it
    assert state.name == UNUSABLE_INPUT and "taken over" in state.message, state
    assert takeovers and _readers_see(job_dir) == [[f"r{i:02d}" for i in range(10)]] * 4
    committed = ledger.committed_parts(job_dir)
    assert [name[: -len(ledger.PART_SUFFIX)] for name in storage.names("results")] == sorted(committed)


@pytest.mark.parametrize("race", [False, True], ids=["checked", "raced"])
def test_stale_finalize_writes_nothing(bucket, tiny_pair, tmp_path, monkeypatch, race):
    """Runner A is stopped with requests in flight (cancelled) and stalls inside finalize, its view of the
    results read; B takes the job over, runs it to the end and finalizes; then A wakes up. A writes
    nothing more: it stops at its epoch check, or, racing past every check, its conditional writes are
    refused. results.jsonl and the manifest stay B's: every request completed, the job done."""
    from specbatch.config import load_config
    from specbatch.job import finalize as finalize_module
    from specbatch.job.flow import LocalHooks, finalize_job, local_hooks, run_workers
    from specbatch.job.manifest import load_manifest
    from specbatch.job.prepare import prepare

    target, draft, _ = tiny_pair
    ids = [f"r{i:02d}" for i in range(8)]
    dataset = write_jsonl(tmp_path / "prompts.jsonl",
                          [{"id": i, "prompt": PROMPTS[n % 4], "max_new_tokens": 4} for n, i in enumerate(ids)])
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft",
                                "io.part_every_requests=2", "scheduler.max_batch_rows=2", "workers.lease_s=600"])
    job_dir = f"{bucket}/jobs/stalled-finalize"
    storage, summarize, takeovers = open_storage(job_dir), finalize_module.summarize, []

    def take_over() -> None:
        _expire(storage)
        with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_b:  # a second submit: the whole flow
            prepare(str(dataset), job_dir, config)
            finalize_job.fn(job_dir, run_workers.fn(job_dir, epoch_b), epoch_b)

    def stall_after_reading(job: str):
        summary = summarize(job)
        if not takeovers:
            takeovers.append(summary)
            take_over()
        return summary

    hooks = LocalHooks()
    hooks.on_round = lambda progress: hooks.stop_requested.set() if ledger.committed_parts(storage) else None
    with job_lock(job_dir, wait_s=0, lease_s=600) as epoch_a:
        prepare(str(dataset), job_dir, config)
        with local_hooks(hooks):
            workers = run_workers.fn(job_dir, epoch_a)
        assert workers["stopped"]
        monkeypatch.setattr(finalize_module, "summarize", stall_after_reading)
        if race:  # every epoch check of the stalled runner passes, as if each ran just before the takeover
            monkeypatch.setattr(finalize_module, "check_epoch", lambda *_: None)
        with pytest.raises(LeaseLostError):
            finalize_job.fn(job_dir, workers, epoch_a)
    assert takeovers and takeovers[0].num_cancelled > 0  # A's stale view
    exported = [json.loads(line) for line in storage.read_text("results.jsonl").splitlines()]
    assert sorted(row["request_id"] for row in exported) == ids and {row["status"] for row in exported} == {"completed"}
    manifest = load_manifest(job_dir)
    assert manifest.status == "done" and manifest.counters["num_completed"] == len(ids)
    assert manifest.lease_epoch == epoch_a + 1


def test_a_manifest_is_never_written_by_an_older_lease_holder(bucket, tmp_path):
    """The manifest carries the epoch of its last writer; a save by an older one is refused, and a save
    that loses a race with another writer loads the manifest again."""
    from specbatch.config import JobConfig
    from specbatch.job.manifest import load_manifest, new_manifest, save_manifest, update_manifest

    job_dir = f"{bucket}/jobs/manifest-epochs"
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    save_manifest(job_dir, new_manifest("manifest-epochs", dataset, "jsonl", JobConfig()))
    assert update_manifest(job_dir, lambda m: setattr(m, "status", "running"), epoch=3).lease_epoch == 3
    with pytest.raises(LeaseLostError, match="lease 3 while this run \\(lease 2\\)"):
        update_manifest(job_dir, lambda m: setattr(m, "status", "cancelled"), epoch=2)
    stale = load_manifest(job_dir)
    stale.status, stale.lease_epoch = "ingesting", 2  # a stale ingest's save, which loads nothing first
    with pytest.raises(LeaseLostError, match="lease 3 while this run \\(lease 2\\)"):
        save_manifest(job_dir, stale)
    assert load_manifest(job_dir).status == "running"
    racing = []

    def change(manifest) -> None:  # another writer saves between this one's load and its save
        if not racing:
            racing.append(True)
            update_manifest(job_dir, lambda m: setattr(m, "counters", {"num_completed": 1}), epoch=4)
        manifest.status = "done"

    update_manifest(job_dir, change, epoch=4)
    manifest = load_manifest(job_dir)
    assert (manifest.status, manifest.counters, manifest.lease_epoch) == ("done", {"num_completed": 1}, 4)
