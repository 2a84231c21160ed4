"""The round-time model refitted on a worker's own rounds while it runs (`scheduler.learn_cost`).

A prior cost model (the built-in CPU profile, or a calibrated file) can be far from the machine a
job runs on, and a lookahead policy that believes drafts are cheap keeps drafting at a loss. Every
`refit_every` rounds the coefficients are fitted again on the last `window` rounds, by relative-error
least squares with non-negative coefficients as in `CostModel.fit`, shrunk toward the prior by
`prior_rounds` pseudo-rounds per coefficient so that a few rounds cannot swing it.

Two fits, because one cannot tell them apart: while every round drafts once, a draft pass is as
constant as the intercept. The drafting phase is timed apart (`draft_ms`): its passes and rows are
fitted on it alone, and the rest of the round (`round_ms − draft_ms`, less the draft prefill that
the draft fit now prices) on the target's features. Rounds that did not draft say nothing about
drafting, so the last `draft_window` rounds that drafted are kept apart from the window, and until
`min_draft_rounds` of them exist the draft coefficients are not known (`knows_draft_cost`: the
adaptive policy probes). Rounds that captured graphs are left out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CostModel, nonnegative_lstsq

TARGET = ("intercept_ms", "target_passes", "target_rows", "kv_tokens_read")
DRAFT = ("draft_passes", "draft_rows")


class _Round(NamedTuple):
    """One round's features as a flat row of numbers, so that a window of them is one array."""

    intercept: float  # 1: the intercept's feature
    target_passes: float
    target_rows: float  # padding counts as work
    kv_tokens_read: float
    draft_passes: float  # of the drafting phase
    draft_rows: float
    prefill_draft_passes: float  # of the draft cache filled alongside the prefill
    prefill_draft_rows: float
    round_ms: float
    draft_ms: float


# columns of a window of _Round rows
TARGET_FEATURES, DRAFTING, DRAFT_PREFILL, ROUND_MS, DRAFT_MS = slice(0, 4), slice(4, 6), slice(6, 8), 8, 9


@dataclass
class OnlineCostFit:
    prior: CostModel
    window: int = 256
    refit_every: int = 8
    prior_rounds: float = 0.1
    draft_window: int = 64
    min_draft_rounds: int = 4
    current: CostModel = field(init=False)
    rounds: deque[_Round] = field(init=False)
    drafted: deque[_Round] = field(init=False)
    num_seen: int = field(default=0, init=False)
    _fitted_on_drafted: int = field(default=0, init=False)  # drafted rounds the current model saw

    def __post_init__(self) -> None:
        self.current = self.prior
        self.rounds, self.drafted = deque(maxlen=self.window), deque(maxlen=self.draft_window)

    def observe(self, record: RoundRecord, num_draft_prefill_rows: int) -> CostModel | None:
        """Take one round (and the draft rows its prefill computed, inside its draft figures); returns
        the refitted model when this round triggered a refit."""
        if record.warmup_ms > 0 or record.round_ms <= 0:
            return None
        prefill_passes = int(num_draft_prefill_rows > 0)
        self.rounds.append(_Round(
            1.0, record.num_target_passes, record.num_target_rows + record.num_padded_target_rows,
            record.num_kv_tokens_read, record.num_draft_passes - prefill_passes,
            record.num_draft_rows + record.num_padded_draft_rows - num_draft_prefill_rows,
            prefill_passes, num_draft_prefill_rows, record.round_ms, record.draft_ms))
        if self.rounds[-1].draft_passes > 0:
            self.drafted.append(self.rounds[-1])
        self.num_seen += 1
        if self.num_seen % self.refit_every:
            return None
        self.current, self._fitted_on_drafted = self.fit(), len(self.drafted)
        return self.current

    @property
    def knows_draft_cost(self) -> bool:
        """Whether the current model's draft coefficients were fitted on enough rounds that drafted
        (until then they, and the target's per-row price that drafting's longer passes reveal, are
        the prior's)."""
        return self._fitted_on_drafted >= self.min_draft_rounds

    def fit(self) -> CostModel:
        values = {name: getattr(self.current, name) for name in (*TARGET, *DRAFT)}
        if self.drafted:
            drafted = np.asarray(self.drafted, dtype=float)
            values.update(self._ridge(DRAFT, drafted[:, DRAFTING], drafted[:, DRAFT_MS]))
        window = np.asarray(self.rounds, dtype=float)
        target, drafting, draft_prefill = window[:, TARGET_FEATURES], window[:, DRAFTING], window[:, DRAFT_PREFILL]
        round_ms, draft_ms = window[:, ROUND_MS], window[:, DRAFT_MS]
        draft_price = np.asarray([values[name] for name in DRAFT])
        values.update(self._ridge(TARGET, target, np.maximum(round_ms - draft_ms - draft_prefill @ draft_price, 1e-3)))
        predicted = target @ np.asarray([values[name] for name in TARGET]) + (drafting + draft_prefill) @ draft_price
        return replace(self.prior, **values, mape=float(np.mean(np.abs(predicted - round_ms) / round_ms)),
                       num_rounds=len(self.rounds),
                       source=f"{self.prior.source}, refitted on {len(self.rounds)} of this worker's rounds")

    def _ridge(self, names: tuple[str, ...], x: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Non-negative relative least squares of y on x, with prior_rounds pseudo-rounds per seen
        coefficient: a deviation weighs what it changes in a typical round's relative prediction."""
        seen = np.flatnonzero((x != 0).any(axis=0))
        weights = 1.0 / np.maximum(y, 1e-3)
        scaled = x[:, seen] * weights[:, None]
        scale = np.sqrt(self.prior_rounds) * np.abs(scaled).mean(axis=0)
        prior = np.asarray([getattr(self.prior, names[i]) for i in seen])
        solution = nonnegative_lstsq(np.vstack([scaled, np.diag(scale)]),
                                     np.concatenate([y * weights, scale * prior]))
        return {names[i]: float(value) for i, value in zip(seen, solution, strict=True)}
