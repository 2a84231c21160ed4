"""Every report query equals the same figure computed by hand in Python from the job's rows.

The expected values come only from the Parquet rows (`rows(job_dir, table)`), never from how the
jobs were built. To check a real job written by the engine, add a module-scoped fixture that
returns its job directories and put the fixture's name in `JOB_SETS`.
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

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from specbatch import ledger, report
from specbatch.records import RequestRecord, ResultRecord, RoundRecord, StepRecord

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
        worker_id=worker_id,
        round_index=index,
        started_s=t,
        num_batch_rows=rows["batch"],
        num_bucket_rows=-(-rows["batch"] // 4) * 4,
        num_decode_rows=rows["decode"],
        num_prefill_rows=rows["prefill"],
        num_prefill_tokens=rows["prefill_tokens"],
        num_target_rows=rows["target"],
        num_padded_target_rows=rows["padded"],
        num_draft_rows=rows["draft"],
        num_padded_draft_rows=rows["draft_padded"],
        num_target_passes=1,
        num_draft_passes=rows["max_k"],
        num_proposed=rows["proposed"],
        num_accepted=rows["accepted"],
        num_committed=rows["committed"],
        num_speculating_rows=rows["speculating"],
        max_k=rows["max_k"],
        query_len=1 + rows["max_k"],
        kv_len=64,
        num_kv_tokens_read=rows["target"] * 40,
        kv_tokens_in_use=rows["batch"] * 40,
        kv_tokens_capacity=1024,
        plan_ms=plan,
        prefill_ms=prefill,
        draft_ms=draft,
        verify_ms=verify,
        commit_ms=commit,
        round_ms=round_ms,
    )


def _finish(writer: ledger.PartWriter, worker_id: int, req: _Req, status: str, t: float) -> None:
    reason = "length" if status == "completed" else None
    drop = "deadline" if status == "cancelled" else None
    writer.add_request(
        RequestRecord(
            request_id=req.request_id,
            worker_id=worker_id,
            domain=req.domain,
            status=status,
            finish_reason=reason,
            drop_reason=drop,
            num_prompt_tokens=12,
            num_output_tokens=len(req.tokens),
            max_new_tokens=req.max_new_tokens,
            temperature=0.0,
            arrival_s=req.arrival_s,
            admitted_s=req.admitted_s,
            first_token_s=req.first_token_s,
            finished_s=t,
            num_rounds=req.num_rounds,
            num_target_rows=0,
            num_draft_rows=0,
            num_proposed=req.num_proposed,
            num_accepted=req.num_accepted,
            num_preemptions=0,
        )
    )
    writer.add_result(
        ResultRecord(
            request_id=req.request_id,
            status=status,
            text="x" * len(req.tokens),
            output_token_ids=req.tokens,
            finish_reason=reason,
            drop_reason=drop,
            num_prompt_tokens=12,
            num_output_tokens=len(req.tokens),
            domain=req.domain,
        )
    )


def _decode(req: _Req, k: int, rng: random.Random) -> tuple[int, int, int]:
    """(proposed, accepted, committed) for one row; the first emission is the prefill's token."""
    if req.first_token_s is None:
        return 0, 0, 1
    accepted = rng.randint(0, k)
    return k, accepted, min(accepted + 1, req.max_new_tokens - len(req.tokens))


def run_fake_worker(
    writer: ledger.PartWriter,
    worker_id: int,
    reqs: list[_Req],
    t: float,
    seed: int,
    max_k: int,
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
            writer.add_step(
                StepRecord(
                    req.request_id, worker_id, index, t_end, k, proposed, accepted, committed, len(req.tokens)
                )
            )
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
    writer.add_result(
        ResultRecord(
            "bad-0", "dropped", None, drop_reason="invalid_json", drop_message="line 11: Expecting value"
        )
    )
    writer.add_result(
        ResultRecord(
            "bad-1",
            "dropped",
            None,
            drop_reason="empty_prompt",
            drop_message="prompt is empty",
            domain="chat",
        )
    )


def write_speculative_job(job_dir: Path) -> None:
    """Two workers; worker 0 is killed, leaves a half-written part, and a second run resumes it."""
    reqs = _requests(1)
    writer = ledger.PartWriter(job_dir, 0, "run1", every_requests=1, every_s=1e9)
    _drop_invalid(writer)
    end = run_fake_worker(writer, 0, reqs[:6], 1000.0, seed=2, max_k=4, crash_after_rounds=6)
    run_fake_worker(ledger.PartWriter(job_dir, 1, "run1", 2, 1e9), 1, reqs[6:], 1000.002, 3, max_k=4)
    committed = ledger.committed_parts(job_dir)[0]
    shutil.copy(
        job_dir / "rounds" / f"{committed}.parquet", job_dir / "rounds" / "part-w00-run1-00099.parquet"
    )
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


# ------------------------------------------------- the job's rows, and each figure computed by hand


def rows(job_dir: Path, table: str) -> list[dict]:
    """Committed rows of one table, with the job_id, part and run_id the views derive."""
    out = []
    for part in ledger.committed_parts(job_dir):
        run_id = ledger.parse_part_name(part)[1]
        for row in pq.read_table(job_dir / table / f"{part}.parquet").to_pylist():
            out.append({"job_id": job_dir.name, "part": part, "run_id": run_id, **row})
    return out


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, current = 0.0, None
    for start, end in sorted(spans):
        if current is None or start > current[1]:
            total += current[1] - current[0] if current else 0.0
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0.0)


def wall_s(job_dir: Path) -> float:
    spans: dict[tuple, list[float]] = {}
    for r in rows(job_dir, "rounds"):
        start, end = r["started_s"], r["started_s"] + r["round_ms"] / 1000.0
        key = (r["run_id"], r["worker_id"])
        old = spans.get(key, [start, end])
        spans[key] = [min(old[0], start), max(old[1], end)]
    return _union_length([tuple(s) for s in spans.values()])


def expected_throughput(jobs: list[Path], baseline: str | None = None) -> list[dict]:
    out = []
    for job in jobs:
        rounds, results = rows(job, "rounds"), rows(job, "results")
        total = {
            c: sum(r[c] for r in rounds)
            for c in (
                "num_committed",
                "num_target_passes",
                "num_target_rows",
                "num_draft_rows",
                "num_draft_passes",
                "num_padded_target_rows",
                "num_padded_draft_rows",
                "num_proposed",
                "num_accepted",
                "num_kv_tokens_read",
                "kv_tokens_in_use",
                "kv_tokens_capacity",
            )
        }
        device_s = sum(r["round_ms"] for r in rounds) / 1000.0
        per_1k = {
            f"{c[4:] if c.startswith('num_') else c}_per_1k": _ratio(
                1000.0 * total[c], total["num_committed"]
            )
            for c in (
                "num_target_passes",
                "num_target_rows",
                "num_draft_passes",
                "num_draft_rows",
                "num_padded_target_rows",
                "num_padded_draft_rows",
                "num_kv_tokens_read",
            )
        }
        out.append(
            {
                "job_id": job.name,
                "num_records": len(results),
                **{
                    f"num_{s}": sum(r["status"] == s for r in results)
                    for s in ("completed", "dropped", "cancelled")
                },
                "num_rounds": len(rounds),
                "num_committed": total["num_committed"],
                "wall_s": wall_s(job),
                "device_s": device_s,
                "committed_tokens_per_s": _ratio(total["num_committed"], wall_s(job)),
                **per_1k,
                "device_s_per_1k": _ratio(1000.0 * device_s, total["num_committed"]),
                "committed_per_target_pass": _ratio(total["num_committed"], total["num_target_passes"]),
                "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                "kv_occupancy": _ratio(total["kv_tokens_in_use"], total["kv_tokens_capacity"]),
            }
        )
    base = next(r for r in out if r["job_id"] == (baseline or min(r["job_id"] for r in out)))
    for row in out:
        row["baseline_job"] = base["job_id"]
        row["speedup"] = _ratio(row["committed_tokens_per_s"], base["committed_tokens_per_s"])
        row["device_cost_ratio"] = _ratio(row["device_s_per_1k"], base["device_s_per_1k"])
        row["target_pass_ratio"] = _ratio(row["target_passes_per_1k"], base["target_passes_per_1k"])
    return out


def latency_samples(job: Path) -> dict[str, list[float]]:
    """The per-request and per-emission latencies, as the views define them, in plain Python."""
    done = {r["request_id"]: r for r in rows(job, "requests") if r["status"] == "completed"}
    samples: dict[str, list[float]] = defaultdict(list)
    for r in done.values():
        if r["admitted_s"] is not None:
            samples["queue_s"].append(r["admitted_s"] - r["arrival_s"])
        if r["first_token_s"] is not None:
            samples["ttft_s"].append(r["first_token_s"] - r["arrival_s"])
            if r["num_output_tokens"] > 1:
                samples["tpot_s"].append(
                    (r["finished_s"] - r["first_token_s"]) / (r["num_output_tokens"] - 1)
                )
        samples["completion_s"].append(r["finished_s"] - r["arrival_s"])
    emissions: dict[str, list[dict]] = defaultdict(list)
    for s in rows(job, "steps"):
        request = done.get(s["request_id"])
        if request is not None and s["run_id"] == request["run_id"] and s["num_committed"] > 0:
            emissions[s["request_id"]].append(s)
    for steps in emissions.values():
        steps.sort(key=lambda s: (s["emitted_s"], s["round_index"]))
        for i, step in enumerate(steps):
            gap = step["emitted_s"] - steps[i - 1]["emitted_s"] if i else None
            if gap is not None:
                samples["gap_per_emission_s"].append(gap)
                samples["gap_per_token_s"].append(gap)
            samples["gap_per_token_s"] += [0.0] * (step["num_committed"] - 1)
    return samples


def expected_latency(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        statuses = [r["status"] for r in rows(job, "results")]
        samples = latency_samples(job)
        for metric in (
            "queue_s",
            "ttft_s",
            "gap_per_emission_s",
            "gap_per_token_s",
            "tpot_s",
            "completion_s",
        ):
            values = np.array(samples.get(metric, []))
            stats = (
                dict(zip(("p50_s", "p90_s", "p99_s"), np.percentile(values, [50, 90, 99]), strict=True))
                if len(values)
                else dict.fromkeys(("p50_s", "p90_s", "p99_s"))
            )
            out.append(
                {
                    "job_id": job.name,
                    "metric": metric,
                    "num_samples": len(values),
                    **stats,
                    "mean_s": values.mean() if len(values) else None,
                    "max_s": values.max() if len(values) else None,
                    "num_included": statuses.count("completed"),
                    "num_left_out": len(statuses) - statuses.count("completed"),
                    "num_dropped_left_out": statuses.count("dropped"),
                    "num_cancelled_left_out": statuses.count("cancelled"),
                }
            )
    return out


def _group(items: list[dict], key) -> dict:
    groups: dict = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(sorted(groups.items()))


def expected_by_domain(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        for domain, rs in _group(rows(job, "requests"), lambda r: r["domain"]).items():
            total = {
                c: sum(r[c] for r in rs)
                for c in ("num_output_tokens", "num_proposed", "num_accepted", "num_rounds")
            }
            out.append(
                {
                    "job_id": job.name,
                    "domain": domain,
                    "num_requests": len(rs),
                    "num_completed": sum(r["status"] == "completed" for r in rs),
                    "num_output_tokens": total["num_output_tokens"],
                    "num_proposed": total["num_proposed"],
                    "num_accepted": total["num_accepted"],
                    "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                    "output_tokens_per_round": _ratio(total["num_output_tokens"], total["num_rounds"]),
                }
            )
    return out


def expected_by_position(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        steps = rows(job, "steps")
        for j in range(1, max((s["num_proposed"] for s in steps), default=0) + 1):
            proposed = [s for s in steps if s["num_proposed"] >= j]
            accepted = sum(s["num_accepted"] >= j for s in proposed)
            survived = sum(s["num_accepted"] >= j - 1 for s in proposed)
            out.append(
                {
                    "job_id": job.name,
                    "position": j,
                    "num_proposed": len(proposed),
                    "num_accepted": accepted,
                    "acceptance_rate": accepted / len(proposed),
                    "conditional_rate": _ratio(accepted, survived),
                }
            )
    return out


def expected_by_k(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        for k, ss in _group(rows(job, "steps"), lambda s: s["k"]).items():
            total = {c: sum(s[c] for s in ss) for c in ("num_proposed", "num_accepted", "num_committed")}
            out.append(
                {
                    "job_id": job.name,
                    "k": k,
                    "num_steps": len(ss),
                    **total,
                    "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                    "committed_per_step": total["num_committed"] / len(ss),
                }
            )
    return out


def expected_over_time(jobs: list[Path], num_bins: int = 20) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        if not rounds:
            continue
        t0 = min(r["started_s"] for r in rounds)
        bin_s = max(max(r["started_s"] for r in rounds) - t0, 1e-9) / num_bins
        bins = [min(int(np.floor((r["started_s"] - t0) / bin_s)), num_bins - 1) for r in rounds]
        for b, pairs in _group(list(zip(bins, rounds, strict=True)), lambda pair: pair[0]).items():
            rs = [r for _, r in pairs]
            total = {
                c: sum(r[c] for r in rs)
                for c in ("num_proposed", "num_accepted", "num_committed", "num_target_passes")
            }
            out.append(
                {
                    "job_id": job.name,
                    "time_bin": b,
                    "bin_start_s": b * bin_s,
                    "num_rounds": len(rs),
                    "num_proposed": total["num_proposed"],
                    "num_accepted": total["num_accepted"],
                    "num_committed": total["num_committed"],
                    "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                    "committed_per_target_pass": _ratio(total["num_committed"], total["num_target_passes"]),
                }
            )
    return out


def expected_drops(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        results = rows(job, "results")
        failed = [r for r in results if r["status"] != "completed"]
        groups = _group(
            failed, lambda r: (r["status"], r["drop_reason"] or r["finish_reason"] or "unspecified")
        )
        for (status, reason), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
            messages = [r["drop_message"] for r in rs if r["drop_message"] is not None]
            out.append(
                {
                    "job_id": job.name,
                    "status": status,
                    "reason": reason,
                    "num_requests": len(rs),
                    "num_output_tokens": sum(r["num_output_tokens"] for r in rs),
                    "share_of_records": len(rs) / len(results),
                    "example_message": min(messages) if messages else None,
                }
            )
    return out


def expected_worker_balance(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds, requests = rows(job, "rounds"), rows(job, "requests")
        by_worker = _group(rounds, lambda r: r["worker_id"])
        busy = {w: sum(r["round_ms"] for r in rs) / 1000.0 for w, rs in by_worker.items()}
        committed = {w: sum(r["num_committed"] for r in rs) for w, rs in by_worker.items()}
        end = {w: max(r["started_s"] + r["round_ms"] / 1000.0 for r in rs) for w, rs in by_worker.items()}
        for w in sorted(by_worker):
            mine = [r for r in requests if r["worker_id"] == w]
            out.append(
                {
                    "job_id": job.name,
                    "worker_id": w,
                    "num_requests": len(mine),
                    "num_completed": sum(r["status"] == "completed" for r in mine),
                    "num_rounds": len(by_worker[w]),
                    "num_committed": committed[w],
                    "busy_s": busy[w],
                    "busy_fraction": _ratio(busy[w], wall_s(job)),
                    "busy_vs_mean": busy[w] / (sum(busy.values()) / len(busy)),
                    "committed_share": committed[w] / sum(committed.values()),
                    "idle_at_end_s": max(end.values()) - end[w],
                }
            )
    return out


def expected_overhead(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        if not rounds:
            continue
        total = {
            c: sum(r[c] for r in rounds)
            for c in ("round_ms", "plan_ms", "prefill_ms", "draft_ms", "verify_ms", "commit_ms")
        }
        phases = ("plan", "prefill", "draft", "verify", "commit")
        out.append(
            {
                "job_id": job.name,
                "num_rounds": len(rounds),
                "round_ms": total["round_ms"],
                "plan_ms": total["plan_ms"],
                **{f"{p}_share": total[f"{p}_ms"] / total["round_ms"] for p in phases},
                "other_share": 1 - sum(total[f"{p}_ms"] for p in phases) / total["round_ms"],
                "mean_plan_ms": total["plan_ms"] / len(rounds),
                "p99_plan_ms": np.percentile([r["plan_ms"] for r in rounds], 99),
            }
        )
    return out


EXPECTED = {
    "throughput_vs_cost": expected_throughput,
    "latency": expected_latency,
    "drops": expected_drops,
    "acceptance_by_domain": expected_by_domain,
    "acceptance_by_position": expected_by_position,
    "acceptance_by_k": expected_by_k,
    "acceptance_over_time": expected_over_time,
    "worker_balance": expected_worker_balance,
    "scheduler_overhead": expected_overhead,
}


def assert_rows_equal(actual: list[dict], expected: list[dict]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert set(got) == set(want)
        for column, value in want.items():
            if isinstance(value, float | np.floating):
                assert got[column] == pytest.approx(float(value), rel=1e-9, abs=1e-12), column
            else:
                assert got[column] == value, column


# --------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def real_jobs(tmp_path_factory: pytest.TempPathFactory, tiny_pair) -> list[Path]:
    """Two small real jobs (draft-model speculation and none) run by the engine on the tiny pair."""
    from engine_helpers import random_prompts, tiny_config

    from specbatch.core import Row, SamplingParams
    from specbatch.engine.build import build_hf_engine, load_models
    from specbatch.loop import generate

    root = tmp_path_factory.mktemp("real")
    requests = random_prompts(tiny_pair[2], 12, seed=21)
    jobs = []
    for drafter in ("none", "draft"):
        config = tiny_config(tiny_pair, f"drafter.kind={drafter}", "scheduler.max_batch_rows=5")
        job_dir = root / f"real-{drafter}"
        writer = ledger.PartWriter(job_dir, 0, "run1", every_requests=4, every_s=1e9)
        engine = build_hf_engine(config, load_models(config), writer)
        generate(engine, [Row(f"r{i}", p, SamplingParams(max_new_tokens=m), ("code", "prose")[i % 2])
                          for i, (p, m) in enumerate(requests)])
        writer.flush()
        jobs.append(job_dir)
    return jobs


JOB_SETS = ["fake_jobs", "real_jobs"]  # fixtures that return job directories to report on together


@pytest.fixture(scope="module", params=JOB_SETS)
def jobs(request: pytest.FixtureRequest) -> list[Path]:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def con(jobs: list[Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = report.connect(jobs)
    yield connection
    connection.close()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_query_equals_the_figure_computed_by_hand(con, jobs: list[Path], name: str) -> None:
    by_job_id = sorted(jobs, key=lambda job: job.name)  # the queries order rows by job_id
    assert_rows_equal(report.run_query(con, name).records(), EXPECTED[name](by_job_id))


def test_every_record_is_in_results_once(con) -> None:
    duplicates = "SELECT count(*) - count(DISTINCT (job_id, request_id)) FROM results"
    assert con.execute(duplicates).fetchall() == [(0,)]


def test_views_count_only_committed_parts(fake_jobs: list[Path]) -> None:
    con, spec = report.connect(fake_jobs), fake_jobs[1]
    assert (spec / "rounds" / "part-w00-run1-00099.parquet").exists()  # the half-written part
    for table in ledger.TABLES:
        got = con.execute(f"SELECT count(*) FROM {table} WHERE job_id = 'spec-job'").fetchall()[0][0]
        assert got == len(rows(spec, table)) == ledger.read_table(spec, table).num_rows
    runs = con.execute("SELECT DISTINCT run_id FROM rounds WHERE job_id = 'spec-job' ORDER BY 1").fetchall()
    assert runs == [("run-2",), ("run1",)]


def test_baseline_job_variable(fake_jobs: list[Path]) -> None:
    result = report.run_query(report.connect(fake_jobs, baseline="spec-job"), "throughput_vs_cost")
    assert_rows_equal(result.records(), expected_throughput(fake_jobs, baseline="spec-job"))
    assert result.column("speedup")[1] == pytest.approx(1.0)
    with pytest.raises(report.ReportError, match="baseline"):
        report.connect(fake_jobs, baseline="nope")


def test_a_job_without_committed_parts_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(report.ReportError, match="no committed parts"):
        report.connect([tmp_path / "empty-job"])
    with pytest.raises(report.ReportError, match="distinct names"):
        report.connect([tmp_path / "a" / "j", tmp_path / "b" / "j"])


def _assert_not_blank(png: Path) -> None:
    from matplotlib.image import imread

    assert png.stat().st_size > 5_000, png
    pixels = imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300, png
    assert float(pixels[..., :3].std()) > 0.05, png


def test_build_report_writes_tables_plots_and_html(jobs: list[Path], tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    report_md = report.build_report(jobs, console=console, out_dir=tmp_path)
    assert report_md == tmp_path / "report.md"
    text = report_md.read_text()
    printed = console.export_text()
    for title in report.QUERIES.values():
        assert f"## {title}" in text and title in printed
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == [
        "acceptance_by_position.png",
        "latency_cdf.png",
        "round_timeline.png",
        "throughput_vs_cost.png",
    ]
    for png in pngs:
        _assert_not_blank(png)
        assert f"]({png.name})" in text
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs) and "<table>" in page


def test_report_of_a_job_with_no_rounds(tmp_path: Path) -> None:
    job = tmp_path / "all-dropped"
    writer = ledger.PartWriter(job, 0, "run1", every_requests=10, every_s=1e9)
    _drop_invalid(writer)
    writer.flush()
    report_md = report.build_report([job], console=Console(record=True, width=200))
    text = report_md.read_text()
    assert "No rows" in text
    latency = report.run_query(report.connect([job]), "latency").records()
    assert {(r["num_samples"], r["num_left_out"], r["num_dropped_left_out"]) for r in latency} == {(0, 2, 2)}
    for png in job.glob("*.png"):
        _assert_not_blank(png)


README_DUCKDB = (  # the command the README shows, with JOB for the job directory
    """duckdb -cmd "SET VARIABLE job_dir = 'JOB'" -cmd ".read specbatch/sql/views.sql" -csv -c ".read specbatch/sql/drops.sql" """
)
README_PYTHON = (  # the same without the duckdb CLI binary
    """.venv/bin/python -c "from specbatch.report import connect; con = connect(['JOB']); """
    """con.sql(open('specbatch/sql/drops.sql').read()).write_csv('/dev/stdout')" """
)
REPO = Path(__file__).resolve().parent.parent


def _drops_csv_lines(command: str, job: Path) -> list[str]:
    done = subprocess.run(
        command.replace("JOB", str(job)).replace(".venv/bin/python", sys.executable),
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()


@pytest.mark.parametrize("command", [README_PYTHON, README_DUCKDB], ids=["python", "duckdb-cli"])
def test_the_readme_command_line_works(fake_jobs: list[Path], command: str) -> None:
    if command.startswith("duckdb") and shutil.which("duckdb") is None:
        pytest.skip("no duckdb CLI binary on PATH (pip install duckdb-cli)")
    lines = _drops_csv_lines(command, fake_jobs[1])
    assert lines[0].split(",")[:4] == ["job_id", "status", "reason", "num_requests"]
    assert len(lines) - 1 == len(expected_drops(fake_jobs[1:]))
