"""Invariant 1 with shared prefixes: a row whose block table points at another's prompt blocks
decodes exactly as the target alone, for every drafter, rows joining and leaving, prefixes ending
inside a block, cached blocks evicted and recomputed, and prefixes prefilled in other chunk sizes;
and it computes the shared part once."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from engine_helpers import assert_exact, greedy_reference, run_engine, tiny_config

from specbatch.data.prefix_groups import key_tree_positions, shared_prefix_keys
from specbatch.engine.build import load_models
from specbatch.sched.roundcost import draft_lag

NUM_PROMPTS = 24


def shared_prefix_prompts(tokenizer, n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Prompts over three prefixes of 21, 40 and 57 tokens (ending inside 16-token blocks),
    interleaved, each with a unique suffix of 1-9 tokens; two prompts repeat another whole."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    prefixes = [[rng.randrange(2, vocab) for _ in range(length)] for length in (21, 40, 57)]
    prompts = [(prefixes[i % 3] + [rng.randrange(2, vocab) for _ in range(rng.randint(1, 9))], rng.randint(2, 20))
               for i in range(n)]
    prompts[5] = (list(prompts[2][0]), 12)
    prompts[9] = (list(prompts[3][0]), 7)
    return prompts


@pytest.fixture(scope="module")
def references(tiny_pair):
    models = load_models(tiny_config(tiny_pair))
    tokenizer = tiny_pair[2]
    requests = shared_prefix_prompts(tokenizer, NUM_PROMPTS)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    return requests, refs


def run_with_reuse(config, requests):
    """The requests through one engine whose pool has room for their shared prefixes, as a job's has."""
    room = key_tree_positions(shared_prefix_keys([prompt for prompt, _ in requests]))
    rows, recorder, engine = run_engine(config, requests, shared_prefix_tokens=room)
    reused = sum(row.num_reused_tokens for row in rows.values())
    prefilled = sum(record.num_prefill_tokens for record in recorder.rounds)
    return rows, reused, prefilled, engine


@pytest.mark.parametrize("drafter", ["none", "ngram", "draft"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_greedy_exact_with_shared_prefixes_reused(tiny_pair, references, drafter, batch):
    requests, refs = references
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                         "scheduler.prefill_chunk=fixed:13")
    rows, reused, prefilled, _ = run_with_reuse(config, requests)
    assert_exact(rows, refs)
    prompt_tokens = sum(len(p) for p, _ in requests)
    assert reused + prefilled + len(requests) == prompt_tokens  # copied, computed, or the pending token
    assert reused > prompt_tokens / 2  # three interleaved prefixes, each kept while the others' rows run


def test_rows_that_share_a_prefix_share_its_draft_kv_too(tiny_pair, references):
    """A row that catches up on blocks another row computed meanwhile (held back while a batch
    admitted at once computes the prefix once) takes the draft model's KV of them where the donor
    computed it, instead of prefilling the draft model on the whole prompt again; that KV is the
    donor's, so every row's drafts, and what the target accepts of them, are those of reuse off."""
    requests, refs = references
    settings = ["drafter.kind=draft", "scheduler.lookahead=fixed:3", "scheduler.max_batch_rows=8",
                "scheduler.prefill_chunk=fixed:13"]
    shared_rows, shared_recorder, _ = run_engine(tiny_config(tiny_pair, *settings), requests)
    alone_rows, alone_recorder, _ = run_engine(tiny_config(tiny_pair, *settings, "cache.prefix=false"), requests)
    assert_exact(shared_rows, refs)
    assert {r: row.accept_history for r, row in shared_rows.items()} == \
        {r: row.accept_history for r, row in alone_rows.items()}
    draft_rows = [sum(record.num_draft_rows for record in recorder.rounds)
                  for recorder in (shared_recorder, alone_recorder)]
    reused = sum(row.num_reused_tokens for row in shared_rows.values())
    assert draft_rows[0] == draft_rows[1] - reused  # every position reused for the target is for the draft


@dataclass
class PlainThenDraft:
    """Test policy: plain decoding, its prefills filling no draft cache, for the first `num_plain`
    choices; then k = 3 for each row whose draft cache is current and 0 for one that lags (as a policy
    pricing its catch-up too dear would)."""

    num_plain: int = 3
    num_chosen: int = 0
    name: str = "plain-then-draft"

    def choose(self, rows, caps):
        self.num_chosen += 1
        if self.num_chosen <= self.num_plain:
            return [0 for _ in rows]
        return [min(3, cap) if draft_lag(row) <= 1 else 0 for row, cap in zip(rows, caps, strict=True)]

    def drafts_when_current(self, rows, caps):
        return self.num_chosen > self.num_plain


def test_a_prefill_fills_only_current_draft_caches(tiny_pair, references):
    """Rows whose draft cache lags (prefilled while nothing drafted, or onto shared blocks whose donor
    computed no draft KV) are not caught up by a prefill that fills the draft cache: that would
    recompute a shared prefix in the draft model once per row. A row catches up only by drafting, the
    policy's priced choice. Every round's draft prefill covers exactly the current rows' chunks."""
    requests, refs = references
    checked = {"lagging": 0}

    def check_draft_prefill(engine) -> None:
        engine.scheduler.draft.cost_fit = None  # no probe: it would catch its row up
        execute = engine.backend.execute

        def checked_execute(plan):
            current = sum(size for row, size in plan.prefill if row.num_draft_computed >= row.num_computed)
            outcome = execute(plan)
            if plan.draft_prefill:
                assert outcome.num_draft_prefill_positions == current
                checked["lagging"] += sum(row.num_draft_computed < row.num_computed for row, _ in plan.prefill)
            return outcome
        engine.backend.execute = checked_execute

    settings = ["drafter.kind=draft", "scheduler.max_batch_rows=8", "scheduler.prefill_chunk=fixed:13"]
    rows, _, _ = run_engine(tiny_config(tiny_pair, *settings), requests, lookahead=PlainThenDraft(),
                            prepare=check_draft_prefill)
    assert_exact(rows, refs)
    assert checked["lagging"] > 0, "no lagging row was prefilled while the draft cache was filled"


def test_eagle_rows_share_no_blocks_and_stay_exact(tiny_pair, tiny_eagle, references):
    """An EAGLE head's cache at a position was fed the target's hidden state there, which a row
    sharing the block never computed: with EAGLE every row computes its own prefix."""
    requests, refs = references
    config = tiny_config(tiny_pair, "drafter.kind=eagle", f"models.eagle={tiny_eagle}",
                         "scheduler.max_batch_rows=5", "scheduler.prefill_chunk=fixed:11")
    rows, reused, _, _ = run_with_reuse(config, requests)
    assert_exact(rows, refs)
    assert reused == 0


def test_reuse_off_prefills_every_prompt_and_decodes_the_same(tiny_pair, references):
    requests, refs = references
    config = tiny_config(tiny_pair, "cache.prefix=false", "scheduler.max_batch_rows=4")
    rows, reused, prefilled, _ = run_with_reuse(config, requests)
    assert_exact(rows, refs)
    assert reused == 0 and prefilled == sum(len(p) - 1 for p, _ in requests)


def test_a_prefix_prefilled_in_other_chunk_sizes_and_kept_in_a_free_slot_is_reused_exactly(tiny_pair, references):
    """Batch 1, rows grouped by prefix (as ingest sorts them): no two rows run together, so every
    hit is on a finished row's cached blocks; its prefix was prefilled in chunks of 7 across blocks."""
    requests, refs = references
    order = sorted(range(len(requests)), key=lambda i: (i % 3, i))
    requests, refs = [requests[i] for i in order], [refs[i] for i in order]
    config = tiny_config(tiny_pair, "drafter.kind=none", "scheduler.max_batch_rows=1",
                         "scheduler.prefill_chunk=fixed:7", "cache.prefix_block_tokens=4")
    rows, reused, _, _ = run_with_reuse(config, requests)
    assert_exact(rows, refs)
    assert reused > 0


def test_an_evicted_prefix_is_computed_again_exactly(tiny_pair, references):
    """A byte budget of a few positions: no finished row's blocks stay cached, so interleaved prefixes
    at batch 1 are computed again each time, and outputs do not change."""
    requests, refs = references
    config = tiny_config(tiny_pair, "drafter.kind=none", "scheduler.max_batch_rows=1", "cache.prefix_kv_bytes=1")
    rows, reused, prefilled, _ = run_with_reuse(config, requests)
    assert_exact(rows, refs)
    assert reused == 0 and prefilled == sum(len(p) - 1 for p, _ in requests)


def test_rows_joining_and_leaving_mid_run_reuse_exactly(tiny_pair, references):
    from specbatch.core import Row, SamplingParams
    from specbatch.engine.build import build_hf_engine
    from specbatch.loop import MemoryRecorder

    requests, refs = references
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=3", "scheduler.prefill_chunk=fixed:5")
    engine = build_hf_engine(config, load_models(config), MemoryRecorder())
    rows = {f"r{i}": Row(f"r{i}", prompt, SamplingParams(max_new_tokens=m)) for i, (prompt, m) in enumerate(requests)}
    pending = list(rows.values())
    while pending or engine.scheduler.has_work:
        for row in pending[:2]:
            engine.add(row)
        pending = pending[2:]
        if engine.scheduler.has_work:
            engine.step()
    assert_exact(rows, refs)
    assert sum(row.num_reused_tokens for row in rows.values()) > 0


@pytest.mark.parametrize(("drafter", "coupling", "temperature", "top_p"),
                         [("draft", "rejection", 1.0, 1.0), ("draft", "gumbel", 0.7, 0.9)])
def test_sampled_rows_that_copy_their_prompt_follow_the_target_law(small_vocab_pair, small_vocab_eagle, drafter,
                                                                   coupling, temperature, top_p):
    """Every row shares the test prompt's first block of 4, so all but the first rows point at it."""
    from test_sampling import assert_follows, sample_outputs

    rows, _, law, vocab = sample_outputs(small_vocab_pair, drafter, coupling, 2, temperature, top_p, 3000,
                                         eagle=small_vocab_eagle, overrides=("cache.prefix_block_tokens=4",))
    assert sum(row.num_reused_tokens > 0 for row in rows) > len(rows) // 2
    assert_follows(rows, law, vocab, 2)


def test_gumbel_seeded_outputs_are_the_same_with_reuse_on_and_off(tiny_pair, references):
    from test_coupling import sampled_outputs

    requests, _ = references
    models = load_models(tiny_config(tiny_pair))
    alone = tiny_config(tiny_pair, "sampling.coupling=gumbel", "drafter.kind=none", "scheduler.max_batch_rows=1",
                        "cache.prefix=false")
    reusing = tiny_config(tiny_pair, "sampling.coupling=gumbel", "drafter.kind=draft", "scheduler.max_batch_rows=5")
    assert sampled_outputs(reusing, requests, models) == sampled_outputs(alone, requests, models)
