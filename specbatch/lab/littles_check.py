"""The Little's-law latency model (`littles_law`) against the simulator (issue 7, item 5).

`fit_latency_model` fits the model's components on a job's ledger (a real job, or a simulated
one), by least squares over its rounds:

    round_ms ≈ t0 + t1 · num_decode_rows + c_p · num_prefill_tokens

t0 is the load-independent round time, t1 what each batched request adds (its verify and draft
rows, its share of KV reads and padding as they really fell), and P = c_p · mean prompt tokens a
request's prefill. From the requests table: N = mean output tokens and R = mean rounds per
request, so τ = N / R (this folds the spread of per-request acceptance into R = N·E[1/τ]).

`overlay` runs the simulator (one worker, Poisson arrivals) at each rate for each configuration,
fits each configuration's components on the rounds and requests of all its runs (so the curves
test the queueing model, not the cost model), and draws the model's curves and the simulated
mean completion times on one plot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from specbatch import ledger
from specbatch.config import JobConfig
from specbatch.lab.compare import estimate_capacity_rps, parse_acceptance
from specbatch.lab.littles_law import LatencyModel, latency_curve, plot_latency_vs_rate
from specbatch.sched.costmodel import CostModel
from specbatch.sim.arrivals import Poisson
from specbatch.sim.run import SimOptions, simulate
from specbatch.sim.workload import Workload

DEFAULT_LOADS = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)


@dataclass
class Overlay:
    plot: Path
    models: dict[str, LatencyModel]
    points: dict[str, list[tuple[float, float]]]  # name -> (rate, simulated mean completion s)


def fit_latency_model(name: str, job_dirs: list[Path]) -> LatencyModel:
    """Little's-law components of one configuration from the rounds and completed requests of
    its jobs (pooled)."""
    rounds = pa.concat_tables([ledger.read_table(d, "rounds") for d in job_dirs]).to_pydict()
    requests = pa.concat_tables([ledger.read_table(d, "requests") for d in job_dirs]).to_pylist()
    done = [r for r in requests if r["status"] == "completed"]
    if len(rounds["round_ms"]) < 3 or not done:
        raise ValueError(f"{name}: too few rounds or completed requests to fit")
    x = np.column_stack([np.ones(len(rounds["round_ms"])), rounds["num_decode_rows"], rounds["num_prefill_tokens"]])
    solution, *_ = np.linalg.lstsq(x, np.asarray(rounds["round_ms"], dtype=float), rcond=None)
    t0, t1, per_prefill_token = (max(float(c), 0.0) for c in solution)
    num_output = float(np.mean([r["num_output_tokens"] for r in done]))
    num_rounds = float(np.mean([r["num_rounds"] for r in done]))
    prompt = float(np.mean([r["num_prompt_tokens"] for r in done]))
    prefill_s = per_prefill_token * prompt / 1000
    return LatencyModel(name, num_output, num_output / num_rounds, t0 / 1000, t1 / 1000, prefill_s)


def overlay(
    configs: dict[str, JobConfig],
    cost: CostModel,
    workload: Workload,
    acceptance: str,
    rates: list[float] | None,
    num_requests: int,
    out_dir: str | Path,
    seed: int = 0,
    warmup_fraction: float = 0.2,
) -> Overlay:
    """Simulated mean completion times (non-warmup requests) for each config (e.g. {"plain": ...,
    "speculative": ...}) at each Poisson rate, and the model fitted on those runs; writes
    littles_law.png into out_dir. Rates default to 10%..95% of the first config's saturated
    throughput (`estimate_capacity_rps`)."""
    out_dir = Path(out_dir)
    if not rates:
        capacity = estimate_capacity_rps(next(iter(configs.values())), workload, acceptance, cost, seed=seed)
        rates = [capacity * f for f in DEFAULT_LOADS]
    models: dict[str, LatencyModel] = {}
    points: dict[str, list[tuple[float, float]]] = {}
    options = SimOptions(workers=1, warmup_fraction=warmup_fraction, step_sample_every=0, overwrite=True)
    for name, config in configs.items():
        points[name], job_dirs = [], []
        for rate in rates:
            loaded = Workload(workload.domains, workload.prompt_len, workload.output_len, workload.max_new_tokens,
                              Poisson(rate))
            job_dirs.append(out_dir / f"{name}-rate-{rate:g}")
            summary = simulate(config, loaded.draw(num_requests, seed), parse_acceptance(acceptance, seed),
                               job_dirs[-1], cost, options, loaded.describe())
            mean_s = summary.latency["completion_s"].mean_s
            points[name].append((rate, mean_s if mean_s is not None else math.inf))
        models[name] = fit_latency_model(name, job_dirs)
    fine = [max(rates) * 1.05 * i / 200 for i in range(201)]
    curves = {name: latency_curve(model, fine) for name, model in models.items()}
    capacities = {name: model.capacity_rps for name, model in models.items()}
    title = "Mean latency vs request rate: Little's-law model (lines) and simulator (points)"
    plot = plot_latency_vs_rate(curves, out_dir / "littles_law.png", points, capacities, title)
    return Overlay(plot, models, points)
