"""The suffix drafter: its index (counts, matching, memory bound) and, on the tiny pair, greedy
output identical to the target's with drafts that come from earlier rows of the same job."""

from __future__ import annotations

import random

import pytest
from engine_helpers import MixedLookahead, assert_exact, greedy_reference, random_prompts, run_engine, tiny_config

from specbatch.config import DrafterConfig
from specbatch.core import Row, SamplingParams, Status
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.engine.suffix_drafter import MAX_IDLE_PREFIXES, SuffixDrafter
from specbatch.engine.suffix_index import BoundedSuffixIndex, GrowingSuffixIndex, SuffixIndex
from specbatch.loop import MemoryRecorder


def test_draft_follows_the_most_frequent_continuation_of_the_longest_match():
    index = SuffixIndex(max_depth=8)
    index.add([1, 2, 3, 4, 5])
    index.add([9, 2, 3, 7, 8])
    index.add([1, 2, 3, 4, 6])
    draft = index.draft([0, 1, 2, 3], max_tokens=4, min_prob=0.0, spec_factor=4.0)
    assert draft.match_len == 3 and draft.token_ids[:2] == [4, 5] or draft.token_ids[:2] == [4, 6]
    assert draft.probs[0] == 1.0  # "1 2 3" was followed by 4 both times
    assert draft.probs[1] == pytest.approx(0.5)
    weak = index.draft([0, 2, 3], max_tokens=4, min_prob=0.0, spec_factor=4.0)
    assert weak.match_len == 2 and weak.token_ids[0] == 4 and weak.probs[0] == pytest.approx(2 / 3)


def test_draft_length_follows_match_length_and_confidence():
    index = SuffixIndex(max_depth=16)
    index.add(list(range(10)))
    assert index.draft([2], max_tokens=8, min_prob=0.0, spec_factor=1.0).token_ids == [3]
    assert index.draft([1, 2], max_tokens=8, min_prob=0.0, spec_factor=2.0).token_ids == [3, 4, 5, 6]
    assert index.draft([1, 2], max_tokens=3, min_prob=0.0, spec_factor=9.0).token_ids == [3, 4, 5]
    assert index.draft([42], max_tokens=8, min_prob=0.0, spec_factor=9.0).token_ids == []
    index.add([2, 7])
    assert index.draft([2], max_tokens=8, min_prob=0.6, spec_factor=9.0).token_ids == []  # 3 or 7: 1/2 each


def test_remove_undoes_add():
    index = SuffixIndex(max_depth=6)
    rng = random.Random(0)
    sequences = [[rng.randrange(5) for _ in range(rng.randint(1, 30))] for _ in range(20)]
    for sequence in sequences:
        index.add(sequence)
    for sequence in sequences[::2]:
        index.remove(sequence)
    fresh = SuffixIndex(max_depth=6)
    for sequence in sequences[1::2]:
        fresh.add(sequence)
    assert index.num_nodes == fresh.num_nodes and index.num_tokens == fresh.num_tokens
    for sequence in sequences[1::2]:
        index.remove(sequence)
    assert index.num_nodes == 0 and index.num_tokens == 0 and not index.root.children


def test_a_growing_index_equals_the_whole_sequence_indexed_at_once():
    rng = random.Random(1)
    tokens = [rng.randrange(4) for _ in range(200)]
    grown, whole = GrowingSuffixIndex(max_depth=7), SuffixIndex(max_depth=7)
    for start in range(0, len(tokens), 13):
        grown.extend(tokens[start : start + 13])
    whole.add(tokens)
    assert grown.num_nodes == whole.num_nodes
    for end in range(1, len(tokens), 7):
        context = tokens[:end]
        assert grown.draft(context, 4, 0.0, 2.0) == whole.draft(context, 4, 0.0, 2.0)


def test_the_job_index_stays_bounded_on_a_long_job():
    index = BoundedSuffixIndex(max_depth=12, max_tokens=2_000)
    rng = random.Random(2)
    for _ in range(500):  # 500 outputs of up to 300 tokens: ~75,000 tokens through a 2,000-token index
        index.add([rng.randrange(1000) for _ in range(rng.randint(1, 300))])
        assert index.num_tokens <= 2_000
        assert index.num_nodes <= 12 * index.num_tokens
    latest = index.sequences[-1]
    assert index.draft(latest[:5], 4, 0.0, 1.0).token_ids  # what came last is still there


def _completed(request_id: str, prompt: list[int], output: list[int]) -> Row:
    row = Row(request_id, prompt, SamplingParams(max_new_tokens=len(output)), output=output)
    row.status = Status.COMPLETED
    return row


def test_completed_outputs_feed_later_rows_but_running_and_preempted_ones_do_not():
    drafter = SuffixDrafter(DrafterConfig(kind="suffix", suffix_max_depth=8))
    prompt = [5, 6, 7, 8]
    running = Row("a", prompt, SamplingParams(max_new_tokens=8), output=[20, 21, 22])
    drafter.forget(running)  # preempted: its tokens are not learnt
    assert drafter.job_index.num_tokens == 0
    drafter.forget(_completed("b", prompt, [20, 21, 22, 23]))
    assert drafter.best_draft(Row("c", prompt, SamplingParams(max_new_tokens=8)), 4).token_ids == [20, 21, 22, 23]
    assert drafter.job_index.num_tokens == 8  # the output with the prompt tokens before it (depth − 1 at most)


def test_a_row_drafts_from_earlier_occurrences_in_its_own_tokens_not_from_its_end():
    drafter = SuffixDrafter(DrafterConfig(kind="suffix"))
    row = Row("a", [1, 2, 3, 4, 1, 2], SamplingParams(max_new_tokens=8))
    assert drafter.best_draft(row, 4).token_ids == [3, 4]  # "1 2" -> 3 4, then "1 2" again: spec_factor 1 x 2
    assert drafter.best_draft(Row("b", [1, 2, 3], SamplingParams(max_new_tokens=8)), 4).token_ids == []


@pytest.fixture(scope="module")
def repeated_requests(tiny_pair):
    """Twelve requests over four prompts, so that rows repeat what earlier rows produced."""
    prompts = random_prompts(tiny_pair[2], 4, seed=11)
    requests = [(prompt, 20) for _ in range(3) for prompt, _ in prompts]
    models = load_models(tiny_config(tiny_pair))
    tokenizer = tiny_pair[2]
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    return requests, refs


@pytest.mark.parametrize("batch", [1, 7, 32])
@pytest.mark.parametrize("lookahead", ["fixed:2", "fixed:6", "mixed"])
def test_greedy_exact_and_later_rows_accept_earlier_outputs(tiny_pair, repeated_requests, batch, lookahead):
    requests, refs = repeated_requests
    policy = MixedLookahead() if lookahead == "mixed" else None
    config = tiny_config(tiny_pair, "drafter.kind=suffix", f"scheduler.max_batch_rows={batch}",
                         f"scheduler.lookahead={'fixed:8' if policy else lookahead}", "scheduler.prefill_chunk=fixed:7")
    rows, recorder, _ = run_engine(config, requests, lookahead=policy)
    assert_exact(rows, refs)
    if batch == 1 and policy is None:  # every repeat runs after the row it repeats completed
        k = int(lookahead.split(":")[1])
        repeats = [rows[f"r{i}"] for i in range(4, len(requests))]
        accepted = sum(r.num_accepted for r in repeats)
        assert accepted >= 0.95 * sum(r.num_proposed for r in repeats)
        # each round commits up to k drafts and one target token: drafts cover nearly all they can
        assert accepted >= 0.8 * k / (k + 1) * sum(r.num_output_tokens - 1 for r in repeats)


def test_rows_join_and_leave_mid_run(tiny_pair, repeated_requests):
    requests, refs = repeated_requests
    config = tiny_config(tiny_pair, "drafter.kind=suffix", "scheduler.max_batch_rows=3",
                         "scheduler.prefill_chunk=fixed:5", "scheduler.lookahead=fixed:3")
    engine = build_hf_engine(config, load_models(config), MemoryRecorder())
    rows = [Row(f"r{i}", p, SamplingParams(max_new_tokens=m)) for i, (p, m) in enumerate(requests)]
    for row in rows[:2]:
        engine.add(row)
    for round_index in range(300):
        if round_index % 4 == 0 and round_index // 4 + 2 < len(rows):
            engine.add(rows[round_index // 4 + 2])
        engine.step()
    engine.run()
    assert_exact({r.request_id: r for r in rows}, refs)
    assert sum(r.num_accepted for r in rows) > 0


def test_rows_that_share_a_prompt_block_index_it_once_and_draft_as_if_each_held_it():
    drafter = SuffixDrafter(DrafterConfig(kind="suffix", suffix_max_depth=8))
    rng = random.Random(3)
    block = [rng.randrange(50) for _ in range(150)]  # shared as 128 tokens: two granules of 64
    rows = [Row(f"r{i}", block + [rng.randrange(50) for _ in range(20)], SamplingParams(max_new_tokens=8))
            for i in range(4)]
    indexed = []
    for row in rows:
        before = drafter.num_indexed
        draft = drafter.best_draft(row, 4)
        indexed.append(drafter.num_indexed - before)
        whole = GrowingSuffixIndex(8)
        whole.extend(row.token_ids[:-1])
        assert draft == whole.draft(row.token_ids, 4, drafter.min_prob, drafter.spec_factor)
    # the first row indexes itself whole; the second builds the shared 128 tokens and primes past them
    # (7 lead-in tokens); the rest only prime and index their own 41 tokens
    assert indexed == [169, 128 + 7 + 41, 7 + 41, 7 + 41]
    assert [p.num_rows for p in drafter.prefixes.entries.values()] == [3]
    for row in rows:
        drafter.forget(row)
    assert [p.num_rows for p in drafter.prefixes.entries.values()] == [0]  # idle, kept for later rows
    later = Row("later", block + [1, 2, 3], SamplingParams(max_new_tokens=8))
    before = drafter.num_indexed
    drafter.best_draft(later, 4)
    assert drafter.num_indexed - before == 7 + 150 - 128 + 2


def test_greedy_exact_with_rows_sharing_a_long_prompt_block(tiny_pair):
    tokenizer, rng = tiny_pair[2], random.Random(4)
    block = [rng.randrange(3, 300) for _ in range(40)] * 4  # a few-shot block: 160 tokens that repeat
    requests = [(block + [rng.randrange(3, 300) for _ in range(5)], 16) for _ in range(9)]
    models = load_models(tiny_config(tiny_pair))
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    config = tiny_config(tiny_pair, "drafter.kind=suffix", "scheduler.max_batch_rows=4",
                         "scheduler.lookahead=fixed:4", "scheduler.prefill_chunk=fixed:64")
    rows, recorder, engine = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    assert sum(r.num_accepted for r in recorder.rounds) > 0
    assert [len(prefix.tokens) for prefix in engine.backend.drafter.prefixes.entries.values()] == [128]


def test_shared_prefixes_no_row_uses_are_bounded():
    drafter = SuffixDrafter(DrafterConfig(kind="suffix", suffix_max_depth=8))
    rng = random.Random(5)
    for block in range(20):  # twenty blocks, each shared by two rows that then finish
        prompt = [rng.randrange(1000) for _ in range(70)]
        rows = [Row(f"b{block}-{i}", prompt + [i], SamplingParams(max_new_tokens=4)) for i in range(2)]
        for row in rows:
            drafter.best_draft(row, 2)
        for row in rows:
            drafter.forget(row)
    assert len(drafter.prefixes.entries) == MAX_IDLE_PREFIXES and not drafter.row_prefixes
