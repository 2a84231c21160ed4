"""Adaptive lookahead that never loses: with the round-time model learnt on the run
(`scheduler.learn_cost`), a drafter that does not pay settles to plain decoding and one that pays
comes near the best fixed k, whatever the prior believed. On the simulator (virtual clock): the truth
is one cost model, the scheduler's prior another."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specbatch.config import load_config
from specbatch.records import RoundRecord
from specbatch.sched.context import DraftGate
from specbatch.sched.costmodel import CPU_DEMO_PROFILE, CostModel
from specbatch.sched.online_cost import OnlineCostFit
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.arrivals import Offline
from specbatch.sim.run import simulate
from specbatch.sim.workload import DomainMix, UniformLength, Workload

EXPENSIVE_DRAFTS = replace(CPU_DEMO_PROFILE, draft_passes=8.0, draft_rows=0.3)
CHEAP_DRAFTS = replace(CPU_DEMO_PROFILE, draft_passes=0.3, draft_rows=0.01)
PESSIMISTIC = replace(CPU_DEMO_PROFILE, draft_passes=15.0, draft_rows=0.5)


def tokens_per_s(tmp_path, truth: CostModel, prior: CostModel, alpha: float, *overrides: str) -> float:
    config = load_config(None, ["capacity.max_context=512", "scheduler.max_batch_rows=16",
                                "sampling.max_new_tokens=64", *overrides])
    requests = Workload(DomainMix((("code", 1.0),)), UniformLength(20, 60), UniformLength(20, 64), 64,
                        Offline()).draw(600, seed=3)
    job = tmp_path / "-".join(overrides).replace("=", "_").replace(":", "")
    summary = simulate(config, requests, DomainAcceptance({"code": (alpha, 50.0)}, seed=1), job,
                       cost_model=truth, scheduler_cost_model=prior)
    assert summary.num_completed == len(requests)
    assert summary.committed_tokens_per_s is not None
    return summary.committed_tokens_per_s


def test_a_drafter_that_does_not_pay_settles_to_plain_decoding(tmp_path):
    plain = tokens_per_s(tmp_path, EXPENSIVE_DRAFTS, CPU_DEMO_PROFILE, 0.5, "drafter.kind=none")
    learnt = tokens_per_s(tmp_path, EXPENSIVE_DRAFTS, CPU_DEMO_PROFILE, 0.5, "scheduler.lookahead=adaptive")
    believed = tokens_per_s(tmp_path, EXPENSIVE_DRAFTS, CPU_DEMO_PROFILE, 0.5, "scheduler.lookahead=adaptive",
                            "scheduler.learn_cost=false")
    assert learnt >= 0.98 * plain
    assert believed < 0.9 * plain  # the prior alone drafts at a loss: what learning fixes


def test_a_drafter_that_pays_reaches_the_best_fixed_k(tmp_path):
    fixed = {k: tokens_per_s(tmp_path, CHEAP_DRAFTS, PESSIMISTIC, 0.85, f"scheduler.lookahead=fixed:{k}")
             for k in (1, 2, 4, 6)}
    learnt = tokens_per_s(tmp_path, CHEAP_DRAFTS, PESSIMISTIC, 0.85, "scheduler.lookahead=adaptive")
    believed = tokens_per_s(tmp_path, CHEAP_DRAFTS, PESSIMISTIC, 0.85, "scheduler.lookahead=adaptive",
                            "scheduler.learn_cost=false")
    # 0.96 here (600 requests): the pessimistic prior keeps k = 0 until probes measure the draft cost,
    # and the draft gate explores plain decoding ever more rarely while it keeps confirming drafting
    assert learnt >= 0.94 * max(fixed.values())
    assert believed < 0.8 * max(fixed.values())  # the pessimistic prior alone never drafts


@pytest.mark.parametrize("drafts", [True, False])
def test_the_fit_recovers_round_costs_and_keeps_unmeasured_draft_costs(drafts):
    truth = CostModel(intercept_ms=2.0, target_passes=1.5, target_rows=0.1, draft_passes=0.7, draft_rows=0.02,
                      kv_tokens_read=0.001)
    fit = OnlineCostFit(CPU_DEMO_PROFILE, refit_every=1)
    base = RoundRecord(**{name: 0 for name in RoundRecord.__dataclass_fields__})
    for i in range(64):
        rows, passes, kv = 8 + (i * 7) % 29, 1 + i % 2, 300 + (i * 53) % 900
        draft_passes, draft_rows = (1 + i % 4, 8 + (i * 5) % 17) if drafts else (0, 0)
        draft_ms = truth.draft_passes * draft_passes + truth.draft_rows * draft_rows
        round_ms = truth.predict_ms(passes, rows, draft_passes, draft_rows, kv)
        fit.observe(replace(base, num_target_passes=passes, num_target_rows=rows, num_kv_tokens_read=kv,
                            num_draft_passes=draft_passes, num_draft_rows=draft_rows, draft_ms=draft_ms,
                            round_ms=round_ms), 0)
    learnt = fit.current
    for name in ("intercept_ms", "target_passes", "target_rows", "kv_tokens_read"):
        assert getattr(learnt, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    expected = truth if drafts else CPU_DEMO_PROFILE
    assert learnt.draft_passes == pytest.approx(expected.draft_passes, rel=0.05)
    assert learnt.draft_rows == pytest.approx(expected.draft_rows, rel=0.05)
    assert fit.knows_draft_cost is drafts and learnt.mape is not None and learnt.mape < 0.01


def gate_modes(rates: dict[bool, float], num_epochs: int, learning: bool = False) -> list[bool]:
    """The mode of each epoch a gate runs when drafting commits rates[True] tokens per ms and plain
    decoding rates[False] (rounds of 10 ms, one prefill-only round per epoch that must not count)."""
    gate, modes = DraftGate(epoch_rounds=4), []
    for _ in range(num_epochs):
        modes.append(gate.drafts)
        gate.observe(0, 50.0)  # a round of prefills only: no tokens, says nothing about decoding
        for _ in range(4):
            gate.observe(round(10 * rates[gate.drafts]), 10.0, learning)
    return modes


def test_the_draft_gate_settles_on_the_faster_mode_and_explores_ever_more_rarely():
    modes = gate_modes({True: 8.0, False: 10.0}, 200)
    assert modes[:2] == [True, False]  # one epoch of each to start
    explored = [i for i, drafts in enumerate(modes) if drafts and i >= 2]
    assert 4 <= len(explored) <= 8  # doubling intervals: 2, 4, 8, 16, 32, 32, ...
    assert all(b - a <= 33 for a, b in zip(explored, explored[1:], strict=False))  # never stops looking
    assert sum(gate_modes({True: 14.0, False: 10.0}, 200)) > 190  # and the other way round


def test_a_tie_goes_to_plain_decoding_unless_drafting_is_still_being_measured():
    assert sum(gate_modes({True: 10.0, False: 10.1}, 60)) < 10
    assert sum(gate_modes({True: 10.0, False: 10.1}, 60, learning=True)) > 50


def test_the_draft_gate_notices_when_drafting_starts_to_pay():
    gate = DraftGate(epoch_rounds=4)
    modes = []
    for epoch in range(120):
        modes.append(gate.drafts)
        rate = (8.0 if epoch < 60 else 14.0) if gate.drafts else 10.0
        for _ in range(4):
            gate.observe(round(10 * rate), 10.0)
    assert sum(modes[:60]) < 10 and sum(modes[100:]) >= 18  # found within one exploring interval (≤ 33 epochs)
