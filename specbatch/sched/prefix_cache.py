"""Shared prompt prefixes computed once: which KV a newly running row can copy instead of computing.

A causal model's KV at position p depends only on tokens 0..p, so a row whose prompt starts with
tokens another row has already computed can take that row's KV for them (a memory copy into its own
slot) and prefill only the rest. This module decides it, with no torch: an index of the prompts
whose KV is held (`PrefixIndex`, a trie over fixed-size token blocks keyed by the tokens
themselves, so a stale or colliding block cannot match), and the rule per prefilling row
(`PrefixCache.plan`): copy the longest computed match now, or wait a round when a row admitted
before it is still computing more of the same prefix (so a batch admitted at once computes a
shared prefix once, not once per row). The backend does the copy (`RoundPlan.reuse`).

Holders are running rows (their KV grows as they prefill) and finished rows whose slot is kept
while free (`RetainedPrefix`): a later row can hit those too, and a backend that hands the slot to
another row, pads into it or moves a row there first evicts it (`evict_slot`).

Why waiting never deadlocks: a row waits only for a holder registered before it that is still
prefilling, and such a holder never waits for a later one, so every chain of waits ends at a row
that computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specbatch.core import PrefixCopy, Row


class PrefixHolder(Protocol):
    """What the index reads of a holder: its prompt (the first `num_prompt_tokens` of `token_ids`,
    read in place: a plan looks at every holder of every prefilling row) and how far its KV is
    computed."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed: int
    num_draft_computed: int


@dataclass(eq=False)
class RetainedPrefix:
    """A finished row's prompt KV, kept in its free slot until the slot is needed."""

    request_id: str
    token_ids: list[int]  # the prompt
    num_prompt_tokens: int
    num_computed: int
    num_draft_computed: int
    slot: int


@dataclass(eq=False)
class _Node:
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    holders: list[PrefixHolder] = field(default_factory=list)  # in registration order


class PrefixIndex:
    """A trie over `block_size`-token blocks of held prompts; each node lists the holders whose
    prompt starts with the blocks on its path."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = _Node()
        self._paths: dict[int, list[_Node]] = {}  # id(holder) -> the nodes it is listed at

    def __len__(self) -> int:
        return len(self._paths)

    def insert(self, holder: PrefixHolder) -> None:
        node, path = self.root, []
        for block in self._blocks(holder):
            node = node.children.setdefault(block, _Node())
            node.holders.append(holder)
            path.append(node)
        self._paths[id(holder)] = path

    def remove(self, holder: PrefixHolder) -> None:
        path = self._paths.pop(id(holder), None)
        if path is None:
            return
        parent = self.root
        for node in path:
            node.holders = [h for h in node.holders if h is not holder]
        # prune the nodes no holder lists any more, from the root down
        for node, block in zip(path, self._blocks(holder), strict=False):
            if not node.holders:
                parent.children.pop(block, None)
                break
            parent = node

    def path(self, holder: PrefixHolder) -> list[_Node]:
        """The nodes a registered holder is listed at, from the root down."""
        return self._paths.get(id(holder), [])

    def _blocks(self, holder: PrefixHolder) -> list[tuple[int, ...]]:
        size, tokens = self.block_size, holder.token_ids
        return [tuple(tokens[i : i + size]) for i in range(0, holder.num_prompt_tokens - size + 1, size)]


class PrefixCache:
    """The reuse rule over a `PrefixIndex` of running and retained holders.

    `draft_from_target_features` (an EAGLE head): the head's KV at position p was fed the target's
    hidden state at p and token p + 1, so a hit keeps it only below the match's last token, and the
    row's target reuse stops where the head's does: the head reads target features of every
    position it has not fed, and copied target positions have none for the new row."""

    def __init__(self, block_size: int, uses_draft_cache: bool, draft_from_target_features: bool,
                 max_retained_bytes: int | None = None) -> None:
        self.index = PrefixIndex(block_size)
        self.max_retained_bytes = max_retained_bytes  # None: every free slot may keep a prefix
        self.bytes_per_token = 1  # KV bytes a kept position holds (the backend knows its caches)
        self.uses_draft_cache = uses_draft_cache
        self.draft_from_target_features = draft_from_target_features
        self.retained: dict[int, RetainedPrefix] = {}  # slot -> the finished row's prefix kept there
        self.pinned: dict[int, str] = {}  # kept slots this round's copies read -> the copying row's request id
        self._order: dict[int, int] = {}  # id(holder) -> registration number (who waits for whom)
        self._num_registered = 0

    def register(self, holder: PrefixHolder) -> None:
        self.index.insert(holder)
        self._order[id(holder)] = self._num_registered
        self._num_registered += 1

    def forget(self, holder: PrefixHolder) -> None:
        self.index.remove(holder)
        self._order.pop(id(holder), None)

    def retain(self, row: PrefixHolder, slot: int) -> None:
        """Keep a finished row's prompt KV in its (now free) slot as a holder of its own."""
        self.forget(row)
        num_computed = min(row.num_computed, row.num_prompt_tokens)
        if num_computed < self.index.block_size:
            return
        kept = RetainedPrefix(row.request_id, row.token_ids[: row.num_prompt_tokens], row.num_prompt_tokens,
                              num_computed, min(row.num_draft_computed, num_computed), slot)
        self.evict_slot(slot)
        self.retained[slot] = kept
        self.register(kept)
        if self.max_retained_bytes is not None:
            while sum(k.num_computed for k in self.retained.values()) * self.bytes_per_token > self.max_retained_bytes:
                self.evict_slot(next(iter(self.retained)))  # the one kept longest first

    def evict_slot(self, slot: int) -> None:
        """The slot is about to be written by something else: its retained prefix is gone."""
        kept = self.retained.pop(slot, None)
        if kept is not None:
            self.forget(kept)

    def pin_sources(self, copies: list[PrefixCopy]) -> None:
        """Remember which kept slots this round's copies read (and for whom), for `claim_slot`."""
        self.pinned = {copy.holder.slot: copy.row.request_id for copy in copies
                       if isinstance(copy.holder, RetainedPrefix)}

    def claim_slot(self, row: PrefixHolder, free_slots: list[int]) -> int:
        """The free slot a newly admitted row takes: the kept slot its own copy reads this round (the
        copy is then a no-op), else one that keeps nothing, else the kept one kept longest that no
        copy of this round reads, else (every free slot is read) one another copy reads, which
        `copy_order` then writes after it is read. The slot's kept prefix leaves the index at once;
        its KV stays readable until this round's first pass."""
        mine = [slot for slot in free_slots if self.pinned.get(slot) == row.request_id]
        empty = [slot for slot in free_slots if slot not in self.retained]
        kept = [slot for slot in self.retained if slot in free_slots and slot not in self.pinned]
        slot = (mine or empty or kept or [slot for slot in free_slots if slot in self.pinned])[0]
        self.evict_slot(slot)
        return slot

    def matches(self, row: PrefixHolder) -> list[tuple[PrefixHolder, int]]:
        """(holder, prompt tokens it shares with `row`) for every holder sharing a whole block with
        the registered `row`, `row` itself left out. Walked from the row's deepest node up, each
        holder met once: one first met at depth d shares d blocks and then at most part of the
        next, so only that part is compared; a node listing no holder the deeper ones did not is
        skipped (a shallower node lists every holder of a deeper one), so rows sharing a long prefix
        cost O(holders · block) a row, not O(holders · depth)."""
        size, tokens, num_prompt = self.index.block_size, row.token_ids, row.num_prompt_tokens
        found: dict[int, tuple[PrefixHolder, int]] = {id(row): (row, 0)}
        path = self.index.path(row)
        for depth in range(len(path), 0, -1):
            holders = path[depth - 1].holders
            if len(holders) == len(found):
                continue
            known = depth * size
            tail = tokens[known : min(known + size, num_prompt)]
            for holder in holders:
                if id(holder) not in found:
                    theirs = holder.token_ids[known : min(known + size, holder.num_prompt_tokens)]
                    found[id(holder)] = (holder, known + shared_length(tail, theirs))
        del found[id(row)]
        return list(found.values())

    def plan(self, row: Row) -> tuple[PrefixCopy | None, bool]:
        """For a row with prefill left: the copy to make now, if any, and whether it should then
        wait a round (not prefill) for an earlier row still computing more of its prefix."""
        limit = row.num_prompt_tokens - 1  # the pending token is always computed by the verify pass
        best: tuple[int, PrefixHolder] | None = None
        wait = False
        mine = self._order.get(id(row), self._num_registered)
        for holder, shared in self.matches(row):
            matched = min(shared, limit)
            usable = self._usable(holder, matched)
            if best is None or usable > best[0]:
                best = (usable, holder)
            if (self._order.get(id(holder), mine) < mine and not isinstance(holder, RetainedPrefix)
                    and holder.num_computed < holder.num_prompt_tokens - 1
                    and matched - max(usable, row.num_computed) >= self.index.block_size):
                wait = True  # an earlier row is computing more of this prefix: take it when it has
        if best is None or best[0] <= row.num_computed:
            return None, wait
        usable, holder = best
        draft_end = min(usable, holder.num_draft_computed) if self.uses_draft_cache else 0
        draft_start = min(row.num_draft_computed, draft_end)
        return PrefixCopy(row, holder, row.num_computed, usable, draft_start, draft_end), wait

    def _usable(self, holder: PrefixHolder, matched: int) -> int:
        """Target positions a row matching `matched` prompt tokens of `holder` can copy from it."""
        usable = min(matched, holder.num_computed)
        if self.draft_from_target_features:
            usable = min(usable, matched - 1, holder.num_draft_computed)
        return max(usable, 0)


def copy_order(copies: list[PrefixCopy]) -> list[PrefixCopy]:
    """This round's copies in the order that gives every copy what it was planned on: first those
    from kept slots, which want the slot as it was kept (a new row may be writing into it this round),
    then those from running rows, in plan order, which want the holder's KV after its own copy of
    this round where it had one (a row may copy from one that took the prefix by an earlier copy).
    A new row takes the kept slot its own copy reads, so no copy from a kept slot writes into a
    slot another such copy reads."""
    return sorted(copies, key=lambda copy: not isinstance(copy.holder, RetainedPrefix))


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of two token lists."""
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length
