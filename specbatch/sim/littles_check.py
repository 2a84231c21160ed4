"""The Little's-law latency model (`littles_law`) against the simulator (issue 7, item 5).

`latency_model` reads the model's components off the same cost model the simulator runs on:

    t0 = intercept + c_target_pass + k·c_draft_pass                     (ms per round, any batch)
    t1 = (1 + k)·c_target_row + kv_per_row·c_kv + draft_rows·c_draft_row (ms per request per round)
    P  = ⌈prompt / chunk⌉·(c_target_pass [+ c_draft_pass]) + prompt·(c_target_row [+ c_draft_row])

kv_per_row is the mean context a verify row attends over (prompt + half the output, rounded up to
the KV multiple); draft_rows per request per round is k plus the catch-up token after a fully
accepted block (α^k). Acceptance varies per request, so the rounds per request are N·E[1/τ(α)]
over α drawn from the acceptance model, not N/τ(E[α]). `overlay` runs the simulator (one worker,
Poisson arrivals) at each rate for a plain and a speculative config and draws both on one plot.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from specbatch.config import JobConfig
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import max_lookahead
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.arrivals import Poisson
from specbatch.sim.compare import parse_acceptance
from specbatch.sim.littles_law import LatencyModel, latency_curve, plot_latency_vs_rate, tokens_per_round
from specbatch.sim.run import SimOptions, simulate
from specbatch.sim.workload import Workload

_NUM_DRAWS = 4000  # requests drawn to estimate workload means and E[1/τ]


@dataclass
class Overlay:
    plot: Path
    models: dict[str, LatencyModel]
    points: dict[str, list[tuple[float, float]]]  # name -> (rate, simulated mean completion s)


def fixed_k(config: JobConfig) -> int:
    kind, _, k = config.scheduler.lookahead.partition(":")
    if kind != "fixed":
        raise ValueError(f"the latency model needs a fixed lookahead, got {config.scheduler.lookahead!r}")
    return min(int(k), max_lookahead(config))


def latency_model(name: str, config: JobConfig, cost: CostModel, workload: Workload, acceptance: str,
                  seed: int = 0) -> LatencyModel:
    """Little's-law components of one configuration from its cost model and workload."""
    k = fixed_k(config)
    draws = workload.draw(_NUM_DRAWS, seed)
    num_output = statistics.fmean(draws.num_output_tokens)
    prompt = statistics.fmean(draws.num_prompt_tokens)
    alphas = _alphas(acceptance, draws, seed) if k else [0.0]
    inverse_tau = statistics.fmean(1.0 / tokens_per_round(a, k) for a in alphas)
    uses_draft = config.drafter.kind == "draft" and k > 0
    multiple = config.buckets.kv_len_multiple
    kv_per_row = math.ceil((prompt + num_output / 2) / multiple) * multiple
    draft_rows = k + statistics.fmean(a**k for a in alphas) if uses_draft else 0.0
    fixed_ms = cost.intercept_ms + cost.target_passes + (k * cost.draft_passes if uses_draft else 0.0)
    per_request_ms = ((1 + k) * cost.target_rows + kv_per_row * cost.kv_tokens_read
                      + draft_rows * cost.draft_rows)
    chunk = _chunk(config)
    prefill_ms = math.ceil(prompt / chunk) * cost.target_passes + prompt * cost.target_rows
    if uses_draft:
        prefill_ms += math.ceil(prompt / chunk) * cost.draft_passes + prompt * cost.draft_rows
    return LatencyModel(name, num_output, 1.0 / inverse_tau, fixed_ms / 1000, per_request_ms / 1000,
                        prefill_ms / 1000)


def _alphas(acceptance: str, draws, seed: int) -> list[float]:
    model = parse_acceptance(acceptance, seed)
    if not isinstance(model, DomainAcceptance):
        return [model.fallback_alpha]  # a replayed job: its pooled α
    return [model.alpha(draws.request_id(i), draws.domains[draws.domain_index[i]]) for i in range(len(draws))]


def _chunk(config: JobConfig) -> int:
    kind, _, size = config.scheduler.prefill_chunk.partition(":")
    return int(size) if kind == "fixed" else config.scheduler.max_round_tokens


def overlay(
    configs: dict[str, JobConfig],
    cost: CostModel,
    workload: Workload,
    acceptance: str,
    rates: list[float],
    num_requests: int,
    out_dir: str | Path,
    seed: int = 0,
    warmup_fraction: float = 0.2,
) -> Overlay:
    """Model curves and simulated mean completion times (non-warmup requests) for each config
    (e.g. {"plain": ..., "speculative": ...}) at each Poisson rate; writes littles_law.png."""
    out_dir = Path(out_dir)
    models = {name: latency_model(name, config, cost, workload, acceptance, seed) for name, config in configs.items()}
    points: dict[str, list[tuple[float, float]]] = {}
    options = SimOptions(workers=1, warmup_fraction=warmup_fraction, step_sample_every=0, overwrite=True)
    for name, config in configs.items():
        points[name] = []
        for rate in rates:
            loaded = Workload(workload.domains, workload.prompt_len, workload.output_len, workload.max_new_tokens,
                              Poisson(rate))
            summary = simulate(config, loaded.draw(num_requests, seed), parse_acceptance(acceptance, seed),
                               out_dir / f"{name}-rate-{rate:g}", cost, options, loaded.describe())
            mean_s = summary.latency["completion_s"].mean_s
            points[name].append((rate, mean_s if mean_s is not None else math.inf))
    fine = [rates[0] + (rates[-1] - rates[0]) * i / 100 for i in range(101)] if len(rates) > 1 else rates
    curves = {name: latency_curve(model, fine) for name, model in models.items()}
    capacities = {name: model.capacity_rps for name, model in models.items()}
    title = "Mean latency vs request rate: Little's-law model (lines) and simulator (points)"
    plot = plot_latency_vs_rate(curves, out_dir / "littles_law.png", points, capacities, title)
    return Overlay(plot, models, points)
