"""Stops inside an accepted block, and the accounting identities of DESIGN §7.3–7.5."""

from __future__ import annotations

from collections import defaultdict

import pytest
from engine_helpers import greedy_reference, random_prompts, run_engine, tiny_config

from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.loop import MemoryRecorder


@pytest.fixture(scope="module")
def identical_draft_config(tiny_pair):
    """Draft = target: every draft is accepted, so stops always land inside accepted blocks."""
    target, _, tokenizer = tiny_pair
    return tiny_config((target, target, tokenizer), "scheduler.lookahead=fixed:6")


def test_eos_inside_accepted_block_truncates(tiny_pair, identical_draft_config):
    models = load_models(identical_draft_config)
    tokenizer = tiny_pair[2]
    prompt = random_prompts(tokenizer, 1, seed=11, max_len=10)[0][0]
    ref = greedy_reference(models.target, prompt, 20, tokenizer.eos_token_id, tokenizer.pad_token_id)
    stop_token = ref[3]
    engine = build_hf_engine(identical_draft_config, models, MemoryRecorder())
    engine.stops.eos_token_ids = {stop_token}
    row = Row("a", prompt, SamplingParams(max_new_tokens=20))
    engine.add(row)
    engine.run()
    cut = ref.index(stop_token) + 1
    assert row.output_ids == ref[:cut] and row.finish_reason == "eos"
    step_committed = sum(s.num_committed for s in engine.recorder.steps)
    assert step_committed == cut  # tokens past EOS are not committed
    assert sum(s.num_accepted for s in engine.recorder.steps) + len(engine.recorder.steps) > cut


def test_stop_string_inside_accepted_block(tiny_pair, identical_draft_config):
    models = load_models(identical_draft_config)
    tokenizer = tiny_pair[2]
    prompt = random_prompts(tokenizer, 1, seed=12, max_len=10)[0][0]
    ref = greedy_reference(models.target, prompt, 24, tokenizer.eos_token_id, tokenizer.pad_token_id)
    full_text = tokenizer.decode(ref, skip_special_tokens=True)
    stop = tokenizer.decode(ref[4:6], skip_special_tokens=True)
    engine = build_hf_engine(identical_draft_config, models, MemoryRecorder())
    row = Row("b", prompt, SamplingParams(max_new_tokens=24, stop=(stop,)))
    engine.add(row)
    engine.run()
    first_hit = next(i for i in range(1, len(ref) + 1) if stop in tokenizer.decode(ref[:i], skip_special_tokens=True))
    assert row.output_ids == ref[:first_hit]
    assert row.finish_reason == "stop"
    result = engine.recorder.results[0]
    assert result.text == full_text[: full_text.index(stop)]


def test_max_new_tokens_inside_block(tiny_pair, identical_draft_config):
    requests = [(p, m) for p, m in random_prompts(tiny_pair[2], 6, seed=13)]
    rows, recorder, _ = run_engine(identical_draft_config, [(p, 3) for p, _ in requests])
    assert all(len(row.output_ids) <= 3 for row in rows.values())
    assert all(row.finish_reason in ("length", "eos") for row in rows.values())


@pytest.mark.parametrize("drafter", ["draft", "ngram", "none"])
def test_accounting_identities(tiny_pair, drafter):
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", "scheduler.max_batch_rows=6",
                         "scheduler.prefill_chunk=fixed:8", "buckets.query_len=[4,8]")
    requests = random_prompts(tiny_pair[2], 15, seed=14)
    rows, recorder, engine = run_engine(config, requests)
    steps_by_round = defaultdict(list)
    for step in recorder.steps:
        steps_by_round[step.round_index].append(step)
    for record in recorder.rounds:
        steps = steps_by_round[record.round_index]
        assert record.num_committed == sum(s.num_committed for s in steps)
        assert record.num_accepted == sum(s.num_accepted for s in steps)
        assert record.num_proposed == sum(s.num_proposed for s in steps)
        # committed = accepted + verified rows that did not hit a stop early
        assert record.num_committed <= record.num_accepted + record.num_decode_rows
        for s in steps:
            finished_early = s.num_committed < s.num_accepted + 1
            assert s.num_committed == s.num_accepted + 1 or finished_early
        assert record.num_target_rows == sum(1 + s.num_proposed for s in steps) + record.num_prefill_tokens
        assert record.num_padded_target_rows >= 0 and record.num_padded_draft_rows >= 0
        assert record.kv_tokens_in_use <= record.kv_tokens_capacity
        if drafter != "draft":
            assert record.num_draft_rows == 0
    # Σ over rounds equals the per-request totals; every request once in results
    assert sum(r.num_committed for r in recorder.rounds) == sum(len(row.output_ids) for row in rows.values())
    assert sum(r.num_target_rows for r in recorder.rounds) == sum(q.num_target_rows for q in recorder.requests)
    assert sum(r.num_draft_rows for r in recorder.rounds) == sum(q.num_draft_rows for q in recorder.requests)
    assert sum(r.num_proposed for r in recorder.rounds) == sum(q.num_proposed for q in recorder.requests)
    assert sorted(r.request_id for r in recorder.results) == sorted(rows)


def test_kv_capacity_never_exceeded_and_oversized_request_dropped(tiny_pair):
    config = tiny_config(tiny_pair, "capacity.kv_tokens=120", "scheduler.max_batch_rows=8")
    requests = random_prompts(tiny_pair[2], 10, seed=15) + [([5] * 100, 50)]
    rows, recorder, _ = run_engine(config, requests)
    assert all(r.kv_tokens_in_use <= 120 for r in recorder.rounds)
    dropped = [r for r in recorder.results if r.status == "dropped"]
    assert [r.request_id for r in dropped] == ["r10"] and dropped[0].drop_reason == "exceeds_kv_capacity"
    assert len(recorder.results) == 11


def test_optimistic_admission_preempts_by_recompute_and_stays_exact(tiny_pair):
    target, _, tokenizer = tiny_pair
    requests = random_prompts(tokenizer, 10, seed=16)
    base = tiny_config(tiny_pair, "scheduler.max_batch_rows=8")
    models = load_models(base)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    config = tiny_config(tiny_pair, "capacity.kv_tokens=110", "capacity.admission=optimistic",
                         "scheduler.max_batch_rows=8")
    rows, recorder, _ = run_engine(config, requests, models=models)
    assert [rows[f"r{i}"].output_ids for i in range(10)] == refs
    assert all(r.kv_tokens_in_use <= 110 for r in recorder.rounds)
    assert sum(q.num_preemptions for q in recorder.requests) > 0
