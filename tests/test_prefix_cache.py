"""The prefix-reuse rule without a model: which KV a row may copy, when it waits, and that a
random history of admissions, prefills, finishes and evictions never reuses a stale position."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.sched.prefix_cache import PrefixCache, RetainedPrefix, copy_order, shared_length


@dataclass(eq=False)
class Holder:
    """A row as the prefix cache reads it: a prompt and no output."""

    request_id: str
    token_ids: list[int]
    num_computed: int = 0
    num_draft_computed: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids


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
    cache.register(later)
    reuse, wait = cache.plan(later)
    assert reuse is not None and isinstance(reuse.holder, RetainedPrefix) and reuse.end == 40 and not wait
    cache.pin_sources([reuse])
    assert cache.claim_slot(Holder("x", [8] * 40), [3, 5]) == 5  # another row's copy reads slot 3
    assert cache.claim_slot(later, [0, 3]) == 3  # its copy is then a no-op
    cache.pin_sources([])
    assert cache.plan(later) == (None, False) and len(cache.index) == 1  # the slot is the row's now
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


@settings(max_examples=200, deadline=None, derandomize=True)
@given(histories(), st.sampled_from([4, 16]), st.booleans())
def test_reuse_never_reads_a_stale_or_foreign_position_and_every_row_finishes(history, block_size, eagle):
    """Rounds as the engine runs them, on slots of token ids: admit (register), plan every copy,
    claim slots for the admitted rows, run the copies in `copy_order`, then the passes write. Every
    position a row ever holds must be its own prompt's token: nothing stale, nothing foreign."""
    prompts, events = history
    cache = PrefixCache(block_size, uses_draft_cache=True, draft_from_target_features=eagle)
    num_slots = 3
    slots: dict[int, list[int | None]] = {slot: [None] * 64 for slot in range(num_slots)}
    rows = [Holder(f"r{i}", prompt) for i, prompt in enumerate(prompts)]
    slot_of: dict[str, int] = {}
    waiting, running = list(rows), []

    def source_and_destination(copy) -> tuple[int, int]:
        holder = copy.holder
        source = holder.slot if isinstance(holder, RetainedPrefix) else slot_of[holder.request_id]
        return source, slot_of[copy.row.request_id]

    def round_(finish_one: int | None, evict: int | None) -> None:
        admitted = []
        while waiting and len(running) < num_slots:
            admitted.append(row := waiting.pop(0))
            running.append(row)
            cache.register(row)
        copies, held_back = [], set()
        for row in running:
            if row.num_computed < len(row.prompt_ids) - 1:
                copy, wait = cache.plan(row)
                if copy is not None:
                    copies.append(copy)
                    row.num_computed = copy.end
                    row.num_draft_computed = max(row.num_draft_computed, copy.draft_end)
                if wait:
                    held_back.add(row.request_id)
        cache.pin_sources(copies)
        for row in admitted:
            taken = set(slot_of.values())
            slot_of[row.request_id] = cache.claim_slot(row, [s for s in range(num_slots) if s not in taken])
        for copy in copy_order(copies):
            source, destination = source_and_destination(copy)
            holder_prompt = copy.holder.token_ids[: copy.holder.num_prompt_tokens]
            assert shared_length(copy.row.prompt_ids, holder_prompt) >= copy.end
            slots[destination][copy.start : copy.end] = slots[source][copy.start : copy.end]
        for row in running:  # the passes: a chunk of 5, or garbage past the end for a row held back
            slot = slots[slot_of[row.request_id]]
            if row.request_id not in held_back and row.num_computed < len(row.prompt_ids) - 1:
                end = min(row.num_computed + 5, len(row.prompt_ids) - 1)
                slot[row.num_computed : end] = row.prompt_ids[row.num_computed : end]
                row.num_computed = row.num_draft_computed = end
            slot[row.num_computed] = -1  # the verify pass writes its pending token's position
            assert slot[: row.num_computed] == row.prompt_ids[: row.num_computed]
        if evict is not None and cache.retained:
            cache.evict_slot(sorted(cache.retained)[evict % len(cache.retained)])
        for row in list(running):
            done = row.num_computed >= len(row.prompt_ids) - 1
            if done and (finish_one is None or row is running[finish_one % len(running)]):
                running.remove(row)
                slot = slot_of.pop(row.request_id)
                slots[slot][row.num_computed] = None  # the pending token's position is not the prompt's
                cache.retain(row, slot)

    for kind, index in events + [("drain", 0)] * 200:
        if not waiting and not running:
            break
        round_(index if kind == "finish" else None, index if kind == "evict" else None)
    assert not waiting and not running  # every row ran to the end: waiting never deadlocked
    for slot, kept in cache.retained.items():
        assert slots[slot][: kept.num_computed] == kept.token_ids[: kept.num_computed]
