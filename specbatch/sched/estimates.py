"""Acceptance and length statistics the policies estimate from, and the maths they share.

Drafts are accepted left to right until the first rejection, so one speculative round of a row is
an accepted-prefix length a ≤ k. With a per-token acceptance α (each draft kept with probability α
while its predecessors were kept):

    P(a ≥ i) = α^i                 E[committed | k] = Σ_{i=0..k} α^i = (1 − α^(k+1)) / (1 − α)

Estimating α: the naive accepted / proposed is biased low (a round that stops at the first reject
never shows the drafts after it). The maximum-likelihood estimate of a geometric run censored at k
counts accepted drafts A and rounds that ended in a rejection R (a < k):

    α̂ = A / (A + R)

and we shrink it towards a prior with weight w:  α̂ = (A + w·prior) / (A + R + w). k is the round's
*planned* lookahead: a lookup proposes only what its match holds, and a planned draft it did not
propose ends the run as a rejection does (the commit step counts it so), so α̂ is the chance that a
planned position is proposed and kept, what the policy, the drafter choice and the limit price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbatch.core import Row


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens of one verified row with k drafts: (1 − α^(k+1)) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def shrunk_alpha(num_accepted: int, num_rejections: int, prior: float, prior_weight: float) -> float:
    """α̂ = (A + w·prior) / (A + R + w): the censored-geometric MLE shrunk towards the prior."""
    return (num_accepted + prior * prior_weight) / (num_accepted + num_rejections + prior_weight)


@dataclass
class AcceptanceStats:
    """Per-domain counters updated at commit (acceptance) and at finish (lengths, completion time).

    These are the prediction-free statistical signals: no per-request length predictor, only what
    the job has measured so far per domain, shrunk towards priors while samples are few.
    """

    planned: dict[str, int] = field(default_factory=dict)  # drafts planned (k), proposed or not
    accepted: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)  # speculative rounds ended by a reject
    num_finished: dict[str, int] = field(default_factory=dict)
    output_tokens: dict[str, int] = field(default_factory=dict)  # Σ output tokens of finished rows
    budget_tokens: dict[str, int] = field(default_factory=dict)  # Σ max_new_tokens of finished rows
    completion_s: float = 0.0  # Σ (finish − arrival) over finished rows, all domains
    num_completed: int = 0
    prior: float = 0.5
    version: int = 0  # acceptance rounds observed: what a cached α̂ was computed at (`AlphaTracker`)

    def observe(self, domain: str, k: int, num_accepted: int) -> None:
        """A verified round of a row planned at k: its accepted drafts, and whether a stop (a rejection,
        or the drafter proposing fewer than k) ended the run."""
        self.planned[domain] = self.planned.get(domain, 0) + k
        self.accepted[domain] = self.accepted.get(domain, 0) + num_accepted
        if num_accepted < k:
            self.rejections[domain] = self.rejections.get(domain, 0) + 1
        self.version += 1

    def observe_finish(self, domain: str, num_output_tokens: int, max_new_tokens: int,
                       completion_s: float) -> None:
        self.num_finished[domain] = self.num_finished.get(domain, 0) + 1
        self.output_tokens[domain] = self.output_tokens.get(domain, 0) + num_output_tokens
        self.budget_tokens[domain] = self.budget_tokens.get(domain, 0) + max_new_tokens
        self.completion_s += max(0.0, completion_s)
        self.num_completed += 1

    def alpha(self, domain: str, prior_weight: float = 8.0) -> float:
        """Per-token acceptance of a domain (censored-geometric MLE), shrunk towards the prior."""
        return shrunk_alpha(self.accepted.get(domain, 0), self.rejections.get(domain, 0), self.prior,
                            prior_weight)

    def num_samples(self, domain: str) -> int:
        """Accepted drafts + rejections seen in a domain: the evidence behind its α̂."""
        return self.accepted.get(domain, 0) + self.rejections.get(domain, 0)

    def length_ratio(self, domain: str, prior_weight: float = 256.0) -> float:
        """Σ output / Σ max_new_tokens of the domain's finished rows, shrunk towards 1 (no early
        stops) with `prior_weight` budget tokens: how much of its budget a request really uses."""
        used, budget = self.output_tokens.get(domain, 0), self.budget_tokens.get(domain, 0)
        return (used + prior_weight) / (budget + prior_weight)

    def mean_completion_s(self) -> float | None:
        return self.completion_s / self.num_completed if self.num_completed else None


@dataclass
class _RowCounts:
    num_seen: int = 0  # accept_history entries already counted
    num_accepted: int = 0
    num_rejections: int = 0
    alpha: float = 0.0  # the row's α̂ as last computed, valid at `version`
    version: int = -1  # the stats' version it was computed at (-1: since counted again)


@dataclass
class AlphaTracker:
    """Per-row α̂ from `accept_history`, counted incrementally (O(new entries) per call) and shrunk
    towards the row's domain α̂, so a row with no history gets its domain's estimate. Each α̂ is kept
    until the row's history or the job's statistics change (`AcceptanceStats.version`): every round
    reads every row's α for the ledger's limit, and in plain rounds none of them changes (32 rows'
    estimates took ~30 µs a round, about a quarter of what adaptive planning added to a bundled job)."""

    stats: AcceptanceStats
    row_prior_weight: float = 4.0
    _rows: dict[str, _RowCounts] = field(default_factory=dict)
    _fresh: dict[str, float] = field(default_factory=dict)  # α̂ of a row with no history, per domain
    _fresh_version: int = -1  # the stats' version `_fresh` holds

    def alpha(self, row: Row) -> float:
        version = self.stats.version
        if not row.accept_history:
            if self._fresh_version != version:
                self._fresh, self._fresh_version = {}, version
            fresh = self._fresh.get(row.domain)
            if fresh is None:
                fresh = self._fresh[row.domain] = shrunk_alpha(0, 0, self.stats.alpha(row.domain),
                                                               self.row_prior_weight)
            return fresh
        counts = self._counts(row)
        if counts.version != version:
            counts.alpha = shrunk_alpha(counts.num_accepted, counts.num_rejections, self.stats.alpha(row.domain),
                                        self.row_prior_weight)
            counts.version = version
        return counts.alpha

    def num_samples(self, row: Row) -> int:
        """Accepted drafts + rejections seen: the evidence behind the row's own estimate."""
        counts = self._counts(row)
        return counts.num_accepted + counts.num_rejections

    def optimistic_alpha(self, row: Row, z: float, prior_weight: float = 8.0) -> float:
        """Upper confidence bound α̂ + z·√(α̂(1 − α̂)/(n + w)), n the row's and its domain's samples and
        w the prior's weight in pseudo-samples: a policy that stops drafting stops learning α, so it
        acts on what α could still be (with no evidence at all, 0.5 + z·0.18)."""
        alpha = self.alpha(row)
        num = self.num_samples(row) + self.stats.num_samples(row.domain)
        return min(1.0, alpha + z * math.sqrt(alpha * (1 - alpha) / (num + prior_weight)))

    def job_samples(self, row: Row) -> int:
        """The job's evidence on the row's drafter in its domain (accepted drafts + rejections)."""
        return self.stats.num_samples(row.domain)

    def forget(self, row: Row) -> None:
        self._rows.pop(row.request_id, None)

    def observe_drafts(self, row: Row, k: int, num_accepted: int) -> None:
        """A verified round planned at k (the commit step): counted from `accept_history` here; a job of
        several drafters counts them per drafter (`sched.drafter_choice.DrafterAlphas`)."""

    def uses_model(self, row: Row) -> bool:
        """Whether the row's drafts come from the job's draft model (where it has one): always, with
        one drafter."""
        return True

    def _counts(self, row: Row) -> _RowCounts:
        history = row.accept_history
        if not history:  # no entry for rows that never speculated (a million waiting rows stay free)
            return _RowCounts()
        counts = self._rows.setdefault(row.request_id, _RowCounts())
        if counts.num_seen == len(history):
            return counts
        for num_accepted, k in history[counts.num_seen :]:
            counts.num_accepted += num_accepted
            counts.num_rejections += int(num_accepted < k)
        counts.num_seen, counts.version = len(history), -1
        return counts
