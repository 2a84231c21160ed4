"""simulate(): reproducible jobs, every request accounted, reports unchanged, and validation
against a real job on the tiny pair."""

from __future__ import annotations

import io
import itertools
import json
import math
import statistics

import pyarrow.compute as pc
import pytest
from engine_helpers import random_prompts, tiny_config
from rich.console import Console

from specbatch import ledger
from specbatch.config import PrefillChunkSpec, load_config
from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.lab.calibrate import calibrate
from specbatch.lab.compare import parse_acceptance, policy_config, simulate_policies
from specbatch.lab.littles_check import overlay
from specbatch.loop import MemoryRecorder
from specbatch.report import build_report
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sim.acceptance import DomainAcceptance, ReplayAcceptance
from specbatch.sim.arrivals import Poisson
from specbatch.sim.run import SimOptions, simulate
from specbatch.sim.workload import DomainMix, LogNormalLength, UniformLength, Workload, recorded_requests

HOST_COLUMNS = {"plan_ms", "commit_ms"}  # real measurements of the scheduler and commit code


def small_config(*overrides: str):
    return load_config(None, ["capacity.max_context=512", "scheduler.max_batch_rows=8", "buckets.kv_len_multiple=16",
                              "sampling.max_new_tokens=32", *overrides])


def workload(rate: float = 40.0) -> Workload:
    return Workload(DomainMix((("code", 0.5), ("prose", 0.5))), LogNormalLength(40, 0.7, 600),
                    UniformLength(1, 40), 32, Poisson(rate))


def acceptance() -> DomainAcceptance:
    return DomainAcceptance({"code": (0.8, 20.0), "prose": (0.5, 10.0)}, seed=1)


def test_same_seed_gives_identical_jobs(tmp_path):
    config = small_config("scheduler.lookahead=fixed:3")
    options = SimOptions(workers=2, deadline_s=3.0, warmup_fraction=0.1)
    tables = []
    for name in ("a", "b"):
        simulate(config, workload().draw(150, seed=7), acceptance(), tmp_path / name, options=options)
        tables.append({t: ledger.read_table(tmp_path / name, t) for t in ledger.TABLES})
    for table in ledger.TABLES:
        a, b = (t[table].drop([c for c in HOST_COLUMNS if c in t[table].column_names]) for t in tables)
        assert a.num_rows > 0 and a.equals(b), table


def test_every_request_accounted(tmp_path):
    """Too-long prompts, KV-impossible requests and deadline cancellations are all recorded."""
    config = small_config("capacity.kv_tokens=300")
    requests = Workload(DomainMix((("code", 1.0),)), UniformLength(1, 700), UniformLength(1, 40), 32,
                        Poisson(200.0)).draw(300, seed=3)
    summary = simulate(config, requests, acceptance(), tmp_path / "job",
                       options=SimOptions(workers=3, deadline_s=0.5, warmup_fraction=0.2, max_waiting_per_worker=4))
    results = ledger.read_table(tmp_path / "job", "results")
    assert results.num_rows == len(requests) == summary.num_accounted
    assert len(set(results.column("request_id").to_pylist())) == len(requests)
    statuses = results.column("status").to_pylist()
    assert statuses.count("completed") == summary.num_completed > 0
    assert statuses.count("dropped") == summary.num_dropped > 0
    assert statuses.count("cancelled") == summary.num_cancelled > 0
    assert set(summary.reasons) == {"prompt_too_long", "exceeds_kv_capacity", "deadline"}
    warmup = [m for m in results.column("metadata").to_pylist() if m and json.loads(m).get("sim_warmup")]
    assert len(warmup) == summary.num_warmup == 60
    requests_table = ledger.read_table(tmp_path / "job", "requests")
    assert set(requests_table.column("worker_id").to_pylist()) == {0, 1, 2}
    assert summary.latency["completion_s"].count <= summary.num_completed


def test_report_and_policy_comparison(tmp_path):
    config = small_config()
    study = simulate_policies(config, 120, "poisson:30", ["fcfs", "sjf/fixed:0"], workers=2, out_dir=tmp_path,
                              seed=2, workload=workload(), acceptance="code=0.8:20,prose=0.5:10",
                              options=SimOptions(step_sample_every=3), console=Console(file=io.StringIO()))
    assert [d.name for d in study.job_dirs] == ["sim-fcfs", "sim-sjf_fixed-0"]
    assert study.report_md is not None and study.report_md.exists()
    assert "sim-sjf_fixed-0" in study.comparison_md.read_text()
    plain = ledger.read_table(study.job_dirs[1], "rounds")
    assert pc.sum(plain.column("num_proposed")).as_py() == 0
    steps = ledger.read_table(study.job_dirs[0], "steps")
    sampled = set(steps.column("request_id").to_pylist())
    assert 0 < len(sampled) <= 40  # every third request's steps
    assert build_report([study.job_dirs[0]], console=Console(file=io.StringIO())).exists()


def test_policy_specs_and_acceptance_specs():
    config = small_config()
    assert policy_config(config, "laps-sd/adaptive/deadline").scheduler.prefill_chunk == PrefillChunkSpec("deadline")
    assert policy_config(config, "fcfs//fixed:64/max_batch_rows=4").scheduler.max_batch_rows == 4
    with pytest.raises(ValueError):
        policy_config(config, "nope")
    assert parse_acceptance("0.7").domains == {"*": (0.7, 20.0)}
    assert parse_acceptance("code=0.9:5,*=0.5").domains == {"code": (0.9, 5.0), "*": (0.5, 20.0)}


def run_real_job(pair, job_dir, num_requests: int, *overrides: str):
    """The real engine on the tiny pair, warmed up, then recorded through PartWriter like a worker."""
    config = tiny_config(pair, *overrides)
    models = load_models(config)
    warmup = build_hf_engine(config, models, MemoryRecorder())
    for i, (prompt, max_new) in enumerate(random_prompts(pair[2], 4, seed=99)):
        warmup.add(Row(f"w{i}", prompt, SamplingParams(max_new_tokens=max_new)))
    warmup.run()
    writer = ledger.PartWriter(job_dir, 0, "real", every_requests=10**6, durable=False)
    engine = build_hf_engine(config, models, writer)
    for i, (prompt, max_new) in enumerate(random_prompts(pair[2], num_requests, seed=11)):
        engine.add(Row(f"r{i:03d}", prompt, SamplingParams(max_new_tokens=max_new), domain="code"))
    engine.run()
    writer.flush()
    return config


WORK_COLUMNS = ("num_batch_rows", "num_decode_rows", "num_prefill_rows", "num_prefill_tokens", "num_target_rows",
                "num_padded_target_rows", "num_draft_rows", "num_padded_draft_rows", "num_target_passes",
                "num_draft_passes", "num_proposed", "num_accepted", "num_committed", "num_kv_tokens_read",
                "num_wide_kv_tokens_read")


def round_work(job_dir) -> list[dict]:
    rounds = ledger.read_table(job_dir, "rounds").to_pylist()
    return [{c: r[c] for c in WORK_COLUMNS} for r in sorted(rounds, key=lambda r: r["round_index"])]


def finishing_rounds(job_dir) -> dict[str, int]:
    """The round in which each request emitted its last token."""
    last: dict[str, int] = {}
    for step in ledger.read_table(job_dir, "steps").select(["request_id", "round_index"]).to_pylist():
        last[step["request_id"]] = max(last.get(step["request_id"], 0), step["round_index"])
    return last


def test_validation_against_a_real_job(tiny_pair, tmp_path, one_thread):
    """Calibrated on a real job, replaying its acceptance and lengths, the simulator does the real
    job's work round by round and finishes each request in the same round; so on its virtual clock
    the wall time and each completion time are the calibrated model's times of the real rounds.
    Counts and the virtual clock, never wall-clock comparisons (they fail on a loaded machine): the
    real-vs-simulated wall-clock check is in benchmarks/timing_bench.py."""
    overrides = ("scheduler.max_batch_rows=6", "scheduler.lookahead=fixed:3", "capacity.max_context=256")
    config = run_real_job(tiny_pair, tmp_path / "real", 40, *overrides)
    done = [r for r in ledger.read_table(tmp_path / "real", "requests").to_pylist() if r["status"] == "completed"]
    cost = calibrate(tmp_path / "real")
    summary = simulate(config, recorded_requests(tmp_path / "real"), ReplayAcceptance.from_job(tmp_path / "real"),
                       tmp_path / "sim", cost)
    assert summary.num_completed == len(done) == 40
    real_rounds = round_work(tmp_path / "real")
    assert round_work(tmp_path / "sim") == real_rounds
    assert finishing_rounds(tmp_path / "sim") == finishing_rounds(tmp_path / "real")
    round_end_s = list(itertools.accumulate(cost.predict_ms(
        r["num_target_passes"], r["num_target_rows"] + r["num_padded_target_rows"], r["num_draft_passes"],
        r["num_draft_rows"] + r["num_padded_draft_rows"], r["num_kv_tokens_read"], r["num_wide_kv_tokens_read"]) / 1000
        for r in real_rounds))
    assert math.isclose(summary.wall_s, round_end_s[-1], rel_tol=1e-9), (summary.wall_s, round_end_s[-1])
    real_completion = statistics.fmean(round_end_s[i] for i in finishing_rounds(tmp_path / "real").values())
    sim_completion = summary.latency["completion_s"].mean_s
    assert math.isclose(sim_completion, real_completion, rel_tol=1e-9), (sim_completion, real_completion)


def test_littles_law_overlay(tmp_path):
    base = ("scheduler.max_batch_rows=16", "sampling.max_new_tokens=24")
    configs = {"plain": small_config(*base, "scheduler.lookahead=fixed:0"),
               "speculative": small_config(*base, "scheduler.lookahead=fixed:3")}
    result = overlay(configs, CPU_DEMO_PROFILE, workload(), "code=0.8:20,prose=0.5:10", [2.0, 8.0], 200, tmp_path)
    assert result.plot.exists()
    for name, model in result.models.items():
        rate, simulated = result.points[name][0]  # low load: the mean-value model holds well
        assert math.isclose(model.mean_latency_s(rate), simulated, rel_tol=0.25), (name, model, simulated)
    assert result.models["speculative"].tokens_per_round > 1.5 > result.models["plain"].tokens_per_round
