"""`specbatch calibrate`: the round-time cost model fitted on a real job's rounds, for the simulator
and for the scheduler's own predictions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specbatch import ledger
from specbatch.sched.costmodel import FEATURES, CostModel


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
