"""A real job as simulator input: its cost model (`specbatch calibrate`), its requests, and named
cost profiles that say where their numbers come from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specbatch import ledger
from specbatch.config import JobConfig
from specbatch.sched.costmodel import CPU_DEMO_PROFILE, FEATURES, CostModel
from specbatch.sim.workload import SyntheticRequest

PROFILES: dict[str, CostModel] = {"cpu-demo": CPU_DEMO_PROFILE}


def calibrate(job_dir: str | Path) -> CostModel:
    """Fit the round-time model on a job's committed rounds (every worker, every run).

    `CostModel.fit` keeps coefficients non-negative by dropping features; when it drops the
    intercept its predictions no longer sum to the measured time (on a noisy machine they fell 20%
    short), so every coefficient is then scaled by Σ measured / Σ predicted: the model stays
    monotone and reproduces the job's total round time exactly."""
    rounds = ledger.read_table(Path(job_dir), "rounds")
    if rounds.num_rows < 2:
        raise ValueError(f"{job_dir}: {rounds.num_rows} committed rounds; need at least two to calibrate")
    fitted = CostModel.fit(rounds, source=f"calibrated on {job_dir} ({rounds.num_rows} rounds)")
    columns = rounds.to_pydict()
    features = zip(columns["num_target_passes"], _plus(columns, "num_target_rows", "num_padded_target_rows"),
                   columns["num_draft_passes"], _plus(columns, "num_draft_rows", "num_padded_draft_rows"),
                   columns["num_kv_tokens_read"], strict=True)
    predicted = [fitted.predict_ms(*row) for row in features]
    scale = sum(columns["round_ms"]) / sum(predicted) if sum(predicted) > 0 else 1.0
    if abs(scale - 1.0) < 1e-9:
        return fitted
    coefficients = {name: getattr(fitted, name) * scale for name in ("intercept_ms", *FEATURES)}
    errors = [abs(p * scale - y) / max(y, 1e-9) for p, y in zip(predicted, columns["round_ms"], strict=True)]
    return replace(fitted, **coefficients, mape=sum(errors) / len(errors),
                   source=f"{fitted.source}, scaled by {scale:.4g} to its total time")


def _plus(columns: dict[str, list], a: str, b: str) -> list[int]:
    return [x + y for x, y in zip(columns[a], columns[b], strict=True)]


def resolve_cost_model(spec: str | None, config: JobConfig | None = None) -> CostModel:
    """A named profile (`cpu-demo`), a JSON file from `specbatch calibrate`, or with no spec the
    config's `scheduler.cost_model` file, else the CPU demo profile."""
    if spec is None:
        path = config.scheduler.cost_model if config is not None else None
        return CostModel.load(Path(path)) if path else CPU_DEMO_PROFILE
    if spec in PROFILES:
        return PROFILES[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"cost model {spec!r} is neither a profile ({', '.join(PROFILES)}) nor a file")
    return CostModel.load(path)


def recorded_requests(job_dir: str | Path) -> list[SyntheticRequest]:
    """A job's requests with their real prompt and output lengths, domains, limits and arrivals.

    Arrivals are seconds after the job's first round; a request that arrived before it counts as
    arriving at 0 (it was queued when serving began). Order: real arrival, then request id. A
    request that ended by EOS or a stop string ends by EOS here; one cut by max_new_tokens or the
    context ends by length; a dropped or cancelled one is given max_new_tokens (its end is unknown).
    """
    job_dir = Path(job_dir)
    columns = ["request_id", "domain", "status", "finish_reason", "num_prompt_tokens", "num_output_tokens",
               "max_new_tokens", "arrival_s"]
    table = ledger.read_table(job_dir, "requests").select(columns).to_pylist()
    rounds = ledger.read_table(job_dir, "rounds").column("started_s").to_pylist()
    start_s = min(rounds) if rounds else min((r["arrival_s"] for r in table), default=0.0)
    out = []
    for r in sorted(table, key=lambda r: (r["arrival_s"], r["request_id"])):
        completed = r["status"] == "completed"
        ends_by_eos = completed and r["finish_reason"] in ("eos", "stop")
        num_output = r["num_output_tokens"] if completed else r["max_new_tokens"]
        out.append(SyntheticRequest(
            request_id=r["request_id"], domain=r["domain"], num_prompt_tokens=r["num_prompt_tokens"],
            max_new_tokens=r["max_new_tokens"], num_output_tokens=max(1, num_output),
            finish_reason="eos" if ends_by_eos else "length", arrival_s=max(0.0, r["arrival_s"] - start_s),
        ))
    return out
