"""The prefix-reuse rule without a model: which KV a row may copy, when it waits, and that a
random history of admissions, prefills, finishes and evictions never reuses a stale position."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.sched.prefix_cache import PrefixCache, RetainedPrefix, shared_length


@dataclass(eq=False)
class Holder:
    request_id: str
    prompt_ids: list[int]
    num_computed: int = 0
    num_draft_computed: int = 0


SHARED = list(range(100, 140))  # 40 tokens: 2 whole blocks of 16 and 8 more


def test_a_row_copies_the_computed_part_of_the_longest_match():
    cache = PrefixCache(16, uses_draft_cache=True, draft_from_target_features=False)
    first = Holder("a", SHARED + [1, 2, 3], num_computed=42, num_draft_computed=20)
    second = Holder("b", SHARED + [7, 8])
    cache.register(first)
    cache.register(second)
    reuse, wait = cache.plan(second)
    assert reuse is not None and not wait
    assert (reuse.start, reuse.end) == (0, 40)  # the match ends inside the third block
    assert (reuse.draft_start, reuse.draft_end) == (0, 20)  # the holder's draft cache lags
    assert reuse.holder is first


def test_a_row_never_reuses_its_pending_token():
    cache = PrefixCache(16, uses_draft_cache=False, draft_from_target_features=False)
    first = Holder("a", SHARED, num_computed=39)
    duplicate = Holder("b", list(SHARED))
    cache.register(first)
    cache.register(duplicate)
    reuse, _ = cache.plan(duplicate)
    assert reuse is not None and reuse.end == len(SHARED) - 1


def test_an_eagle_head_stops_reuse_below_the_last_shared_token_and_its_own_cover():
    cache = PrefixCache(16, uses_draft_cache=True, draft_from_target_features=True)
    first = Holder("a", SHARED + [1], num_computed=40, num_draft_computed=40)
    second = Holder("b", SHARED + [2])
    cache.register(first)
    cache.register(second)
    reuse, _ = cache.plan(second)
    assert reuse is not None and (reuse.end, reuse.draft_end) == (39, 39)
    first.num_draft_computed = 17
    reuse, _ = cache.plan(second)
    assert reuse is not None and (reuse.end, reuse.draft_end) == (17, 17)


def test_a_later_row_waits_for_an_earlier_one_computing_its_prefix_and_never_the_reverse():
    cache = PrefixCache(16, uses_draft_cache=False, draft_from_target_features=False)
    first, second = Holder("a", SHARED + [1]), Holder("b", SHARED + [2])
    cache.register(first)
    cache.register(second)
    assert cache.plan(first) == (None, False)  # the earlier row computes
    assert cache.plan(second) == (None, True)  # the later one waits for it
    first.num_computed = 16
    reuse, wait = cache.plan(second)
    assert reuse is not None and reuse.end == 16 and wait  # take what is there, wait for the rest
    first.num_computed = 41
    reuse, wait = cache.plan(second)
    assert reuse is not None and reuse.end == 40 and not wait


def test_a_finished_row_s_prefix_is_kept_in_its_slot_until_evicted():
    cache = PrefixCache(16, uses_draft_cache=False, draft_from_target_features=False)
    done = Holder("a", SHARED + [1], num_computed=44)
    cache.register(done)
    cache.retain(done, slot=3)
    later = Holder("b", SHARED + [5])
    reuse, wait = cache.plan(later)
    assert reuse is not None and isinstance(reuse.holder, RetainedPrefix) and reuse.end == 40 and not wait
    assert cache.claim_slot(later, [0, 3, 5]) == 3  # its copy is then a no-op
    assert cache.plan(later) == (None, False) and len(cache.index) == 0  # the slot is the row's now
    cache.register(done)
    cache.retain(done, slot=3)
    assert cache.claim_slot(Holder("c", [9] * 40), [0, 3]) == 0  # an empty slot before a kept one
    assert cache.claim_slot(Holder("d", [9] * 40), [3]) == 3 and not cache.retained


def test_short_prompts_and_unrelated_prompts_reuse_nothing():
    cache = PrefixCache(16, uses_draft_cache=False, draft_from_target_features=False)
    cache.register(Holder("a", list(range(10)), num_computed=9))
    cache.register(Holder("b", list(range(200, 240)), num_computed=39))
    assert cache.plan(Holder("c", list(range(10)) + [3])) == (None, False)  # under one block
    assert cache.plan(Holder("d", list(range(300, 340)))) == (None, False)


@st.composite
def histories(draw):
    prefixes = draw(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=40), min_size=1, max_size=3))
    prompts = [draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(0, 3), min_size=1, max_size=12))
               for _ in range(draw(st.integers(1, 10)))]
    events = draw(st.lists(st.tuples(st.sampled_from(["step", "finish", "evict"]), st.integers(0, 9)),
                           max_size=60))
    return prompts, events


@settings(max_examples=150, deadline=None, derandomize=True)
@given(histories(), st.sampled_from([4, 16]), st.booleans())
def test_reuse_never_reads_a_stale_or_foreign_position_and_every_row_finishes(history, block_size, eagle):
    """Rows are simulated as slots of token ids: a reuse copies the holder's slot, and every
    position a row ever holds must be its own prompt's token (nothing stale, nothing foreign)."""
    prompts, events = history
    cache = PrefixCache(block_size, uses_draft_cache=True, draft_from_target_features=eagle)
    slots: dict[int, list[int | None]] = {}  # slot -> the token whose KV each position holds
    rows = [Holder(f"r{i}", prompt) for i, prompt in enumerate(prompts)]
    slot_of: dict[str, int] = {}
    waiting = list(rows)

    def admit() -> None:
        while waiting and len(slot_of) < 3:
            row = waiting.pop(0)
            slot = cache.claim_slot(row, [s for s in range(4) if s not in slot_of.values()])
            slot_of[row.request_id] = slot
            slots.setdefault(slot, [None] * 64)
            cache.register(row)

    def step(row: Holder) -> None:
        reuse, wait = cache.plan(row)
        slot = slots[slot_of[row.request_id]]
        if reuse is not None:
            holder = reuse.holder
            source = slots[holder.slot if isinstance(holder, RetainedPrefix) else slot_of[holder.request_id]]
            assert shared_length(row.prompt_ids, holder.prompt_ids) >= reuse.end
            slot[reuse.start : reuse.end] = source[reuse.start : reuse.end]
            row.num_computed = reuse.end
            row.num_draft_computed = max(row.num_draft_computed, reuse.draft_end)
        if not wait and row.num_computed < len(row.prompt_ids) - 1:
            end = min(row.num_computed + 5, len(row.prompt_ids) - 1)
            slot[row.num_computed : end] = row.prompt_ids[row.num_computed : end]
            row.num_computed = row.num_draft_computed = end
        assert slot[: row.num_computed] == row.prompt_ids[: row.num_computed]

    def finish(row: Holder) -> None:
        slot = slot_of.pop(row.request_id)
        cache.retain(row, slot)

    for kind, index in events + [("drain", 0)] * 200:
        admit()
        running = [row for row in rows if row.request_id in slot_of]
        if not running:
            break
        row = running[index % len(running)]
        if kind == "evict" and cache.retained:
            cache.evict_slot(sorted(cache.retained)[index % len(cache.retained)])
        elif kind == "finish" and row.num_computed >= len(row.prompt_ids) - 1:
            finish(row)
        else:
            for running_row in running:
                step(running_row)
            for running_row in running:
                if running_row.num_computed >= len(running_row.prompt_ids) - 1:
                    finish(running_row)
    assert not waiting and not slot_of  # every row ran to the end: waiting never deadlocked
    for slot, kept in cache.retained.items():
        assert slots[slot][: kept.num_computed] == kept.prompt_ids[: kept.num_computed]
