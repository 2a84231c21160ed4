"""Every report query equals the same figure computed by hand in Python from the job's rows.

The expected values come only from the Parquet rows (`rows(job_dir, table)`), never from how the
jobs were built, so a real job written by the engine can replace `fake_jobs` unchanged.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from specbatch import ledger
from specbatch.engine.records import RequestRecord, ResultRecord, RoundRecord, StepRecord

# ---------------------------------------------------------------- a fake engine writing real parts


@dataclass
class _Req:
    request_id: str
    domain: str
    max_new_tokens: int
    cancel_after: int | None = None  # emissions before the job cancels it
    arrival_s: float = 0.0
    admitted_s: float = 0.0
    first_token_s: float | None = None
    tokens: list[int] = field(default_factory=list)
    num_rounds: int = 0
    num_proposed: int = 0
    num_accepted: int = 0
    num_emissions: int = 0


def _round(worker_id: int, index: int, t: float, rng: random.Random, rows: dict[str, int]) -> RoundRecord:
    round_ms = rng.uniform(5.0, 20.0)
    plan, prefill, draft, verify, commit = (round_ms * f for f in (0.05, 0.1, 0.2, 0.5, 0.05))
    return RoundRecord(
        worker_id=worker_id, round_index=index, started_s=t, num_batch_rows=rows["batch"],
        num_bucket_rows=-(-rows["batch"] // 4) * 4, num_decode_rows=rows["decode"],
        num_prefill_rows=rows["prefill"], num_prefill_tokens=rows["prefill_tokens"],
        num_target_rows=rows["target"], num_padded_target_rows=rows["padded"],
        num_draft_rows=rows["draft"], num_padded_draft_rows=rows["draft_padded"], num_target_passes=1,
        num_draft_passes=rows["max_k"], num_proposed=rows["proposed"], num_accepted=rows["accepted"],
        num_committed=rows["committed"], num_speculating_rows=rows["speculating"], max_k=rows["max_k"],
        query_len=1 + rows["max_k"], kv_len=64, num_kv_tokens_read=rows["target"] * 40,
        kv_tokens_in_use=rows["batch"] * 40, kv_tokens_capacity=1024, plan_ms=plan, prefill_ms=prefill,
        draft_ms=draft, verify_ms=verify, commit_ms=commit, round_ms=round_ms,
    )


def _finish(writer: ledger.PartWriter, worker_id: int, req: _Req, status: str, t: float) -> None:
    reason = "length" if status == "completed" else None
    drop = "deadline" if status == "cancelled" else None
    writer.add_request(RequestRecord(
        request_id=req.request_id, worker_id=worker_id, domain=req.domain, status=status,
        finish_reason=reason, drop_reason=drop, num_prompt_tokens=12, num_output_tokens=len(req.tokens),
        max_new_tokens=req.max_new_tokens, temperature=0.0, arrival_s=req.arrival_s,
        admitted_s=req.admitted_s, first_token_s=req.first_token_s, finished_s=t,
        num_rounds=req.num_rounds, num_target_rows=0, num_draft_rows=0, num_proposed=req.num_proposed,
        num_accepted=req.num_accepted, num_preemptions=0,
    ))
    writer.add_result(ResultRecord(
        request_id=req.request_id, status=status, text="x" * len(req.tokens), output_token_ids=req.tokens,
        finish_reason=reason, drop_reason=drop, num_prompt_tokens=12, num_output_tokens=len(req.tokens),
        domain=req.domain,
    ))


def _decode(req: _Req, k: int, rng: random.Random) -> tuple[int, int, int]:
    """(proposed, accepted, committed) for one row; the first emission is the prefill's token."""
    if req.first_token_s is None:
        return 0, 0, 1
    accepted = rng.randint(0, k)
    return k, accepted, min(accepted + 1, req.max_new_tokens - len(req.tokens))


def run_fake_worker(
    writer: ledger.PartWriter, worker_id: int, reqs: list[_Req], t: float, seed: int, max_k: int,
    crash_after_rounds: int | None = None,
) -> float:
    """Admit 3 rows at a time, decode with random acceptance; returns the time it stopped."""
    rng, waiting, running, index = random.Random(seed), list(reqs), [], 0
    for req in reqs:
        req.arrival_s = t
    while waiting or running:
        if crash_after_rounds is not None and index == crash_after_rounds:
            return t  # killed: whatever is buffered is lost
        while waiting and len(running) < 3:
            running.append(waiting.pop(0))
            running[-1].admitted_s = t
        rows = defaultdict(int)
        plan = []
        for req in running:
            k = rng.randint(0, max_k) if req.first_token_s is not None else 0
            proposed, accepted, committed = _decode(req, k, rng)
            plan.append((req, k, proposed, accepted, committed))
            is_prefill = req.first_token_s is None
            rows["batch"] += 1
            rows["prefill" if is_prefill else "decode"] += 1
            rows["prefill_tokens"] += 12 * is_prefill
            rows["target"] += 12 if is_prefill else 1 + k
            rows["padded"] += max_k - k if not is_prefill else 0
            rows["draft"] += k
            rows["draft_padded"] += max_k - k if k else 0
            rows["speculating"] += k > 0
            rows["max_k"] = max(rows["max_k"], k)
            for key, value in (("proposed", proposed), ("accepted", accepted), ("committed", committed)):
                rows[key] += value
        record = _round(worker_id, index, t, rng, rows)
        writer.add_round(record)
        t_end = t + record.round_ms / 1000.0
        for req, k, proposed, accepted, committed in plan:
            req.tokens += [rng.randrange(1000) for _ in range(committed)]
            req.first_token_s = req.first_token_s or t_end
            req.num_rounds += 1
            req.num_proposed += proposed
            req.num_accepted += accepted
            req.num_emissions += 1
            writer.add_step(StepRecord(req.request_id, worker_id, index, t_end, k, proposed, accepted,
                                       committed, len(req.tokens)))
            if len(req.tokens) >= req.max_new_tokens or req.num_emissions == req.cancel_after:
                status = "completed" if len(req.tokens) >= req.max_new_tokens else "cancelled"
                _finish(writer, worker_id, req, status, t_end)
                running.remove(req)
        writer.maybe_flush()
        t, index = t_end + rng.uniform(0.0, 0.004), index + 1
    writer.flush()
    return t


def _requests(seed: int) -> list[_Req]:
    rng = random.Random(seed)
    reqs = [_Req(f"q{i:02d}", rng.choice(["chat", "code", "math"]), rng.randint(3, 14)) for i in range(10)]
    reqs[7].cancel_after = 2
    return reqs


def _drop_invalid(writer: ledger.PartWriter) -> None:
    writer.add_result(ResultRecord("bad-0", "dropped", None, drop_reason="invalid_json",
                                   drop_message="line 11: Expecting value"))
    writer.add_result(ResultRecord("bad-1", "dropped", None, drop_reason="empty_prompt",
                                   drop_message="prompt is empty", domain="chat"))


def write_speculative_job(job_dir: Path) -> None:
    """Two workers; worker 0 is killed, leaves a half-written part, and a second run resumes it."""
    reqs = _requests(1)
    writer = ledger.PartWriter(job_dir, 0, "run1", every_requests=1, every_s=1e9)
    _drop_invalid(writer)
    end = run_fake_worker(writer, 0, reqs[:6], 1000.0, seed=2, max_k=4, crash_after_rounds=6)
    run_fake_worker(ledger.PartWriter(job_dir, 1, "run1", 2, 1e9), 1, reqs[6:], 1000.002, 3, max_k=4)
    committed = ledger.committed_parts(job_dir)[0]
    shutil.copy(job_dir / "rounds" / f"{committed}.parquet", job_dir / "rounds" / "part-w00-run1-00099.parquet")
    (job_dir / "results" / "part-w00-run1-00099.parquet.tmp").write_bytes(b"half")
    done = ledger.committed_request_ids(job_dir)
    again = [_Req(r.request_id, r.domain, r.max_new_tokens) for r in reqs[:6] if r.request_id not in done]
    assert again, "the crash should leave requests to redo"
    writer = ledger.PartWriter(job_dir, 0, "run-2", every_requests=3, every_s=1e9)
    run_fake_worker(writer, 0, again, end + 50.0, seed=4, max_k=4)


def write_plain_job(job_dir: Path) -> None:
    writer = ledger.PartWriter(job_dir, 0, "run1", every_requests=4, every_s=1e9)
    _drop_invalid(writer)
    run_fake_worker(writer, 0, _requests(1), 2000.0, seed=5, max_k=0)


@pytest.fixture(scope="module")
def fake_jobs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("outputs")
    jobs = [root / "none-job", root / "spec-job"]
    write_plain_job(jobs[0])
    write_speculative_job(jobs[1])
    return jobs
