"""A row's suffix index split at a shared prompt prefix drafts exactly as one index of the whole row."""

from __future__ import annotations

import random

import pytest

from specbatch.engine.suffix_index import GrowingSuffixIndex, PrimedSuffixIndex


@pytest.mark.parametrize("max_depth", [2, 5, 24])
def test_a_primed_index_over_a_shared_prefix_drafts_as_the_whole_rows_index(max_depth):
    rng = random.Random(max_depth)
    for trial in range(60):
        vocab = rng.choice((3, 6, 40))  # small vocabularies: many repeats and ties between continuations
        prefix = [rng.randrange(vocab) for _ in range(rng.randint(1, 90))]
        shared = GrowingSuffixIndex(max_depth)
        shared.extend(prefix)
        rows = []
        for _ in range(3):  # rows sharing the prefix, each with its own tail
            tail = [rng.randrange(vocab) for _ in range(rng.randint(0, 60))]
            whole, primed = GrowingSuffixIndex(max_depth), PrimedSuffixIndex(shared, prefix)
            whole.extend(prefix)
            for start in range(0, len(tail), 7):  # grown a few tokens at a time, as rows are
                whole.extend(tail[start : start + 7])
                primed.extend(tail[start : start + 7])
            rows.append((prefix + tail, whole, primed))
        for tokens, whole, primed in rows:
            assert primed.num_tokens == whole.num_tokens == len(tokens)
            for _ in range(20):
                context = tokens + [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
                k, min_prob, factor = rng.randint(0, 8), rng.choice((0.0, 0.1, 0.5)), rng.choice((1.0, 4.0))
                assert primed.draft(context, k, min_prob, factor) == whole.draft(context, k, min_prob, factor), trial


def test_a_primed_index_holds_only_what_ends_after_the_prefix():
    prefix, tail = list(range(100)), [7, 8, 9]
    shared = GrowingSuffixIndex(8)
    shared.extend(prefix)
    primed = PrimedSuffixIndex(shared, prefix)
    primed.extend(tail)
    whole = GrowingSuffixIndex(8)
    whole.extend(prefix + tail)
    assert primed.num_nodes < whole.num_nodes // 10  # the lead-in's paths and the tail's, not the prefix's
