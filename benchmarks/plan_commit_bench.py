"""The scheduler's and commit step's host time per round, on the simulator (the scheduler, commit
step and round records are the real ones; only the model passes are simulated): plan, commit and
the whole step (the simulated passes' bookkeeping included) in µs a round, per batch size and
lookahead. On a real engine these are the host's share of every round, whatever the model: at 1 row
the bundled pair's passes take ~0.5-0.8 ms, on a GPU less.

Host timings: noisy on a shared machine (run it several times, compare medians, not single runs;
for an A/B across revisions, alternate `PYTHONPATH=TREE` processes).

    .venv/bin/python benchmarks/plan_commit_bench.py [--batch-sizes 1,8,32,128] [--requests 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.loop import MemoryRecorder
from specbatch.sched.costmodel import CPU_DEMO_PROFILE
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.worker import build_sim_engine

LOOKAHEADS = ("fixed:0", "fixed:2", "adaptive")


def job_us(lookahead: str, batch_rows: int, num_requests: int, seed: int = 0) -> tuple[float, float, float, int]:
    """(plan, commit, whole step) in µs a round, and the rounds, of one job of num_requests requests."""
    config = load_config(None, [f"scheduler.max_batch_rows={batch_rows}", "capacity.max_context=512",
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
    started = time.perf_counter()
    engine.run()
    step_us = (time.perf_counter() - started) * 1e6
    rounds = recorder.rounds
    return (sum(r.plan_ms for r in rounds) * 1e3 / len(rounds), sum(r.commit_ms for r in rounds) * 1e3 / len(rounds),
            step_us / len(rounds), len(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32,128")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for batch_rows in map(int, args.batch_sizes.split(",")):
        for lookahead in LOOKAHEADS:
            runs = [job_us(lookahead, batch_rows, args.requests) for _ in range(args.repeats)]
            plan, commit, step = (statistics.median(run[i] for run in runs) for i in range(3))
            print(f"rows {batch_rows:4d}  {lookahead:9s} rounds {runs[0][3]:5d}  µs a round: plan {plan:7.1f}  "
                  f"commit {commit:7.1f}  step {step:7.1f}  (median of {args.repeats})", flush=True)


if __name__ == "__main__":
    main()
