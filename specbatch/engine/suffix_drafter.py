"""`SuffixDrafter`: model-free drafting from what this job has already seen (SuffixDecoding-style).

Two suffix indexes answer each row: its own tokens (prompt and output so far, as prompt lookup
does) and the job-wide index of completed rows' outputs, each with the prompt tokens just before
it, so that the first output tokens match too. The draft with the higher score (the sum of its
tokens' estimated probabilities) is proposed; its length follows the match (see
`SuffixIndex.draft`). Drafts are point masses: the target's verify pass and the rejection rule
keep the output law exact, whatever the index proposes.

The job-wide index lives as long as the worker's engine and forgets its oldest outputs past
`drafter.suffix_max_tokens`; a row's own index lives while the row runs. Both are built only when a
draft needs them: a row's the first time it drafts, then extended at each draft; a completed row's
output waits until the next draft to join the job's (in the same order, so the index is the same),
so that plain decoding, where the policy chooses it, pays no indexing. Indexing is host time inside
the drafting phase: `propose` reports the tokens it indexed and how far each row's own index reaches,
which the round-time model prices (`sched/roundcost.py`).
"""

from __future__ import annotations

from collections import deque

from specbatch.config import DrafterConfig
from specbatch.core import Proposals, Row, Status
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import NoDrafter
from specbatch.engine.forward import RowCache
from specbatch.engine.suffix_index import BoundedSuffixIndex, GrowingSuffixIndex, SuffixDraft


class SuffixDrafter(NoDrafter):
    def __init__(self, config: DrafterConfig) -> None:
        self.max_depth, self.min_prob = config.suffix_max_depth, config.suffix_min_prob
        self.spec_factor = config.suffix_spec_factor
        self.job_index = BoundedSuffixIndex(config.suffix_max_depth, config.suffix_max_tokens)
        self.row_indexes: dict[str, GrowingSuffixIndex] = {}
        self.completed: deque[list[int]] = deque()  # completed rows' tokens the job index has yet to take

    def forget(self, row: Row) -> None:
        self.row_indexes.pop(row.request_id, None)
        if row.status is Status.COMPLETED and row.num_output_tokens:
            self.completed.append(row.token_ids[max(0, row.num_prompt_tokens - self.max_depth + 1) :])

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        num_job_tokens = self._index_completed() if any(ks) else 0  # (best_draft would, uncounted)
        before = [self._num_indexed(row) if k > 0 else 0 for row, k in zip(rows, ks, strict=True)]
        tokens = [self.best_draft(row, k).token_ids if k > 0 else [] for row, k in zip(rows, ks, strict=True)]
        indexed_to = [self._num_indexed(row) if k > 0 else 0 for row, k in zip(rows, ks, strict=True)]
        num_row_tokens = sum(max(0, after - b) for after, b in zip(indexed_to, before, strict=True))
        return Proposals(tokens, [None for _ in rows], [0 for _ in rows], num_lookup_rows=sum(k > 0 for k in ks),
                         num_indexed_tokens=num_job_tokens + num_row_tokens, indexed_to=indexed_to)

    def _index_completed(self) -> int:
        """Give the job index the rows completed since it last drafted; returns their tokens."""
        num_tokens = 0
        while self.completed:
            token_ids = self.completed.popleft()
            self.job_index.add(token_ids)
            num_tokens += len(token_ids)
        return num_tokens

    def _num_indexed(self, row: Row) -> int:
        index = self.row_indexes.get(row.request_id)
        return index.num_tokens if index is not None else 0

    def best_draft(self, row: Row, k: int, prefix: list[int] | None = None) -> SuffixDraft:
        """The better of the row's own and the job's draft of up to k tokens after the row's tokens,
        and after `prefix` where given (drafts proposed ahead of these: a grammar's forced tokens)."""
        context = row.token_ids + prefix if prefix else row.token_ids
        self._index_completed()
        own = self._row_index(row).draft(context, k, self.min_prob, self.spec_factor)
        job = self.job_index.draft(context, k, self.min_prob, self.spec_factor)
        return job if job.score > own.score else own

    def continue_after(self, row: Row, prefix: list[int], k: int) -> list[int]:
        return self.best_draft(row, k, prefix).token_ids

    def _row_index(self, row: Row) -> GrowingSuffixIndex:
        """The row's index, brought up to all its tokens but the last: a context must not match
        itself, only earlier occurrences of its suffix."""
        index = self.row_indexes.get(row.request_id)
        if index is None or index.num_tokens > row.num_tokens - 1:  # new, or its tokens were cut back
            index = self.row_indexes[row.request_id] = GrowingSuffixIndex(self.max_depth)
        index.extend(row.token_ids[index.num_tokens : row.num_tokens - 1])
        return index
