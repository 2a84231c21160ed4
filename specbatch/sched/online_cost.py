"""The round-time model refitted on a worker's own rounds while it runs (`scheduler.learn_cost`).

A prior cost model (the built-in CPU profile, or a calibrated file) can be far from the machine a
job runs on, and a lookahead policy that believes drafts are cheap keeps drafting at a loss. Every
`refit_every` rounds the coefficients are fitted again on the last `window` rounds, with the same
relative-error least squares and non-negative coefficients as `CostModel.fit`, shrunk toward the
prior by `prior_rounds` pseudo-rounds per coefficient (so a few rounds cannot swing it). A feature
the window never saw non-zero (draft passes while nothing drafts) keeps its last value: rounds that
did not draft say nothing about what drafting costs. Rounds that captured graphs are left out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CostModel, nonnegative_lstsq

COEFFICIENTS = ("intercept_ms", "target_passes", "target_rows", "draft_passes", "draft_rows", "kv_tokens_read")


def round_features(record: RoundRecord) -> tuple[float, ...]:
    """A round's cost features in COEFFICIENTS order (1 for the intercept); padding counts as work."""
    return (1.0, record.num_target_passes, record.num_target_rows + record.num_padded_target_rows,
            record.num_draft_passes, record.num_draft_rows + record.num_padded_draft_rows,
            record.num_kv_tokens_read)


@dataclass
class OnlineCostFit:
    prior: CostModel
    window: int = 256
    refit_every: int = 8
    prior_rounds: float = 4.0
    current: CostModel = field(init=False)
    rounds: deque[tuple[tuple[float, ...], float]] = field(init=False)
    num_seen: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.current = self.prior
        self.rounds = deque(maxlen=self.window)

    def observe(self, record: RoundRecord) -> CostModel | None:
        """Take one round; returns the refitted model when this round triggered a refit."""
        if record.warmup_ms > 0 or record.round_ms <= 0:
            return None
        self.rounds.append((round_features(record), record.round_ms))
        self.num_seen += 1
        if self.num_seen % self.refit_every:
            return None
        self.current = self.fit()
        return self.current

    def fit(self) -> CostModel:
        x = np.asarray([features for features, _ in self.rounds], dtype=float)
        y = np.asarray([ms for _, ms in self.rounds], dtype=float)
        last = np.asarray([getattr(self.current, name) for name in COEFFICIENTS])
        prior = np.asarray([getattr(self.prior, name) for name in COEFFICIENTS])
        seen = np.flatnonzero((x != 0).any(axis=0))
        # rows scaled by 1/y: relative error; a coefficient's pseudo-rounds weigh a deviation by what it
        # changes in a typical round's relative prediction (its feature's mean over the round's time)
        weights = 1.0 / np.maximum(y, 1e-3)
        design = x[:, seen] * weights[:, None]
        target = y * weights  # unseen features are 0 in every round: they add nothing to it
        scale = np.sqrt(self.prior_rounds) * (np.abs(x[:, seen]) * weights[:, None]).mean(axis=0)
        design = np.vstack([design, np.diag(scale)])
        target = np.concatenate([target, scale * prior[seen]])
        fitted = last.copy()
        fitted[seen] = nonnegative_lstsq(design, target)
        relative = np.abs(x @ fitted - y) * weights
        values = dict(zip(COEFFICIENTS, fitted.tolist(), strict=True))
        return replace(self.prior, **values, mape=float(relative.mean()), num_rounds=len(y),
                       source=f"{self.prior.source} refitted on {len(y)} of this worker's rounds")
