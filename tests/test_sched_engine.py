"""Invariant 1 under every scheduling policy: greedy output equals the target's own greedy decoding
whatever the order (with its preemptions by recompute), lookahead, prefill chunking and packing."""

from __future__ import annotations

import pytest
from engine_helpers import assert_exact, greedy_reference, random_prompts, run_engine, tiny_config

from specbatch.engine.build import load_models

NUM_PROMPTS = 6
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def full_setup(tiny_pair):
    """Requests with max_new_tokens up to 24 and the target's greedy outputs for them."""
    models = load_models(tiny_config(tiny_pair))
    tokenizer = tiny_pair[2]
    requests = random_prompts(tokenizer, NUM_PROMPTS, seed=21)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    return models, requests, refs


@pytest.fixture(scope="module")
def setup(full_setup):
    """The same requests cut to MAX_NEW_TOKENS: greedy output with a smaller budget is a prefix."""
    models, requests, refs = full_setup
    cut = [min(m, MAX_NEW_TOKENS) for _, m in requests]
    cut_requests = [(p, c) for (p, _), c in zip(requests, cut, strict=True)]
    return models, cut_requests, [r[:c] for r, c in zip(refs, cut, strict=True)]


@pytest.mark.parametrize("order", ["fcfs", "sjf", "laps-sd", "specbatch"])
@pytest.mark.parametrize("lookahead", ["adaptive", "slack"])
def test_every_policy_keeps_greedy_output_exact(tiny_pair, setup, order, lookahead):
    models, requests, refs = setup
    # no cost refit on wall time: it would make whether laps-sd preempts depend on the machine's speed
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=3", f"scheduler.order={order}",
                         f"scheduler.lookahead={lookahead}", "scheduler.prefill_chunk=deadline",
                         "scheduler.tpot_slo_ms=9", "scheduler.max_lookahead=3",
                         "scheduler.learn_cost=false")
    rows, recorder, _ = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    assert all(r.plan_ms > 0 for r in recorder.rounds)
    if order == "laps-sd":  # new rows (least attained service) take the place of served ones
        assert sum(q.num_preemptions for q in recorder.requests) > 0


def test_packing_under_buckets_and_a_tight_token_budget_stays_exact(tiny_pair, setup):
    models, requests, refs = setup
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=6", "scheduler.max_round_tokens=20",
                         "scheduler.lookahead=adaptive", "scheduler.max_lookahead=3", "buckets.batch_rows=[2,4]",
                         "buckets.query_len=[2,4]")
    rows, recorder, _ = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    assert all(r.num_target_rows <= 20 for r in recorder.rounds)


def test_specbatch_order_with_optimistic_admission_preempts_and_stays_exact(tiny_pair, full_setup):
    models, requests, refs = full_setup
    config = tiny_config(tiny_pair, "capacity.kv_tokens=70", "capacity.admission=optimistic",
                         "scheduler.max_batch_rows=8", "scheduler.order=specbatch", "scheduler.lookahead=adaptive",
                         "scheduler.max_lookahead=3")
    rows, recorder, _ = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    assert all(r.kv_tokens_in_use <= 70 for r in recorder.rounds)
    assert sum(q.num_preemptions for q in recorder.requests) > 0
