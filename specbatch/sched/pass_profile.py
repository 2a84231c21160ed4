"""Round costs measured on the model in use: timed passes, the cost model fitted on them, and the
speedup that model allows (issue 43). No torch: the timing itself is `engine/cost_profile.py`.

At job start a worker times passes of the shapes the job will run: target verify passes of 1..k + 1
positions at the row counts it batches (at two KV lengths, which tell attention's price from a
row's, for rows of one position and of several: the kernel prices their KV apart, `costmodel.py`),
and the draft model's steps and one fill. `PassProfile.fit` turns those timings into the
`CostModel` every policy reads, by relative least squares with non-negative coefficients as
`CostModel.fit` does on whole rounds:

    target pass ≈ c_tp + c_tr·rows·query_len + c_kv·rows·kv_len + c_wkv·[query_len > 1]·rows·kv_len
    draft pass  ≈ c_dp + c_dr·positions

A pass timing has no round around it (planning, commit, acceptance): the fitted intercept is 0 and
the online fit (`online_cost.py`) learns it from the job's rounds, starting from a model whose draft
costs are known (`CostModel.measured`), so nothing probes. The profile is cached on disk by the
key of what was measured (model fingerprint, dtype, device, machine, threads, graph mode, shapes):
`$SPECBATCH_CACHE_DIR/costs/KEY.json` (default `~/.cache/specbatch`), a plain `CostModel` JSON that
`specbatch simulate --cost-model` reads as it is, and `KEY.passes.json` beside it, the timings.

The speedup a round could have had (`speedup_limit`): with per-row acceptance α_i and caps, the
largest k K (the verify pass pads every row to 1 + K), each row at min(K, cap_i),

    limit = max_K  (Σ_i E(α_i, min(K, cap_i)) / n) / (T(K) / T(0)),   E(α, k) = (1 − α^(k+1)) / (1 − α),

T the model's decode time of the batch (draft rows and passes included where a draft model drafts).
At α = 1 it bounds what any drafter could do: where it is ≤ 1 no α pays, and nothing is tried.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specbatch.sched.costmodel import CostModel, nonnegative_lstsq
from specbatch.sched.roundcost import DecodeShape, RoundCostModel

if TYPE_CHECKING:
    from specbatch.core import RoundPlan
    from specbatch.sched.context import SchedContext

CACHE_ENV = "SPECBATCH_CACHE_DIR"


@dataclass(frozen=True)
class PassTiming:
    """One timed forward pass, its shape after padding."""

    role: str  # "target" (a verify-shaped pass) or "draft" (a draft step or fill)
    num_rows: int  # batch rows computed, padding included
    query_len: int  # positions per row, padding included
    kv_len: int  # KV positions attended per row
    ms: float

    @property
    def num_positions(self) -> int:
        return self.num_rows * self.query_len

    @property
    def wide_kv_tokens_read(self) -> int:
        """KV positions read by rows of several positions (`CostModel.wide_kv_tokens_read`)."""
        return self.num_rows * self.kv_len if self.query_len > 1 else 0


@dataclass
class PassProfile:
    """The timings of one model (pair) on one machine, and what identifies them."""

    key: str
    timings: list[PassTiming] = field(default_factory=list)
    description: str = ""  # model, dtype, device in words (the model's `source`)

    def fit(self, fallback: CostModel | None = None) -> CostModel:
        """The cost model of these timings (intercept 0: a pass has no round around it); without draft
        timings (an EAGLE head is not timed) the draft coefficients are `fallback`'s, else 0; a lookup's
        host time (no pass to time) is `fallback`'s, the online fit's start."""
        target = [t for t in self.timings if t.role == "target"]
        draft = [t for t in self.timings if t.role == "draft"]
        if not target:
            raise ValueError("a pass profile needs target timings")
        x = np.asarray([(1.0, t.num_positions, t.num_rows * t.kv_len, t.wide_kv_tokens_read) for t in target])
        target_passes, target_rows, kv_tokens_read, wide_kv_tokens_read = _relative_fit(
            x, np.asarray([t.ms for t in target]))
        draft_passes, draft_rows = (fallback.draft_passes, fallback.draft_rows) if fallback else (0.0, 0.0)
        if draft:
            x = np.asarray([(1.0, t.num_positions) for t in draft])
            draft_passes, draft_rows = _relative_fit(x, np.asarray([t.ms for t in draft]))
        model = CostModel(0.0, target_passes, target_rows, draft_passes, draft_rows, kv_tokens_read,
                          num_rounds=0, source=f"measured: {self.description or self.key}",
                          measured_draft=bool(draft), measured_target=True,
                          lookup_rows=fallback.lookup_rows if fallback else 0.0,
                          lookup_tokens=fallback.lookup_tokens if fallback else 0.0,
                          wide_kv_tokens_read=wide_kv_tokens_read)
        return replace(model, mape=self.error(model))

    def error(self, model: CostModel) -> float:
        """Mean relative error of a model's pass times on these timings."""
        errors = [abs(pass_ms(model, t) - t.ms) / t.ms for t in self.timings if t.ms > 0]
        return float(np.mean(errors)) if errors else 0.0

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "description": self.description,
                           "timings": [asdict(t) for t in self.timings]}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PassProfile:
        data = json.loads(text)
        return cls(data["key"], [PassTiming(**t) for t in data["timings"]], data.get("description", ""))


def pass_ms(model: CostModel, timing: PassTiming) -> float:
    """A model's time for one pass of the timing's shape."""
    if timing.role == "draft":
        return model.draft_passes + model.draft_rows * timing.num_positions
    return (model.target_passes + model.target_rows * timing.num_positions
            + model.kv_tokens_read * timing.num_rows * timing.kv_len
            + model.wide_kv_tokens_read * timing.wide_kv_tokens_read)


def _relative_fit(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Non-negative least squares of y on x minimising relative error (rows scaled by 1/y)."""
    weights = 1.0 / np.maximum(y, 1e-6)
    return [float(c) for c in nonnegative_lstsq(x * weights[:, None], y * weights)]


def cache_dir() -> Path:
    """Where measured profiles are kept: $SPECBATCH_CACHE_DIR/costs, else ~/.cache/specbatch/costs."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specbatch"
    return Path(root) / "costs"


def cached_profile(key: str, directory: Path | None = None) -> PassProfile | None:
    path = (directory or cache_dir()) / f"{key}.passes.json"
    try:
        profile = PassProfile.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, or unreadable: measured again
    return profile if profile.key == key else None


def save_profile(profile: PassProfile, directory: Path | None = None, fallback: CostModel | None = None) -> Path:
    """Write the timings and the fitted model (`KEY.json`, a `CostModel`); returns the model's path."""
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    model_path = directory / f"{profile.key}.json"
    for path, text in ((directory / f"{profile.key}.passes.json", profile.to_json()),
                       (model_path, json.dumps(asdict(profile.fit(fallback)), indent=2) + "\n")):
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)  # concurrent workers write the same content: the last rename wins
    return model_path


def speedup_limit(round_cost: RoundCostModel, alphas: list[float], caps: list[int], starts: list[int],
                  model_rows: list[bool] | None = None) -> tuple[float, int]:
    """(limit, best K): the speedup over plain decoding the model and the rows' α allow at the best
    largest k (module docstring), `starts` the rows' first query positions; (1.0, 0) where no K beats
    plain decoding. `model_rows[i]`: row i's drafts come from a draft model (its rows and passes
    priced; lag 1), else from a lookup (its host time priced, its index current). The search stops
    once the speedup has fallen twice in a row, as the policy's does: tokens are concave in K and
    the time about affine, so their ratio peaks once (every round computes this, for the ledger)."""
    num_rows = len(alphas)
    if not num_rows or max(caps, default=0) == 0:
        return 1.0, 0
    model_rows = model_rows if model_rows is not None else [True] * num_rows
    plain = DecodeShape.plain(starts)
    plain_ms, max_start, sum_start = round_cost.decode_ms(plain), plain.max_start, plain.sum_start
    best, best_k = 1.0, 0
    # α_i^K (0 past the row's cap: it adds nothing), and Σ_i E(α_i, min(K, cap_i)) summed in row order
    powers, tokens = [1.0] * num_rows, float(num_rows)
    model_caps = [cap for cap, model in zip(caps, model_rows, strict=True) if model]
    reaching_k = num_rows - caps.count(0)  # rows whose cap reaches K, from K = 1
    num_model = len(model_caps) - model_caps.count(0)  # those of them drafting with a model
    num_lookup, models_reaching_k = reaching_k - num_model, num_model
    sum_model, sum_all = 0, 0  # the model rows' drafts at K, every row's
    wide_starts = [start for start, cap in zip(starts, caps, strict=True) if cap >= 1]  # rows verifying drafts
    num_wide, sum_wide_start = len(wide_starts), sum(wide_starts)
    previous, num_worse = 1.0, 0
    for k_max in range(1, max(caps) + 1):  # list-wise: every round computes this, for the ledger
        powers = [power * alpha if cap >= k_max else 0.0
                  for power, alpha, cap in zip(powers, alphas, caps, strict=True)]
        tokens = sum(powers, tokens)
        sum_all, sum_model = sum_all + reaching_k, sum_model + models_reaching_k
        reaching_k, models_reaching_k = reaching_k - caps.count(k_max), models_reaching_k - model_caps.count(k_max)
        shape = DecodeShape(num_rows, max_start, k_max, num_model, 1 if num_model else 0, sum_model, sum_start,
                            sum_all, num_model, num_lookup, num_wide=num_wide, sum_wide_start=sum_wide_start)
        speedup = tokens / num_rows * plain_ms / round_cost.decode_ms(shape)
        if speedup > best:
            best, best_k = speedup, k_max
        num_worse, previous = (num_worse + 1 if speedup < previous else 0), speedup
        if num_worse == 2:
            break
    return best, best_k


def forecast_round(ctx: SchedContext, plan: RoundPlan, caps: list[int]) -> None:
    """Write on the plan what the model says of its decode rows (`caps`: theirs): their time at k = 0,
    at the planned ks, and the limit their measured α (not its optimistic bound) allowed."""
    if not plan.decode:
        return
    rows, ks = [row for row, _ in plan.decode], [k for _, k in plan.decode]
    round_cost = ctx.round_cost
    plan.plain_ms = plan.predicted_ms = round_cost.decode_ms(DecodeShape.of(rows, [0] * len(rows)))
    plan.limit_speedup = 1.0
    if not any(caps):  # no row may draft (no drafter, or every row at its last token): plain decoding's round
        return
    models = [ctx.drafts_with_model(row) for row in rows]
    if any(ks):
        plan.predicted_ms = round_cost.decode_ms(DecodeShape.of(rows, ks, models, [ctx.index_lag(row) for row in rows]))
    plan.limit_speedup, _ = speedup_limit(round_cost, [min(ctx.alpha(row), 1.0) for row in rows], caps,
                                          [row.num_computed for row in rows], models)


def no_alpha_pays(round_cost: RoundCostModel, starts: list[int], max_k: int, uses_draft_model: bool,
                  margin: float = 0.0) -> bool:
    """Whether even drafts that are always accepted (α = 1) cannot beat plain decoding by more than
    `margin` for rows starting at `starts`. (With free drafts a linear model always lets α = 1 tie:
    (k + 1) tokens for at most (k + 1)x the time; what decides is whether it wins by a margin.)"""
    limit, _ = speedup_limit(round_cost, [1.0] * len(starts), [max_k] * len(starts), starts,
                             [uses_draft_model] * len(starts))
    return limit <= 1.0 + margin
