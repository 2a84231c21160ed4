"""Wall-clock figures that the unit tests check by counts or on the simulator's virtual clock.

Timing comparisons fail on a loaded machine, so the tests count work instead; the seconds live here:

- `plan`: ms per scheduler plan with 500 and 50,000 rows waiting, per order policy (the test
  `test_waiting_queue_work_does_not_grow_with_its_length` counts the plans' work instead);
- `arrivals`: seconds to draw 1,000,000 Poisson arrivals (`test_million_poisson_arrivals_are_one_pass`);
- `sim`: a real job on the bundled pair, calibrated and replayed by the simulator: real wall time and
  mean completion time against the simulated ones, and the simulator's own host seconds
  (`test_validation_against_a_real_job` checks the replay round by round on the virtual clock).

Run:

    .venv/bin/python benchmarks/timing_bench.py [--only plan,arrivals,sim] [--requests 40] [--json F]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from specbatch import ledger
from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.sched import factory
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sim.arrivals import Poisson

ORDERS = ("fcfs", "sjf", "laps-sd", "specbatch")


def plan_ms(order: str, num_waiting: int, num_plans: int = 20) -> float:
    """Mean ms per plan with num_waiting rows waiting (8 running slots; nothing ever finishes)."""
    config = load_config(None, [f"scheduler.order={order}", "scheduler.max_batch_rows=8",
                                "scheduler.max_round_tokens=512", "scheduler.max_lookahead=4",
                                "buckets.kv_len_multiple=1"])
    scheduler = factory.make_scheduler(config, 10_000, 512, CPU_DEMO_PROFILE)
    for i in range(num_waiting):
        scheduler.add(Row(f"r{i}", list(range(2, 6)), SamplingParams(max_new_tokens=1 + i % 50), "ab"[i % 2]))
    started = time.perf_counter()
    for round_index in range(num_plans):
        scheduler.plan(float(round_index))
    return (time.perf_counter() - started) * 1000 / num_plans


def bench_plan() -> dict:
    out = {}
    for order in ORDERS:
        small, large = plan_ms(order, 500), plan_ms(order, 50_000)
        out[order] = {"plan_ms_500_waiting": small, "plan_ms_50k_waiting": large, "ratio": large / small}
        print(f"plan {order:10s} 500 waiting {small:7.3f} ms   50k waiting {large:7.3f} ms   ×{large / small:.2f}")
    return out


def bench_arrivals(n: int = 1_000_000) -> dict:
    started = time.perf_counter()
    Poisson(100.0).times(n, random.Random(0))
    seconds = time.perf_counter() - started
    print(f"arrivals {n:,} Poisson in {seconds:.3f} s")
    return {"num_arrivals": n, "seconds": seconds}


def run_real_job(job_dir: Path, num_requests: int):
    """A real job on the bundled pair (fixed:3 lookahead, one torch thread), warmed up first."""
    from specbatch.engine.build import build_hf_engine, load_models
    from specbatch.lab.prompts import heldout_prompts
    from specbatch.loop import MemoryRecorder

    config = load_config(None, ["scheduler.max_batch_rows=6", "scheduler.lookahead=fixed:3",
                                "capacity.max_context=256", "models.num_threads=1"])
    models = load_models(config)
    prompts = heldout_prompts(models.tokenizer, num_requests + 4, 32, seed=11)
    warmup = build_hf_engine(config, models, MemoryRecorder())
    for prompt in prompts[num_requests:]:
        warmup.add(prompt.to_row())
    warmup.run()
    writer = ledger.PartWriter(job_dir, 0, "real", every_requests=10**6, durable=False)
    engine = build_hf_engine(config, models, writer)
    for prompt in prompts[:num_requests]:
        engine.add(prompt.to_row())
    engine.run()
    writer.flush()
    return config


def bench_sim(num_requests: int) -> dict:
    from specbatch.lab.calibrate import calibrate
    from specbatch.sim.acceptance import ReplayAcceptance
    from specbatch.sim.run import simulate
    from specbatch.sim.workload import recorded_requests

    with tempfile.TemporaryDirectory() as tmp:
        real = Path(tmp) / "real"
        config = run_real_job(real, num_requests)
        rounds = ledger.read_table(real, "rounds").to_pylist()
        real_wall_s = (max(r["started_s"] + r["round_ms"] / 1000 for r in rounds)
                       - min(r["started_s"] for r in rounds))
        done = [r for r in ledger.read_table(real, "requests").to_pylist() if r["status"] == "completed"]
        real_completion_s = statistics.fmean(r["finished_s"] - r["arrival_s"] for r in done)
        cost = calibrate(real)
        summary = simulate(config, recorded_requests(real), ReplayAcceptance.from_job(real), Path(tmp) / "sim", cost)
    completion = summary.latency["completion_s"].mean_s
    assert summary.wall_s is not None and completion is not None, "the simulated job completed no request"
    out = {"num_requests": num_requests, "num_rounds": len(rounds), "cost_model_mape": cost.mape,
           "real_wall_s": real_wall_s, "sim_wall_s": summary.wall_s, "wall_ratio": summary.wall_s / real_wall_s,
           "real_mean_completion_s": real_completion_s,
           "sim_mean_completion_s": completion, "completion_ratio": completion / real_completion_s,
           "sim_host_s": summary.host_s}
    print(f"sim wall {summary.wall_s:.3f} s vs real {real_wall_s:.3f} s (×{out['wall_ratio']:.3f}); mean completion "
          f"×{out['completion_ratio']:.3f}; the simulation took {summary.host_s:.3f} s of host time")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="plan,arrivals,sim", help="comma-separated: plan, arrivals, sim")
    parser.add_argument("--requests", type=int, default=40, help="requests of the real job (sim)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"plan", "arrivals", "sim"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    results = {}
    if "plan" in parts:
        results["plan"] = bench_plan()
    if "arrivals" in parts:
        results["arrivals"] = bench_arrivals()
    if "sim" in parts:
        results["sim"] = bench_sim(args.requests)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
