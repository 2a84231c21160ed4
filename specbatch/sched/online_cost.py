"""The round-time model refitted on a worker's own rounds while it runs (`scheduler.learn_cost`).

A prior cost model (the built-in CPU profile, or a calibrated file) can be far from the machine a
job runs on, and a lookahead policy that believes drafts are cheap keeps drafting at a loss. Every
`refit_every` rounds (once the draft cost is known, every eighth of the rounds seen, and no more often
than keeps refits within `max_refit_share` of the rounds' time, up to half a window) the
coefficients are fitted again on the last `window` rounds, by relative-error
least squares with non-negative coefficients as in `CostModel.fit`, shrunk toward the prior by
`prior_rounds` pseudo-rounds per coefficient so that a few rounds cannot swing it. A refit that
predicts the window worse than the model in use (mean relative error) is not taken.

Two fits, because one cannot tell them apart: while every round drafts once, a draft pass is as
constant as the intercept. The draft model's passes are timed apart: the drafting phase
(`draft_ms`) and the draft cache filled beside a prefill (`draft_prefill_ms`). Its passes and rows
are fitted on those timings alone, and the rest of the round (`round_ms` less both) on the target's
features. Both kinds are needed: at batch 1 a drafting phase of k passes computes k + lag − 1 rows,
so passes and rows rise together and only a fill (one pass over a whole prompt) tells them apart; a
fit on drafting phases alone once priced a row at 0.6 ms, a 135-token fill then cost more than its
whole round, and the target's share of that round came out negative. Rounds that did not draft say
nothing about drafting, so the last `draft_window` draft timings are kept apart from the window, and
until `min_draft_rounds` of them are drafting phases the draft coefficients are not known
(`knows_draft_cost`: the adaptive policy probes), unless the prior was timed on the draft model in
use (`CostModel.measured_draft`, `pass_profile.py`). Rounds that captured graphs are left out.

Drafting by lookup (n-gram, suffix) is host time in the same drafting phase: its rows and the tokens
its indexes took (`num_lookup_rows`, `num_indexed_tokens`) are two more draft features, fitted on the
same timings, from the prior's values (a lookup has nothing to probe: the policy's own drafts time it).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from specbatch.records import RoundRecord
from specbatch.sched.costmodel import CostModel, nonnegative_lstsq

TARGET = ("intercept_ms", "target_passes", "target_rows", "kv_tokens_read", "wide_kv_tokens_read")
DRAFT = ("draft_passes", "draft_rows", "lookup_rows", "lookup_tokens")


class _DraftTiming(NamedTuple):
    """One timed run of drafting: a round's drafting phase, or the fill beside its prefill."""

    passes: float
    rows: float
    lookup_rows: float
    indexed_tokens: float
    ms: float
    drafting: float  # 1 for a drafting phase that ran the draft model, else 0


# columns of the window: the target's features (the intercept's is 1; padding counts as work), the
# drafting's (draft model: drafting phase and fill together; lookups), then the round's time and drafting's in it
TARGET_FEATURES, FEATURES, ROUND_MS, DRAFT_MS = slice(0, 5), slice(0, 9), 9, 10
DRAFT_FEATURES, DRAFT_TIMING_MS = slice(0, 4), 4


@dataclass
class OnlineCostFit:
    prior: CostModel
    window: int = 256
    refit_every: int = 8
    prior_rounds: float = 0.1
    draft_window: int = 64
    min_draft_rounds: int = 4
    # a refit's price inside the engine (two fits and two window errors: 0.65-0.7 ms here), and the share of
    # the rounds' time refits may take once the draft cost is known: every 8 rounds took ~3% of a 1-row job
    # of the bundled pair, whose rounds take ~1 ms, and 0.6% of SmolLM2's
    refit_ms: float = 0.7
    max_refit_share: float = 0.01
    draft_model: bool = True  # whether drafting runs a model to measure (n-gram lookup runs no draft pass)
    current: CostModel = field(init=False)
    drafted: deque[_DraftTiming] = field(init=False)
    num_seen: int = field(default=0, init=False)
    _next_refit: int = field(default=0, init=False)  # num_seen at the next refit
    _rounds: np.ndarray = field(init=False, repr=False)  # a ring of the last `window` rounds' rows
    _fitted_on_drafted: int = field(default=0, init=False)  # drafting phases the current model saw
    _num_draft_timings: int = field(default=0, init=False)  # timings ever appended to `drafted`
    # the draft coefficients' last fit, and `_num_draft_timings` then: rounds that did not draft leave
    # the draft window as it was, so a gate's plain rounds refit the target's coefficients alone
    _draft_fit: tuple[int, dict[str, float]] = field(default=(-1, {}), init=False)

    def __post_init__(self) -> None:
        self.current, self._next_refit = self.prior, self.refit_every
        self._rounds, self.drafted = np.zeros((self.window, 11)), deque(maxlen=self.draft_window)

    @property
    def rounds(self) -> np.ndarray:
        """The window: one row per round, the columns above (a ring, in no particular order)."""
        return self._rounds[: min(self.num_seen, self.window)]

    def observe(self, record: RoundRecord, num_draft_prefill_positions: int,
                draft_prefill_ms: float = 0.0) -> CostModel | None:
        """Take one round (and the draft rows its prefill computed in `draft_prefill_ms`, inside its
        draft figures and its prefill time); returns the refitted model when this round triggered a
        refit that was taken."""
        if record.warmup_ms > 0 or record.round_ms <= 0:
            return None
        fill_passes = int(num_draft_prefill_positions > 0)
        draft_positions = record.num_draft_rows + record.num_padded_draft_rows
        lookups = (record.num_lookup_rows, record.num_indexed_tokens)
        self._rounds[self.num_seen % self.window] = (
            1.0, record.num_target_passes, record.num_target_rows + record.num_padded_target_rows,
            record.num_kv_tokens_read, record.num_wide_kv_tokens_read, record.num_draft_passes, draft_positions,
            *lookups, record.round_ms, record.draft_ms + draft_prefill_ms)
        if fill_passes:
            self.drafted.append(_DraftTiming(fill_passes, num_draft_prefill_positions, 0, 0, draft_prefill_ms, 0.0))
            self._num_draft_timings += 1
        model_passes = record.num_draft_passes - fill_passes
        if model_passes > 0 or record.num_lookup_rows > 0:
            self.drafted.append(_DraftTiming(model_passes, draft_positions - num_draft_prefill_positions, *lookups,
                                             record.draft_ms, float(model_passes > 0)))
            self._num_draft_timings += 1
        self.num_seen += 1
        if self.num_seen < self._next_refit:
            return None
        interval = 0
        if self.knows_draft_cost:
            interval = min(self.window // 2, max(self.num_seen // 8, self._priced_interval()))
        self._next_refit = self.num_seen + max(self.refit_every, interval)
        refitted = self.fit()
        if refitted.mape is not None and refitted.mape > self.window_error(self.current):
            return None
        self.current = refitted
        # once known it stays known: fills beside prefills may later push every drafting phase out of
        # the draft window, and the fit on them still prices both coefficients
        self._fitted_on_drafted = max(self._fitted_on_drafted, int(sum(timing.drafting for timing in self.drafted)))
        return self.current

    def _priced_interval(self) -> int:
        """Rounds between refits for their time to be `max_refit_share` of the rounds' (the window's mean)."""
        mean_round_ms = float(self.rounds[:, ROUND_MS].mean())
        return math.ceil(self.refit_ms / (self.max_refit_share * mean_round_ms)) if mean_round_ms > 0 else 0

    @property
    def knows_draft_cost(self) -> bool:
        """Whether the current model's draft coefficients were fitted on enough rounds that drafted
        (until then they, and the target's per-row price that drafting's longer passes reveal, are
        the prior's); from the start where no draft model runs."""
        return (not self.draft_model or self.prior.measured_draft
                or self._fitted_on_drafted >= self.min_draft_rounds)

    def fit(self) -> CostModel:
        values = {name: getattr(self.current, name) for name in (*TARGET, *DRAFT)}
        if self.drafted:
            if self._draft_fit[0] != self._num_draft_timings:
                drafted = np.asarray(self.drafted, dtype=float)
                self._draft_fit = (self._num_draft_timings,
                                   self._ridge(DRAFT, drafted[:, DRAFT_FEATURES], drafted[:, DRAFT_TIMING_MS]))
            values.update(self._draft_fit[1])
        window = self.rounds
        target_ms = np.maximum(window[:, ROUND_MS] - window[:, DRAFT_MS], 1e-3)
        values.update(self._ridge(TARGET, window[:, TARGET_FEATURES], target_ms))
        model = replace(self.prior, **values, num_rounds=len(self.rounds),
                        source=f"{self.prior.source}, refitted on {len(self.rounds)} of this worker's rounds")
        return replace(model, mape=self.window_error(model))

    def window_error(self, model: CostModel) -> float:
        """Mean relative error of a model's round times on the window."""
        window = self.rounds
        predicted = window[:, FEATURES] @ np.asarray([getattr(model, name) for name in (*TARGET, *DRAFT)])
        return float(np.mean(np.abs(predicted - window[:, ROUND_MS]) / window[:, ROUND_MS]))

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
