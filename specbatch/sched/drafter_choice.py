"""Which drafter each row drafts with, where a job has several (`drafter.kind: suffix,ngram,draft`).

Per row and round, before the lookahead policy sizes k, each configured drafter d is valued by what
it would add to the row's committed tokens at the price plain decoding sets (λ₀ = rows per ms of a
plain round of these rows), at the row's best k within its cap:

    gain_d = max_k  E(α_d, k) − 1 − λ₀ · (c_dr · (k − 1 + lag) + c_dp · k / n)     for a draft model,
    gain_d = E(α_d, cap) − 1 − λ₀ · (c_lr + c_lt · index lag / h)                    for a lookup,

with α_d the row's acceptance under d (its own rounds with d, shrunk toward the job's rounds with d in
its domain, shrunk toward the prior) at its upper confidence bound, so that a drafter the row has not
tried is tried; c_dr and c_dp a draft row's and a draft pass's price (a pass shared by the batch's n
rows), the row's draft-cache lag spread over `switch_horizon` rounds (h); c_lr and c_lt a lookup's host
time per row and per token its index catches up on (`SchedContext.index_lag`). The best gain wins (ties: the
first configured). Verify positions cost the same whichever drafter filled them (the round-time model
charges every row to the largest k), so they do not enter the choice; whether the row drafts at all,
and how far, stays the lookahead policy's, which
then reads the chosen drafter's α (`DrafterAlphas.alpha`) and prices draft-model work only for
rows that use the model (`SchedContext.drafts_with_model`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from specbatch.core import Row
from specbatch.sched.estimates import AlphaTracker, expected_tokens, shrunk_alpha
from specbatch.sched.roundcost import DecodeShape, RoundCostModel, draft_lag


@dataclass
class _Counts:
    num_accepted: int = 0
    num_rejections: int = 0

    @property
    def num_samples(self) -> int:
        return self.num_accepted + self.num_rejections


@dataclass
class DrafterAlphas(AlphaTracker):
    """α per row *and drafter*: counted at commit (`observe_drafts`) under the drafter the row drafted
    with, job-wide per (domain, drafter); a row's α is that of its current drafter (`Row.drafter`).
    Estimates are kept until the next commit counts drafts (as `AlphaTracker` keeps its own)."""

    kinds: tuple[str, ...] = ()  # the configured drafters, in order
    model_kinds: frozenset[str] = frozenset()  # those that run a model
    job_prior_weight: float = 8.0
    _job: dict[tuple[str, str], _Counts] = field(default_factory=dict)  # (domain, kind)
    _own: dict[tuple[str, str], _Counts] = field(default_factory=dict)  # (request id, kind)
    _estimates: dict[tuple[str, str], float] = field(default_factory=dict)  # (request id, kind): α̂ since then

    def kind(self, row: Row) -> str:
        return row.drafter if row.drafter in self.kinds else self.kinds[0]

    def uses_model(self, row: Row) -> bool:
        return self.kind(row) in self.model_kinds

    def observe_drafts(self, row: Row, k: int, num_accepted: int) -> None:
        self._estimates.clear()
        rejected = int(num_accepted < k)
        kind = self.kind(row)
        for counts in (self._job.setdefault((row.domain, kind), _Counts()),
                       self._own.setdefault((row.request_id, kind), _Counts())):
            counts.num_accepted += num_accepted
            counts.num_rejections += rejected

    def alpha_of(self, row: Row, kind: str) -> float:
        estimate = self._estimates.get((row.request_id, kind))
        if estimate is None:
            job = self._job.get((row.domain, kind), _Counts())
            job_alpha = shrunk_alpha(job.num_accepted, job.num_rejections, self.stats.prior, self.job_prior_weight)
            own = self._own.get((row.request_id, kind), _Counts())
            estimate = self._estimates[row.request_id, kind] = shrunk_alpha(own.num_accepted, own.num_rejections,
                                                                            job_alpha, self.row_prior_weight)
        return estimate

    def optimistic_alpha_of(self, row: Row, kind: str, z: float) -> float:
        alpha = self.alpha_of(row, kind)
        num = (self._own.get((row.request_id, kind), _Counts()).num_samples
               + self._job.get((row.domain, kind), _Counts()).num_samples)
        return min(1.0, alpha + z * math.sqrt(alpha * (1 - alpha) / (num + self.job_prior_weight)))

    def alpha(self, row: Row) -> float:
        return self.alpha_of(row, self.kind(row))

    def num_samples(self, row: Row) -> int:
        return self._own.get((row.request_id, self.kind(row)), _Counts()).num_samples

    def job_samples(self, row: Row) -> int:
        return self._job.get((row.domain, self.kind(row)), _Counts()).num_samples

    def optimistic_alpha(self, row: Row, z: float, prior_weight: float = 8.0) -> float:
        return self.optimistic_alpha_of(row, self.kind(row), z)

    def forget(self, row: Row) -> None:
        for kind in self.kinds:
            self._own.pop((row.request_id, kind), None)
            self._estimates.pop((row.request_id, kind), None)


def choose_drafters(alphas: AlphaTracker, round_cost: RoundCostModel, rows: list[Row], caps: list[int],
                    explore_z: float = 1.0, switch_horizon: float = 8.0,
                    index_lag: Callable[[Row, str], int] = lambda row, kind: 0) -> None:
    """Set each row's drafter for this round (module docstring); rows with cap 0 keep theirs. A job of
    one drafter (a plain `AlphaTracker`) has nothing to choose. `index_lag(row, kind)`: tokens drafter
    `kind` must index before drafting for the row."""
    if not isinstance(alphas, DrafterAlphas) or len(alphas.kinds) < 2 or not rows:
        return
    num_rows = len(rows)
    plain_rate = num_rows / round_cost.decode_ms(DecodeShape.of(rows, [0] * num_rows))
    row_price = plain_rate * round_cost.draft_position_ms  # tokens a draft position costs
    pass_price = plain_rate * round_cost.cost.draft_passes / num_rows if round_cost.uses_draft_model else 0.0
    model_price = row_price + pass_price
    cost = round_cost.cost
    for row, cap in zip(rows, caps, strict=True):
        if cap <= 0:
            continue
        model_lag = row_price * (draft_lag(row) - 1) / switch_horizon
        gains = [_gain(alphas.optimistic_alpha_of(row, kind, explore_z), cap,
                       *((model_price, model_lag) if kind in alphas.model_kinds else
                         (0.0, plain_rate * cost.lookup_ms(1, index_lag(row, kind) / switch_horizon))))
                 for kind in alphas.kinds]
        row.drafter = alphas.kinds[max(range(len(gains)), key=lambda i: (gains[i], -i))]


def _gain(alpha: float, cap: int, price: float, fixed: float) -> float:
    """Expected tokens beyond plain decoding's one, less the drafts' price (`price` tokens a draft and
    `fixed` once), at the best k ≤ cap: the k-th draft adds α^k tokens, so the best k is the largest
    whose last draft is still worth its price, α^k ≥ price (planning runs this per row and drafter
    every round: a closed form, not a search over k)."""
    if alpha >= 1.0:
        k = cap if price < 1.0 else 1
    elif price <= 0.0:
        k = cap
    elif alpha <= 0.0 or price >= 1.0:
        k = 1
    else:
        k = min(cap, max(1, int(math.log(price) / math.log(alpha))))
    return expected_tokens(alpha, k) - 1 - price * k - fixed


def probe_with_model(alphas: AlphaTracker, row: Row | None) -> None:
    """A probe times the draft model: the probed row drafts its one token with it."""
    if row is not None and isinstance(alphas, DrafterAlphas):
        row.drafter = next((kind for kind in alphas.kinds if kind in alphas.model_kinds), row.drafter)
