"""Prefix keys: which records of an ingest window share a long leading run of prompt tokens.

Shards are cut from a sorted window, and each worker takes whole shards, so records that share a
prefix (an instruction, a few-shot block, a document) must sort next to each other for a worker to
compute the prefix once and share its KV blocks with the rest (`sched/kv_blocks.py`). A record's key is the
longest run of leading tokens it shares with any other record of the window, whole blocks of
`PREFIX_BLOCK_TOKENS` and at least `MIN_SHARED_TOKENS` long, else empty: sorted
lexicographically, equal keys are contiguous and a key sorts just before the longer keys it starts.
Records that share nothing keep an empty key, so data without shared prefixes keeps its
(domain, length) grouping unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

PREFIX_BLOCK_TOKENS = 16
MIN_SHARED_TOKENS = 32  # shorter common starts (a chat template's first tokens) are not worth grouping
MAX_KEY_TOKENS = 4096  # longer shared runs group the same; the key need not hold them whole


def shared_prefix_keys(prompts: Sequence[Sequence[int] | None]) -> list[tuple[int, ...]]:
    """Each prompt's prefix key (see the module docstring); a prompt of None gets an empty key."""
    present = sorted((tuple(p[:MAX_KEY_TOKENS]), i) for i, p in enumerate(prompts) if p)
    keys: list[tuple[int, ...]] = [() for _ in prompts]
    for position, (tokens, index) in enumerate(present):
        # the longest common prefix with any other prompt is with a neighbour in sorted order
        shared = max((shared_length(tokens, present[other][0]) for other in (position - 1, position + 1)
                      if 0 <= other < len(present)), default=0)
        shared -= shared % PREFIX_BLOCK_TOKENS
        if shared >= MIN_SHARED_TOKENS:
            keys[index] = tokens[:shared]
    return keys


def shared_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common leading run of two token lists."""
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length


def key_tree_positions(keys: Iterable[tuple[int, ...]]) -> int:
    """Positions that hold these prefix keys once each, as one tree (a key that starts another counts
    once): the KV room that keeps every shared prefix cached between the rows that read it, whatever
    order the rows run in."""
    ordered = sorted(set(keys))
    # in sorted order a key shares the most leading tokens with the key just before it
    return sum(len(key) - shared_length(key, before) for before, key in pairwise([(), *ordered]))
