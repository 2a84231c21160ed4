"""SimBackend: the same RoundOutcome as HFBackend, so the unchanged Engine records the same rounds."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import random_prompts, run_engine, tiny_config

from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.loop import MemoryRecorder
from specbatch.sched.costmodel import CostModel
from specbatch.sim.acceptance import DomainAcceptance, DrafterAcceptance, ReplayAcceptance
from specbatch.sim.backend import SIM_EOS_TOKEN_ID
from specbatch.sim.worker import build_sim_engine

COST = CostModel(intercept_ms=1.0, target_passes=2.0, target_rows=0.5, draft_passes=0.25, draft_rows=0.125,
                 kv_tokens_read=0.001)
HOST_TIMES = {"plan_ms", "commit_ms", "prefill_ms", "draft_ms", "verify_ms", "round_ms", "started_s"}


def sim_run(config, rows, outputs, acceptance, cost=COST, **options):
    """The rows through a simulated engine; `options` go to `build_sim_engine`."""
    recorder = MemoryRecorder()
    engine, clock = build_sim_engine(config, cost, acceptance, outputs, recorder, **options)
    for row in rows:
        engine.add(row)
    engine.run()
    return recorder, clock


def counters(record) -> dict:
    return {k: v for k, v in dataclasses.asdict(record).items() if k not in HOST_TIMES}


@pytest.mark.parametrize("draft_is_target", [False, True])
def test_rounds_match_the_real_backend(tiny_pair, draft_is_target, one_thread):
    """Replaying the real job's acceptance, every round's work counters (rows, padding, passes,
    draft rows, KV read, proposed/accepted/committed) and every request's are the real ones.
    A draft equal to the target accepts every block, so draft catch-up passes are ragged (padded)."""
    target, draft, tokenizer = tiny_pair
    pair = (target, target if draft_is_target else draft, tokenizer)
    config = tiny_config(pair, "scheduler.max_batch_rows=5",
                         "scheduler.lookahead=fixed:2", "scheduler.prefill_chunk=fixed:12",
                         "buckets.batch_rows=[2,4,8]", "buckets.query_len=[4,8,16]", "buckets.kv_len_multiple=16",
                         "capacity.max_context=256")
    requests = random_prompts(tiny_pair[2], 12, seed=5)
    real_rows, real, _ = run_engine(config, requests)
    assert sum(r.num_padded_target_rows for r in real.rounds) == 0  # flat passes
    assert any(r.num_prefill_rows and r.num_decode_rows for r in real.rounds)  # chunked prefill beside decode
    if not draft_is_target:
        assert 0 < sum(r.num_accepted for r in real.rounds) < sum(r.num_proposed for r in real.rounds)
    histories: dict[str, list] = {}
    starts: dict[str, list] = {}
    for step in real.steps:
        histories.setdefault(step.request_id, []).append((step.num_accepted, step.num_proposed))
        starts.setdefault(step.request_id, []).append(step.num_output_tokens - step.num_committed)
    outputs = {rid: (row.num_output_tokens, row.finish_reason == "eos") for rid, row in real_rows.items()}
    rows = [Row(f"r{i}", prompt, SamplingParams(max_new_tokens=m)) for i, (prompt, m) in enumerate(requests)]
    # real prompts: their blocks are shared and cached as the real job's (outputs are filler, but a block
    # that holds them is only registered, never matched: no later prompt starts with it)
    sim, _ = sim_run(config, rows, outputs, ReplayAcceptance(histories, starts), shared_prefixes=True)
    assert [counters(r) for r in sim.rounds] == [counters(r) for r in real.rounds]
    times = {"arrival_s": 0, "admitted_s": 0, "first_token_s": 0, "finished_s": 0}
    real_requests = {r.request_id: counters(r) | times for r in real.requests}
    assert {r.request_id: counters(r) | times for r in sim.requests} == real_requests


def test_eos_length_and_virtual_clock():
    config = load_config(None, ["capacity.max_context=64", "scheduler.lookahead=fixed:4", "buckets.kv_len_multiple=8"])
    rows = [Row("eos", [1] * 5, SamplingParams(max_new_tokens=20)),
            Row("len", [1] * 3, SamplingParams(max_new_tokens=7))]
    outputs = {"eos": (6, True), "len": (7, False)}
    recorder, clock = sim_run(config, rows, outputs, DomainAcceptance({"*": (1.0, 1.0)}))
    eos, length = rows
    assert eos.finish_reason == "eos" and eos.output_ids[-1] == SIM_EOS_TOKEN_ID and eos.num_output_tokens == 6
    assert length.finish_reason == "length" and SIM_EOS_TOKEN_ID not in length.output_ids
    assert length.num_output_tokens == 7
    # every draft accepted: 5 tokens per round (k = 4 + bonus), less where the cap or a stop cuts it
    assert [s.num_committed for s in recorder.steps if s.request_id == "eos"] == [5, 1]
    assert clock() == pytest.approx(sum(r.round_ms for r in recorder.rounds) / 1000)
    for r in recorder.rounds:  # the round's time is the cost model's prediction of its own counters
        predicted = COST.predict_ms(r.num_target_passes, r.num_target_rows + r.num_padded_target_rows,
                                    r.num_draft_passes, r.num_draft_rows + r.num_padded_draft_rows,
                                    r.num_kv_tokens_read)
        assert r.round_ms == pytest.approx(predicted)
        assert r.num_committed <= r.num_accepted + r.num_decode_rows  # stops discard what follows them


def test_plain_decoding_has_no_draft_work():
    config = load_config(None, ["capacity.max_context=64", "drafter.kind=none"])
    rows = [Row(f"p{i}", [1] * 4, SamplingParams(max_new_tokens=5)) for i in range(3)]
    recorder, _ = sim_run(config, rows, {r.request_id: (5, True) for r in rows}, DomainAcceptance({"*": (0.9, 5.0)}))
    assert all(r.num_draft_rows == r.num_draft_passes == r.num_proposed == 0 for r in recorder.rounds)
    assert sum(r.num_committed for r in recorder.rounds) == 15
    assert all(row.finish_reason == "eos" for row in rows)


def test_inline_domain_draws_equal_the_acceptance_model():
    """The backend draws DomainAcceptance inline; a subclass takes the generic path: same rounds."""

    class Generic(DomainAcceptance):
        pass

    config = load_config(None, ["capacity.max_context=128", "scheduler.lookahead=fixed:5",
                                "scheduler.max_batch_rows=4"])
    domains = {"*": (0.7, 4.0), "edge": (1.0, 1.0)}
    runs = []
    for model in (DomainAcceptance(domains), Generic(domains)):
        rows = [Row(f"q{i}", [1] * (3 + i), SamplingParams(max_new_tokens=30), domain="edge" if i == 0 else "x")
                for i in range(9)]
        recorder, _ = sim_run(config, rows, {r.request_id: (20 + i, i % 2 == 0) for i, r in enumerate(rows)}, model)
        runs.append([counters(r) for r in recorder.rounds])
    assert runs[0] == runs[1] and sum(r["num_accepted"] for r in runs[0]) > 0


def test_timing_noise_scales_whole_rounds_by_a_seeded_mean_one_factor():
    """A noisy machine moves round times, never the work: same counters as the noiseless run, the
    same times again for the same seed, each round's phases scaled together, about the same total."""
    config = load_config(None, ["capacity.max_context=256", "scheduler.lookahead=fixed:2",
                                "scheduler.max_batch_rows=4"])

    def run(noise: float):
        rows = [Row(f"r{i}", [1] * (5 + i), SamplingParams(max_new_tokens=120)) for i in range(8)]
        recorder, _ = sim_run(config, rows, {r.request_id: (120, False) for r in rows},
                              DomainAcceptance({"*": (0.7, 20.0)}), timing_noise=noise)
        return recorder.rounds

    quiet, noisy, again = run(0.0), run(0.3), run(0.3)
    assert [counters(r) for r in noisy] == [counters(r) for r in quiet]
    assert [r.round_ms for r in noisy] == [r.round_ms for r in again]
    factors = [n.round_ms / q.round_ms for n, q in zip(noisy, quiet, strict=True)]
    for n, q, factor in zip(noisy, quiet, factors, strict=True):
        assert n.verify_ms == pytest.approx(q.verify_ms * factor) and n.draft_ms == pytest.approx(q.draft_ms * factor)
    assert len(set(factors)) == len(factors) > 100
    assert sum(factors) / len(factors) == pytest.approx(1.0, abs=0.05)


def test_a_lookup_that_finds_no_match_proposes_nothing_and_verifies_its_pending_token_alone():
    """With n-gram lookups matching 40% of the time, about 40% of the row-rounds planned with k > 0
    propose drafts (each k), the rest none, and every verify window is 1 + what was proposed; at
    share 1, as without one, every planned row proposes."""
    config = load_config(None, ["capacity.max_context=256", "drafter.kind=ngram", "scheduler.lookahead=fixed:3",
                                "scheduler.max_batch_rows=8"])

    def run(match: dict[str, float]):
        rows = [Row(f"n{i}", [1] * 6, SamplingParams(max_new_tokens=60)) for i in range(16)]
        recorder, _ = sim_run(config, rows, {r.request_id: (60, False) for r in rows},
                              DomainAcceptance({"*": (1.0, 1.0)}), lookup_match_rate=match)
        return recorder

    for record in run({}).rounds:
        assert record.num_proposed == 3 * record.num_speculating_rows
    recorder = run({"ngram": 0.4})
    planned = [step for step in recorder.steps if step.k > 0]
    matched = [step for step in planned if step.num_proposed]
    assert all(step.num_proposed == step.k for step in matched)
    assert 0.3 < len(matched) / len(planned) < 0.5
    for record in recorder.rounds:  # a verify row per decode row, plus its proposals
        assert record.num_target_rows - record.num_prefill_tokens == record.num_decode_rows + record.num_proposed


def test_a_matched_lookup_offers_each_further_draft_at_its_continue_rate():
    """A suffix lookup stops where its continuation's confidence drops: with continue rate 0 every
    matched lookup proposes 1 draft of a planned 4, with 0.5 about 1 + 0.5 + 0.25 + 0.125, and every
    verify window is 1 + what was proposed."""
    config = load_config(None, ["capacity.max_context=256", "drafter.kind=suffix", "scheduler.lookahead=fixed:4",
                                "scheduler.max_batch_rows=8"])

    def proposed(rate: float) -> list[int]:
        rows = [Row(f"s{i}", [1] * 6, SamplingParams(max_new_tokens=60)) for i in range(16)]
        recorder, _ = sim_run(config, rows, {r.request_id: (60, False) for r in rows},
                              DomainAcceptance({"*": (1.0, 1.0)}), lookup_continue_rate={"suffix": rate})
        for record in recorder.rounds:
            assert record.num_target_rows - record.num_prefill_tokens == record.num_decode_rows + record.num_proposed
        return [step.num_proposed for step in recorder.steps if step.k == 4]

    assert set(proposed(0.0)) == {1}
    assert 1.75 < sum(halves := proposed(0.5)) / len(halves) < 2.0 and max(halves) == 4
    assert set(proposed(1.0)) == {4}


def test_each_drafter_draws_a_rows_acceptance_from_its_own_model():
    """With a DrafterAcceptance, a step's accepted prefix follows the α of the drafter that drafted it:
    here suffix drafts are always accepted and n-gram drafts never; a drafter without a model is refused."""
    config = load_config(None, ["capacity.max_context=256", "drafter.kind=suffix,ngram", "scheduler.lookahead=fixed:3",
                                "scheduler.max_batch_rows=8"])
    acceptance = DrafterAcceptance({"ngram": DomainAcceptance({"*": (0.0, 1.0)}, seed=1),
                                    "suffix": DomainAcceptance({"*": (1.0, 1.0)}, seed=2)})
    rows = [Row(f"d{i}", [1] * 6, SamplingParams(max_new_tokens=40)) for i in range(8)]
    recorder, _ = sim_run(config, rows, {r.request_id: (40, False) for r in rows}, acceptance)
    drafted = [step for step in recorder.steps if step.num_proposed]
    assert {step.drafter for step in drafted} == {"ngram", "suffix"}
    assert all(step.num_accepted == (step.num_proposed if step.drafter == "suffix" else 0) for step in drafted)
    with pytest.raises(ValueError, match="suffix"):
        sim_run(config, rows, {}, DrafterAcceptance({"ngram": DomainAcceptance({"*": (1.0, 1.0)})}))
