"""The commit step of a round: everything a round changes in its rows, in one place.

From the plan and the backend's outcome: KV validity (prefill chunks become computed; a verified
row keeps its pending token and accepted drafts, the draft cache rolls back to the same prefix),
how far the row's own suffix index reaches, the row's raw counters and acceptance history, stops
(`StopChecker`), and finishing completed rows in the scheduler. Backends only read rows, so this is
the single writer of a round's effects (as nano-vllm's `Scheduler.postprocess`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specbatch.core import RoundOutcome, RoundPlan, Row, RowOutcome, Status
from specbatch.sched.scheduler import Scheduler
from specbatch.sched.stops import StopChecker


@dataclass
class RoundCommit:
    verified: list[tuple[RowOutcome, int]] = field(default_factory=list)  # (outcome, tokens committed)
    finished: list[Row] = field(default_factory=list)  # rows completed this round

    @property
    def num_committed(self) -> int:
        return sum(committed for _, committed in self.verified)


def commit_round(scheduler: Scheduler, stops: StopChecker, plan: RoundPlan, outcome: RoundOutcome,
                 now_s: float) -> RoundCommit:
    """Apply one executed round to its rows and the scheduler; `now_s` stamps emissions and finishes."""
    draft_follows_prefill = outcome.num_draft_prefill_positions > 0  # a draft model fills its cache alongside
    for row, size in plan.prefill:
        end = row.num_computed + size
        if draft_follows_prefill and row.draft_is_current:
            row.num_draft_positions += end - row.num_draft_computed
            row.num_draft_computed = end
        row.num_computed = end
        row.num_target_positions += size
        scheduler.kv.register(row)  # its full computed blocks can be shared from now on
    result = RoundCommit()
    for row_outcome in outcome.rows:
        result.verified.append((row_outcome, _commit_verified(scheduler, stops, row_outcome, now_s)))
        scheduler.kv.register(row_outcome.row)
        if row_outcome.row.status is Status.COMPLETED:
            result.finished.append(row_outcome.row)
    for row in result.finished:
        scheduler.finish(row)
        row.finished_s = now_s
    return result


def _commit_verified(scheduler: Scheduler, stops: StopChecker, outcome: RowOutcome, now_s: float) -> int:
    """One verified row: KV validity, counters, then its emitted tokens up to a stop; returns how
    many were committed."""
    row, num_proposed = outcome.row, len(outcome.proposed)
    accepted_end = row.num_tokens + outcome.num_accepted  # the pending token + accepted drafts are valid
    row.num_computed = accepted_end
    row.num_draft_positions += outcome.num_draft_fed
    kept = outcome.num_draft_fed if outcome.num_draft_kept is None else outcome.num_draft_kept
    row.num_draft_computed = min(row.num_draft_computed + kept, accepted_end)
    row.num_indexed = max(row.num_indexed, outcome.num_indexed)
    committed = stops.commit(row, outcome.emitted)
    row.num_rounds += 1
    row.num_target_positions += 1 + num_proposed
    row.num_proposed += num_proposed
    row.num_accepted += outcome.num_accepted
    row.last_k = outcome.k
    if outcome.k:  # a planned draft the drafter did not propose (a lookup's match ran out) ends the run as a rejection
        row.accept_history.append((outcome.num_accepted, outcome.k))
        scheduler.stats.observe(row.domain, outcome.k, outcome.num_accepted)
        scheduler.ctx.alphas.observe_drafts(row, outcome.k, outcome.num_accepted)
    if row.first_token_s is None and committed:
        row.first_token_s = now_s
    return committed
