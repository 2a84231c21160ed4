"""The block allocator (`sched/kv_blocks.py`): a property test over random admissions, growth,
registration, sharing and frees (no block freed while referenced, no row reading a block that
holds other tokens, refcounts back to zero), and the sharing rules one case at a time."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_engine_helpers import SimLoop, make_scheduler

from specbatch.core import Row, SamplingParams
from specbatch.sched.kv_blocks import KVBlocks

BLOCK = 4


def row(request_id: str, tokens: list[int]) -> Row:
    return Row(request_id, tokens, SamplingParams(max_new_tokens=8))


def check(kv: KVBlocks, contents: dict[int, tuple[int, ...]], rows: dict[str, Row]) -> None:
    """Every row's computed positions read blocks holding exactly its tokens; refcounts match tables."""
    counts: dict[int, int] = {}
    for request_id, held in kv.holdings.items():
        for block in held.table:
            counts[block] = counts.get(block, 0) + 1
        r = rows[request_id]
        for index in range(r.num_computed // BLOCK):
            assert contents[held.table[index]] == tuple(r.token_ids[index * BLOCK : (index + 1) * BLOCK])
    for block_id, block in enumerate(kv.blocks):
        assert block.refcount == counts.get(block_id, 0)
    assert kv.num_in_use == len(counts)
    cached = set(kv.cached) | set(kv.cached_shared)
    assert not set(counts) & cached and not set(counts) & set(kv.free_blocks)
    assert not set(kv.cached) & set(kv.cached_shared)
    assert len(kv.free_blocks) + kv.num_cached + kv.num_in_use == kv.num_blocks


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(8, 40), max_cached=st.one_of(st.none(), st.integers(0, 6)))
def test_random_admissions_shares_and_frees_keep_every_block_honest(seed, num_blocks, max_cached):
    rng = random.Random(seed)
    kv = KVBlocks(num_blocks, BLOCK, share_prefixes=True, max_cached_blocks=max_cached)
    prefixes = [[rng.randrange(1, 5) for _ in range(rng.randint(0, 12))] for _ in range(3)]
    contents: dict[int, tuple[int, ...]] = {}  # what each block's positions were written with
    rows: dict[str, Row] = {}
    for step in range(60):
        if rows and rng.random() < 0.3:  # a row leaves
            request_id = rng.choice(sorted(rows))
            kv.free(request_id)
            del rows[request_id]
        elif rng.random() < 0.5 or not rows:  # a row arrives
            tokens = rng.choice(prefixes) + [rng.randrange(1, 5) for _ in range(rng.randint(1, 10))]
            r = row(f"r{step}", tokens)
            shared = kv.lookup(r)
            need = len(tokens) + 8
            if not kv.can_admit(r, need, shared):
                continue
            r.num_computed = kv.admit(r, need, shared)
            rows[r.request_id] = r
        else:  # a row computes its next positions (prefill or a decode step) and registers them
            r = rows[rng.choice(sorted(rows))]
            r.num_computed += kv.extend_shared(r) if r.num_computed < r.num_tokens - 1 else 0
            end = min(r.num_tokens, r.num_computed + rng.randint(1, 6))
            if end == r.num_tokens and len(r.token_ids) < r.num_prompt_tokens + 8:
                r.token_ids.append(rng.randrange(1, 5))  # a committed token, then its pending one
            kv.ensure(r.request_id, end)
            table = kv.table(r.request_id)
            for position in range(r.num_computed, end):
                block = table[position // BLOCK]
                assert kv.blocks[block].refcount == 1 or kv.blocks[block].key is None, "wrote a shared block"
                written = list(contents.get(block, (0,) * BLOCK))
                written[position % BLOCK] = r.token_ids[position]
                contents[block] = tuple(written)
            r.num_computed = end
            kv.register(r)
        check(kv, contents, rows)
    for request_id in list(rows):
        kv.free(request_id)
    assert kv.num_in_use == 0 and all(block.refcount == 0 for block in kv.blocks)


def test_a_shared_prefix_is_held_once_and_counted_once():
    kv = KVBlocks(num_blocks=16, block_size=BLOCK)
    prefix = list(range(1, 13))  # three full blocks
    first = row("a", prefix + [20, 21])
    kv.admit(first, 14, [])
    kv.ensure("a", 13)
    first.num_computed = 13
    kv.register(first)
    second = row("b", prefix + [30])
    shared = kv.lookup(second)
    assert shared == kv.table("a")[:3]
    assert kv.need(second, 13, shared) == 1  # only its own last block
    assert kv.admit(second, 13, shared) == 12
    assert kv.num_shared == 3 and kv.num_in_use == 4  # b's own block is promised, not yet taken


def test_a_registered_block_outlives_its_row_until_evicted_least_recent_first():
    kv = KVBlocks(num_blocks=4, block_size=BLOCK, max_cached_blocks=1)
    for name, first_token in (("a", 1), ("b", 2)):
        r = row(name, [first_token] * 9)
        kv.admit(r, 9, [])
        kv.ensure(name, 8)
        r.num_computed = 8
        kv.register(r)
        kv.free(name)
    assert kv.lookup(row("c", [1] * 9)) == []  # a's two blocks and b's first were evicted
    assert len(kv.lookup(row("d", [2] * 9))) == 1 and kv.read_counters().num_evicted == 3


def test_blocks_rows_shared_outlive_blocks_only_their_own_row_read():
    """Rows take turns between prefixes: P's rows a1 and a2 (P now shared), then b on a prefix Q no
    other row read. A row that needs eight cached blocks evicts both tails of P's rows and all of b's,
    not P, though P was cached before b's blocks were: plain least-recently-used would evict P."""
    kv = KVBlocks(num_blocks=12, block_size=BLOCK)
    prefix_p, prefix_q = [1] * 8, [2] * 8
    for name, tokens in (("a1", prefix_p + [3] * 8), ("a2", prefix_p + [4] * 8), ("b", prefix_q + [5] * 8),
                         ("z", [6] * 40)):
        r = row(name, [*tokens, 7])
        kv.admit(r, len(tokens), kv.lookup(r))
        kv.ensure(name, len(tokens))
        r.num_computed = len(tokens)
        kv.register(r)
        if name != "z":
            kv.free(name)
    assert kv.read_counters().num_evicted == 8
    assert len(kv.lookup(row("a3", [*prefix_p, 8, 9]))) == 2 and kv.lookup(row("b2", [*prefix_q, 8, 9])) == []


def test_a_lookup_confirms_tokens_not_only_the_key():
    kv = KVBlocks(num_blocks=8, block_size=BLOCK)
    r = row("a", [1, 2, 3, 4, 5])
    kv.admit(r, 5, [])
    kv.ensure("a", 4)
    r.num_computed = 4
    kv.register(r)
    block = kv.table("a")[0]
    kv.blocks[block].tokens = (9, 9, 9, 9)  # as if another block's tokens collided on the key
    assert kv.lookup(row("b", [1, 2, 3, 4, 6])) == []


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
def test_rows_sharing_a_long_system_prompt_fit_many_times_more(admission):
    """A 2,000-token system prompt before each row's 8-token question, a fixed KV budget: with the
    prompt's blocks shared, every row after the first holds only its own tail, so at least 4x as
    many rows run at once as when each holds its own copy (measured: the peak of running rows)."""
    system = [3 + (i % 50) for i in range(2000)]

    def peak_rows(share: bool) -> int:
        scheduler = make_scheduler(capacity=12_000, max_rows=64, max_tokens=4096, max_context=4096,
                                   admission=admission, prefix=share)
        loop = SimLoop(scheduler)
        for i in range(64):
            question = [60 + i, 61 + i // 7, 62, 63, 64, 65, 66, 67]
            loop.add(Row(f"r{i}", system + question, SamplingParams(max_new_tokens=16)))
        peak = 0

        def count(s, plan) -> None:
            nonlocal peak
            peak = max(peak, len(s.running))
            assert s.kv.num_in_use <= s.kv.num_blocks

        loop.run(check=count)
        assert len(loop.finished) == 64
        return peak

    shared, copied = peak_rows(share=True), peak_rows(share=False)
    print(f"{admission}: {shared} rows at once sharing, {copied} copying")
    assert shared >= 4 * copied
