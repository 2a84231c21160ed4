"""Planning and commit time at batch 128 on the simulator (the scheduler and commit step are the real
ones; only the model passes are simulated): Σ plan_ms and Σ commit_ms over a job's rounds, per lookahead.

Host timings: noisy on a shared machine (run it several times, compare medians, not single runs).

    .venv/bin/python benchmarks/plan_commit_bench.py [--requests 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics

from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.loop import MemoryRecorder
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.worker import build_sim_engine


def job_ms(lookahead: str, num_requests: int, seed: int = 0) -> tuple[float, float, int]:
    """(Σ plan_ms, Σ commit_ms, rounds) of one batch-128 job of num_requests requests."""
    config = load_config(None, ["scheduler.max_batch_rows=128", "capacity.max_context=512",
                                f"scheduler.lookahead={lookahead}", "drafter.kind=draft"])
    rng = random.Random(seed)
    rows = [Row(f"r{i}", [2 + rng.randrange(500) for _ in range(rng.randint(20, 120))],
                SamplingParams(max_new_tokens=rng.randint(16, 128)), "code") for i in range(num_requests)]
    outputs = {row.request_id: (row.params.max_new_tokens, False) for row in rows}
    recorder = MemoryRecorder()
    engine, _ = build_sim_engine(config, CPU_DEMO_PROFILE, DomainAcceptance({"*": (0.7, 20.0)}, seed=1), outputs,
                                 recorder)
    for row in rows:
        engine.add(row)
    engine.run()
    rounds = recorder.rounds
    return sum(r.plan_ms for r in rounds), sum(r.commit_ms for r in rounds), len(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for lookahead in ("fixed:0", "fixed:2", "adaptive"):
        runs = [job_ms(lookahead, args.requests) for _ in range(args.repeats)]
        plan, commit = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"{lookahead:9s} rounds {runs[0][2]:5d}  plan {plan:8.1f} ms  commit {commit:8.1f} ms  "
              f"(median of {args.repeats})")


if __name__ == "__main__":
    main()
