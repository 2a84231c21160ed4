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

What rows' prompts share (an instruction, a few-shot block) is indexed once (`SharedPrefixes`): a
row's own index is then primed past the shared prefix (`PrimedSuffixIndex`), and its drafts are those
of an index of all its tokens. On SmolLM2 few-shot prompts at 32 rows (64 rows, each starting with
one of three ~560-token blocks) rows indexed 46,000 prompt tokens, 0.7-0.9 s of a 16 s job; with the
blocks shared, ~18,000 (issue 43).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from specbatch.config import DrafterConfig
from specbatch.core import Proposals, Row, Status
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import NoDrafter
from specbatch.engine.forward import RowCache
from specbatch.engine.suffix_index import BoundedSuffixIndex, GrowingSuffixIndex, PrimedSuffixIndex, SuffixDraft

PREFIX_GRANULE = 64  # tokens: prompts are compared at prefixes of whole multiples of this
MAX_IDLE_PREFIXES = 8  # shared prefixes kept while no row uses them (the next rows may)
MAX_SEEN_PREFIXES = 4096  # prefix keys of recent rows remembered, to tell when a second row shares one


@dataclass
class SharedPrefix:
    key: int
    tokens: list[int]
    index: GrowingSuffixIndex
    num_rows: int = 0  # rows whose own index is primed on it


class SharedPrefixes:
    """Indexes of prompt prefixes that several rows start with, each built once. A prefix (a whole
    number of `PREFIX_GRANULE`s) becomes shared when a row starts with one that another recent row
    started with (`note`): the longest such. Held while rows use it, then among the last
    `MAX_IDLE_PREFIXES` idle ones."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.entries: dict[int, SharedPrefix] = {}  # by prefix key
        self.idle: OrderedDict[int, None] = OrderedDict()  # keys of entries no row uses, oldest first
        self.seen: OrderedDict[int, str] = OrderedDict()  # prefix keys of recent rows: the first row's id

    def note(self, request_id: str, prompt: list[int]) -> None:
        """A row's prompt: its prefixes become shared once another row starts with them."""
        for _, key in _prefix_keys(prompt):
            self.seen.setdefault(key, request_id)
            self.seen.move_to_end(key)
        while len(self.seen) > MAX_SEEN_PREFIXES:
            self.seen.popitem(last=False)

    def acquire(self, request_id: str, prompt: list[int]) -> tuple[SharedPrefix | None, int]:
        """The shared prefix for a new index of row `request_id` over `prompt` (counted as used), or
        None; and the tokens indexed to build it (0 if it was there)."""
        keys = _prefix_keys(prompt)
        for length, key in reversed(keys):
            entry = self.entries.get(key)
            if entry is not None and entry.tokens == prompt[:length]:  # (a key's collision is no match)
                return self._use(entry), 0
        for length, key in reversed(keys):
            if self.seen.get(key, request_id) != request_id and key not in self.entries:
                index = GrowingSuffixIndex(self.max_depth)
                index.extend(prompt[:length])
                return self._use(SharedPrefix(key, prompt[:length], index)), length
        self.note(request_id, prompt)
        return None, 0

    def release(self, entry: SharedPrefix) -> None:
        entry.num_rows -= 1
        if entry.num_rows > 0:
            return
        self.idle[entry.key] = None
        while len(self.idle) > MAX_IDLE_PREFIXES:
            del self.entries[self.idle.popitem(last=False)[0]]

    def _use(self, entry: SharedPrefix) -> SharedPrefix:
        self.entries[entry.key] = entry
        self.idle.pop(entry.key, None)
        entry.num_rows += 1
        return entry


def _prefix_keys(prompt: list[int]) -> list[tuple[int, int]]:
    """(length, key) of each prefix of whole granules, shortest first: keys chained granule by granule,
    so all cost one pass over the prompt (ints and tuples hash the same in every process)."""
    keys, key = [], 0
    for end in range(PREFIX_GRANULE, len(prompt) + 1, PREFIX_GRANULE):
        key = hash((key, tuple(prompt[end - PREFIX_GRANULE : end])))
        keys.append((end, key))
    return keys


class SuffixDrafter(NoDrafter):
    def __init__(self, config: DrafterConfig) -> None:
        self.max_depth, self.min_prob = config.suffix_max_depth, config.suffix_min_prob
        self.spec_factor = config.suffix_spec_factor
        self.job_index = BoundedSuffixIndex(config.suffix_max_depth, config.suffix_max_tokens)
        self.row_indexes: dict[str, GrowingSuffixIndex] = {}
        self.completed: deque[list[int]] = deque()  # completed rows' tokens the job index has yet to take
        self.prefixes = SharedPrefixes(config.suffix_max_depth)
        self.row_prefixes: dict[str, SharedPrefix] = {}  # the shared prefix each row's index is primed on
        self.noted: set[str] = set()  # rows whose prompts `prefixes` has noted
        self.num_indexed = 0  # tokens the rows' indexes (and shared prefixes) have taken, for `propose`

    def forget(self, row: Row) -> None:
        self.row_indexes.pop(row.request_id, None)
        self.noted.discard(row.request_id)
        self._release_prefix(row.request_id)
        if row.status is Status.COMPLETED and row.num_output_tokens:
            self.completed.append(row.token_ids[max(0, row.num_prompt_tokens - self.max_depth + 1) :])

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        num_job_tokens = self._index_completed() if any(ks) else 0  # (best_draft would, uncounted)
        for row in rows:  # rows not drafting yet share their prompts' prefixes with those that do
            if row.request_id not in self.noted:
                self.noted.add(row.request_id)
                self.prefixes.note(row.request_id, row.token_ids[: row.num_prompt_tokens])
        indexed_before = self.num_indexed
        tokens = [self.best_draft(row, k).token_ids if k > 0 else [] for row, k in zip(rows, ks, strict=True)]
        indexed_to = [self._num_indexed(row) if k > 0 else 0 for row, k in zip(rows, ks, strict=True)]
        num_row_tokens = self.num_indexed - indexed_before
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
            index = self.row_indexes[row.request_id] = self._new_row_index(row)
        new_tokens = row.token_ids[index.num_tokens : row.num_tokens - 1]
        index.extend(new_tokens)
        self.num_indexed += len(new_tokens)
        return index

    def _new_row_index(self, row: Row) -> GrowingSuffixIndex:
        """Primed past the longest prompt prefix shared with recent rows, where there is one."""
        self._release_prefix(row.request_id)
        prompt = row.token_ids[: min(row.num_prompt_tokens, row.num_tokens - 1)]
        prefix, num_built = self.prefixes.acquire(row.request_id, prompt)
        if prefix is None:
            return GrowingSuffixIndex(self.max_depth)
        self.row_prefixes[row.request_id] = prefix
        self.num_indexed += num_built + min(len(prefix.tokens), self.max_depth - 1)  # the lead-in's paths too
        return PrimedSuffixIndex(prefix.index, prefix.tokens)

    def _release_prefix(self, request_id: str) -> None:
        prefix = self.row_prefixes.pop(request_id, None)
        if prefix is not None:
            self.prefixes.release(prefix)
