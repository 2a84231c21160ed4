"""Round time from the work a round does, fitted by least squares from `rounds` ledger rows.

    round_ms ≈ c0 + c_tp·target_passes + c_tr·target_rows + c_dp·draft_passes + c_dr·draft_rows
               + c_kv·kv_tokens_read + c_wkv·wide_kv_tokens_read + c_lr·lookup_rows + c_lt·lookup_tokens

`wide_kv_tokens_read` is the share of the KV read by rows of more than one position (verify rows
with drafts, prefill chunks). The paged kernel (`engine/kernels/paged_attention.c`) lays a row of one
position across head dimensions and a longer row across lanes, and the two cost differently per KV
position: on the bundled pair a verify row of 3 positions read its KV at 2.5-4x a plain row's
(issue 43), which one KV coefficient priced at 1.3x, and it priced plain rounds ~60% too high.

Rows include padding (padded positions cost as much as real ones). Drafting by lookup (n-gram, suffix)
runs no pass but is host time all the same: c_lr per row it drafts for and c_lt per token it adds to
a row's index (a suffix drafter indexes a row's whole prompt the first time the row drafts). Fitted
without them, a real job's lookups cost nothing in its simulation. Fitted on whole rounds, as here,
they take a little of the verify pass they precede: 0.07-0.12 ms a row on the bundled pair at 1 row,
where their drafting phase measured 0.05 (the online fit, `online_cost.py`, fits them on that phase
alone; a job of a few lookup rounds cannot: two such rounds priced an indexed token at 0.08 ms and
left nothing for the rest of any round). Coefficients are kept
non-negative (a feature whose fitted cost is negative is dropped and the rest refitted) so the
model is monotone in every input: the deadline prefill policy binary-searches over it.

The fit minimizes *relative* error, Σ ((pred − y) / y)², i.e. least squares on rows scaled by 1/y:
policies compare ratios of predicted times and the model's error is reported as MAPE, so a 2 ms
round mispredicted by 2 ms matters as much as a 200 ms round mispredicted by 200 ms. Rounds slowed
by something outside the job (another process on the cores) are outliers: after a first fit, rounds
whose relative error exceeds max(50 %, 5 × the median) are left out of a second fit (the reported
MAPE still counts every round).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

FEATURES = ("target_passes", "target_rows", "draft_passes", "draft_rows", "kv_tokens_read", "wide_kv_tokens_read",
            "lookup_rows", "lookup_tokens")


@dataclass(frozen=True)
class CostModel:
    intercept_ms: float
    target_passes: float
    target_rows: float
    draft_passes: float
    draft_rows: float
    kv_tokens_read: float
    mape: float | None = None  # mean absolute percentage error on the rounds it was fitted on
    num_rounds: int = 0
    source: str = ""  # where the numbers come from
    # its draft coefficients were timed on the draft model in use (`sched/pass_profile.py`): nothing
    # needs to probe drafting to learn its price
    measured_draft: bool = False
    # host time of drafting by lookup (n-gram, suffix): per row drafted for, per token indexed
    lookup_rows: float = 0.0
    lookup_tokens: float = 0.0
    wide_kv_tokens_read: float = 0.0  # added to kv_tokens_read for KV read by rows of several positions
    # its target coefficients were timed on the target model in use (`sched/pass_profile.py`)
    measured_target: bool = False

    @property
    def measured_coefficients(self) -> tuple[str, ...]:
        """The coefficients timed on the models in use (`sched/pass_profile.py`), not guessed."""
        target = ("target_passes", "target_rows", "kv_tokens_read", "wide_kv_tokens_read")
        draft = ("draft_passes", "draft_rows")
        return (target if self.measured_target else ()) + (draft if self.measured_draft else ())

    def lookup_ms(self, num_rows: float, num_indexed_tokens: float) -> float:
        return self.lookup_rows * num_rows + self.lookup_tokens * num_indexed_tokens

    def predict_ms(self, target_passes: int, target_rows: int, draft_passes: int = 0, draft_rows: float = 0,
                   kv_tokens_read: int = 0, wide_kv_tokens_read: int = 0) -> float:
        return (self.intercept_ms + self.target_passes * target_passes + self.target_rows * target_rows
                + self.draft_passes * draft_passes + self.draft_rows * draft_rows
                + self.kv_tokens_read * kv_tokens_read + self.wide_kv_tokens_read * wide_kv_tokens_read)

    def predict_rounds(self, rounds: pa.Table) -> np.ndarray:
        """Predicted time of each round of a `rounds` ledger table."""
        return round_features(rounds) @ np.asarray([self.intercept_ms, *(getattr(self, f) for f in FEATURES)])

    @classmethod
    def fit(cls, rounds: pa.Table, source: str = "") -> CostModel:
        design = round_features(rounds)
        y = np.asarray(rounds.column("round_ms").to_pylist(), dtype=float)
        if len(y) < 2:
            raise ValueError("need at least two rounds to fit a cost model")
        weights = 1.0 / np.maximum(y, 1e-3)
        coefficients = nonnegative_lstsq(design * weights[:, None], y * weights)
        relative = np.abs(design @ coefficients - y) * weights
        typical = typical_rounds(relative)
        if 2 <= typical.sum() < len(y):
            coefficients = nonnegative_lstsq(design[typical] * weights[typical, None], y[typical] * weights[typical])
            relative = np.abs(design @ coefficients - y) * weights
        intercept, *values = coefficients.tolist()
        return cls(intercept, **dict(zip(FEATURES, values, strict=True)), mape=float(np.mean(relative)),
                   num_rounds=len(y), source=source)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> CostModel:
        return cls(**json.loads(Path(path).read_text()))


def round_features(rounds: pa.Table) -> np.ndarray:
    """[rounds, 1 + FEATURES]: a column of ones (the intercept), then each feature of each round
    (padding counted as work; a ledger from before wide KV reads or lookups were recorded reads 0 there)."""
    columns = rounds.to_pydict()

    def col(name: str) -> np.ndarray:
        values = columns.get(name) or [0] * rounds.num_rows
        return np.asarray([value or 0 for value in values], dtype=float)

    return np.column_stack([
        np.ones(rounds.num_rows),
        col("num_target_passes"),
        col("num_target_rows") + col("num_padded_target_rows"),
        col("num_draft_passes"),
        col("num_draft_rows") + col("num_padded_draft_rows"),
        col("num_kv_tokens_read"),
        col("num_wide_kv_tokens_read"),
        col("num_lookup_rows"),
        col("num_indexed_tokens"),
    ])


def typical_rounds(relative_errors: np.ndarray) -> np.ndarray:
    """The rounds a fit keeps (module docstring): relative error at most max(50 %, 5 × the median).
    The rest were slowed by something outside the job, or by a first round's cold start."""
    return relative_errors <= max(0.5, 5 * float(np.median(relative_errors)))


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient ≥ 0: drop the most negative feature, refit, repeat."""
    active = list(range(x.shape[1]))
    while True:
        solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (solution >= 0).all() or len(active) == 1:
            full = np.zeros(x.shape[1])
            full[active] = np.clip(solution, 0, None)
            return full
        active.pop(int(np.argmin(solution)))


# Measured on the bundled demo pair by the policy suite's calibration sweep (1 torch thread, times in
# process CPU time on a shared 2-core machine, MAPE 6.7 %); a starting point for policies until a
# job's own rounds are fitted (`specbatch calibrate`).
CPU_DEMO_PROFILE = CostModel(
    intercept_ms=3.7, target_passes=2.8, target_rows=0.19, draft_passes=2.3, draft_rows=0.043,
    kv_tokens_read=0.002, mape=0.067, source="bundled demo pair, CPU, 1 thread (bench_policies calibration)",
    # lookups: guesses of the right order, refitted on the run (issue 43: indexing 32 instruct prompts at
    # depth 24 took 0.25-0.5 s of a SmolLM2 job; a row's lookup is a few suffix-index walks or an n-gram scan)
    lookup_rows=0.05, lookup_tokens=0.02,
)
