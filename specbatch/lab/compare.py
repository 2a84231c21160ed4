"""`specbatch simulate`: the same requests under several policies, one simulated job each, then
the comparison report.

A policy spec is `/`-separated tokens applied to the config's `scheduler` section: bare tokens fill
order, lookahead and prefill_chunk in that order (an empty token keeps the config's value), and
`key=value` sets any other scheduler field:

    sjf    fcfs/fixed:0    laps-sd/adaptive    fcfs//deadline    fcfs/fixed:4/fixed:64/max_batch_rows=64

Every job sees the same requests (same seed, same draws) and the same per-request acceptance
draws, so differences between jobs are the policies' own.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from specbatch.config import ConfigError, JobConfig, apply_overrides, config_to_dict, validate_config
from specbatch.report import build_report
from specbatch.sched.costmodel import CostModel
from specbatch.sched.factory import resolve_cost_model
from specbatch.sim.acceptance import AcceptanceModel, DomainAcceptance, ReplayAcceptance
from specbatch.sim.arrivals import ArrivalProcess, Offline, parse_arrival
from specbatch.sim.run import SimOptions, simulate
from specbatch.sim.summary import SimSummary
from specbatch.sim.workload import DomainMix, LogNormalLength, Workload

log = logging.getLogger(__name__)

POLICY_FIELDS = ("order", "lookahead", "prefill_chunk")
DEFAULT_ACCEPTANCE = "code=0.8:20,prose=0.55:10"  # illustrative: per-domain mean α and Beta concentration
DEFAULT_CONCENTRATION = 20.0


@dataclass
class PolicyStudy:
    job_dirs: list[Path]
    summaries: dict[str, SimSummary]  # policy spec -> summary
    comparison_md: Path
    report_md: Path | None


def policy_config(config: JobConfig, spec: str) -> JobConfig:
    """`config` with the policy spec applied to its scheduler section (validated)."""
    overrides, position = [], 0
    for token in spec.split("/"):
        key, eq, value = token.partition("=")
        if eq:
            overrides.append(f"scheduler.{key.strip()}={value.strip()}")
            continue
        if position >= len(POLICY_FIELDS):
            raise ConfigError(f"policy {spec!r}: more than {len(POLICY_FIELDS)} positional parts")
        if token.strip():
            overrides.append(f"scheduler.{POLICY_FIELDS[position]}={token.strip()}")
        position += 1
    return validate_config(apply_overrides(config_to_dict(config), overrides), f"policy {spec!r}")


def policy_slug(spec: str) -> str:
    """A job directory name for a policy spec."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec.replace("/", "_")).strip("-") or "default"


def parse_acceptance(spec: str, seed: int = 0) -> AcceptanceModel:
    """`replay:JOB_DIR` (that job's per-request histories), `ALPHA` for every domain, or
    `DOMAIN=MEAN[:CONCENTRATION],...` (per-request α ~ Beta with that mean; `*` is the default)."""
    spec = spec.strip()
    if spec.startswith("replay:"):
        return ReplayAcceptance.from_job(spec.removeprefix("replay:"))
    domains: dict[str, tuple[float, float]] = {}
    for part in spec.split(","):
        name, eq, params = part.partition("=")
        if not eq:
            name, params = "*", part
        mean, _, concentration = params.partition(":")
        try:
            domains[name.strip()] = (float(mean), float(concentration or DEFAULT_CONCENTRATION))
        except ValueError:
            expected = "DOMAIN=MEAN[:CONCENTRATION],... or replay:JOB_DIR"
            raise ValueError(f"acceptance {spec!r}: expected {expected}") from None
    return DomainAcceptance(domains, seed=seed)


def default_workload(config: JobConfig, arrival: ArrivalProcess | None = None) -> Workload:
    """Half code, half prose; prompts lognormal (median 128), outputs to EOS lognormal (median 48),
    cut at the config's max_new_tokens. Illustrative, declared in every job's simulation.json."""
    max_prompt = max(1, (config.capacity.max_context or 4096) // 2)
    return Workload(
        domains=DomainMix((("code", 0.5), ("prose", 0.5))),
        prompt_len=LogNormalLength(128, 0.8, max_prompt),
        output_len=LogNormalLength(48, 0.8),
        max_new_tokens=config.sampling.max_new_tokens,
        arrival=arrival or Offline(),
    )


def simulate_policies(
    config: JobConfig,
    num_requests: int,
    arrival: str | ArrivalProcess,
    policies: list[str],
    workers: int,
    out_dir: str | Path,
    seed: int = 0,
    workload: Workload | None = None,
    acceptance: str = DEFAULT_ACCEPTANCE,
    cost_model: str | CostModel | None = None,
    options: SimOptions | None = None,
    report: bool = True,
    console: Console | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> PolicyStudy:
    """One simulated job per policy under out_dir (job `sim-<policy>`), then comparison.md/json
    and, with `report`, the comparison report (build_report over the jobs, first as baseline).

    `cost_model` (a profile name, a calibrated JSON file or a CostModel; default: the config's) is
    the simulated fleet's round time, and also what its schedulers believe unless the config names
    its own `scheduler.cost_model`. `progress(policy, accounted, total)` follows each job."""
    if not policies:
        raise ValueError("no policies given")
    out_dir = Path(out_dir)
    arrival = parse_arrival(arrival) if isinstance(arrival, str) else arrival
    workload = workload or default_workload(config, arrival)
    workload = Workload(workload.domains, workload.prompt_len, workload.output_len, workload.max_new_tokens, arrival)
    requests = workload.draw(num_requests, seed)
    cost = cost_model if isinstance(cost_model, CostModel) else resolve_cost_model(cost_model, config)
    options = replace(options or SimOptions(), workers=workers, overwrite=True)
    scheduler_cost = None if config.scheduler.cost_model else cost
    job_dirs, summaries = [], {}
    for spec in policies:
        job_config = policy_config(config, spec).model_copy(update={"seed": seed})
        job_dir = out_dir / f"sim-{policy_slug(spec)}"
        description = f"policy {spec}; {workload.describe()}; acceptance {acceptance}; seed {seed}"
        on_progress = (lambda done, total, spec=spec: progress(spec, done, total)) if progress else None
        summaries[spec] = simulate(job_config, requests, parse_acceptance(acceptance, seed), job_dir, cost, options,
                                   description, scheduler_cost, on_progress)
        job_dirs.append(job_dir)
        log.info("%s: %d completed, wall %.4g s", spec, summaries[spec].num_completed, summaries[spec].wall_s)
    comparison_md = write_comparison(out_dir, summaries)
    report_md = build_report(job_dirs, baseline=job_dirs[0].name, console=console, out_dir=out_dir) if report else None
    return PolicyStudy(job_dirs, summaries, comparison_md, report_md)


COMPARISON_COLUMNS = ("policy", "job", "completed", "dropped", "cancelled", "wall_s", "tokens_per_s",
                      "mean_completion_s", "p99_completion_s", "mean_ttft_s", "p99_ttft_s", "mean_queue_s")


def comparison_rows(summaries: dict[str, SimSummary]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for spec, s in summaries.items():
        completion, ttft, queue = (s.latency[m] for m in ("completion_s", "ttft_s", "queue_s"))
        values = (spec, Path(s.job_dir).name, s.num_completed, s.num_dropped, s.num_cancelled, s.wall_s,
                  s.committed_tokens_per_s, completion.mean_s, completion.p99_s, ttft.mean_s, ttft.p99_s, queue.mean_s)
        rows.append(dict(zip(COMPARISON_COLUMNS, values, strict=True)))
    return rows


def write_comparison(out_dir: Path, summaries: dict[str, SimSummary]) -> Path:
    """comparison.json (full summaries) and comparison.md (one row per policy; latency figures
    over completed, non-warmup requests)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.json").write_text(json.dumps({k: s.to_dict() for k, s in summaries.items()}, indent=2))
    rows = comparison_rows(summaries)
    fmt = lambda v: "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(COMPARISON_COLUMNS) + " |", "|" + "---|" * len(COMPARISON_COLUMNS)]
    lines += ["| " + " | ".join(fmt(row[c]) for c in COMPARISON_COLUMNS) + " |" for row in rows]
    path = out_dir / "comparison.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def estimate_capacity_rps(
    config: JobConfig,
    workload: Workload,
    acceptance: str,
    cost: CostModel,
    num_requests: int = 2000,
    workers: int = 1,
    seed: int = 0,
) -> float:
    """Completed requests per second when `num_requests` arrive at once (the saturated rate), for
    sizing Poisson loads as fractions of capacity."""
    offline = Workload(workload.domains, workload.prompt_len, workload.output_len, workload.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        summary = simulate(config, offline.draw(num_requests, seed), parse_acceptance(acceptance, seed),
                           Path(tmp) / "capacity", cost, SimOptions(workers=workers, step_sample_every=0))
    return summary.num_completed / summary.wall_s
