"""Which drafter a row drafts with, and how the measured profile decides (issue 43). Torch-free: the
simulator runs the real scheduler, so a decision made here is the decision a real job makes."""

from __future__ import annotations

import random

import pytest
from test_pass_profile import recorded

from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.loop import MemoryRecorder
from specbatch.sched.costmodel import CostModel
from specbatch.sched.draft_control import DraftGate
from specbatch.sched.drafter_choice import DrafterAlphas, _gain, choose_drafters
from specbatch.sched.estimates import AcceptanceStats, AlphaTracker, expected_tokens
from specbatch.sched.roundcost import RoundCostModel
from specbatch.sim.acceptance import DomainAcceptance
from specbatch.sim.worker import build_sim_engine

KINDS = ("suffix", "ngram", "draft")


def _row(name: str, domain: str = "") -> Row:
    return Row(name, [1] * 20, SamplingParams(max_new_tokens=64), domain=domain, output=[1, 1])


def _alphas() -> DrafterAlphas:
    return DrafterAlphas(AcceptanceStats(), kinds=KINDS, model_kinds=frozenset({"draft"}))


def test_alpha_is_counted_per_row_and_drafter():
    alphas, row = _alphas(), _row("a", "code")
    assert alphas.kind(row) == "suffix"  # the first configured until a plan picks
    row.drafter = "ngram"
    for _ in range(20):
        alphas.observe_drafts(row, 4, 4)  # every ngram draft accepted
    assert alphas.alpha(row) > 0.9 and alphas.alpha_of(row, "suffix") == 0.5
    other = _row("b", "code")
    assert 0.5 < alphas.alpha_of(other, "ngram") < alphas.alpha(row)  # the job's rounds with ngram, shrunk
    assert alphas.alpha_of(_row("c", "chat"), "ngram") == 0.5  # another domain's
    alphas.forget(row)
    assert alphas.alpha_of(row, "ngram") == alphas.alpha_of(other, "ngram")


@pytest.mark.parametrize("several", [False, True])
def test_kept_estimates_equal_fresh_ones_after_every_commit(several: bool):
    """Trackers keep each α̂ until a commit changes it: reads between commits, rows with and without
    history, in two domains, must equal what a tracker counting from scratch gives."""
    rng = random.Random(3)
    stats = AcceptanceStats()
    kept = DrafterAlphas(stats, kinds=KINDS) if several else AlphaTracker(stats)
    rows = [_row(f"r{i}", "code" if i % 2 else "chat") for i in range(6)]
    for i, row in enumerate(rows):
        row.drafter = KINDS[i % len(KINDS)]
    observed: list[tuple[Row, int, int]] = []
    for _ in range(60):
        row, k = rng.choice(rows), rng.randint(1, 4)
        num_accepted = rng.randint(0, k)
        row.accept_history.append((num_accepted, k))  # the commit step's order (`commit._commit_verified`)
        stats.observe(row.domain, k, num_accepted)
        kept.observe_drafts(row, k, num_accepted)
        observed.append((row, k, num_accepted))
        fresh = DrafterAlphas(AcceptanceStats(), kinds=KINDS) if several else AlphaTracker(AcceptanceStats())
        for past_row, past_k, past_accepted in observed:
            fresh.stats.observe(past_row.domain, past_k, past_accepted)
            fresh.observe_drafts(past_row, past_k, past_accepted)
        for _ in range(2):  # a second read comes from what the first kept
            assert [kept.alpha(r) for r in rows] == [fresh.alpha(r) for r in rows]
            assert kept.alpha(_row("new", "code")) == fresh.alpha(_row("new", "code"))


def test_each_row_takes_the_drafter_worth_most_at_plain_decodings_price():
    alphas = _alphas()
    rows = [_row(f"r{i}") for i in range(4)]
    for row, (kind, accepted) in zip(rows, [("ngram", 4), ("suffix", 4), ("draft", 4), ("draft", 0)], strict=True):
        row.drafter = kind
        for _ in range(30):
            alphas.observe_drafts(row, 4, accepted)
        row.num_draft_computed = row.num_tokens  # no catch-up
    cheap = RoundCostModel(CostModel(0.0, 10.0, 0.01, 0.5, 0.01, 0.0))
    choose_drafters(alphas, cheap, rows, [4] * 4, explore_z=0.0)
    assert [row.drafter for row in rows[:3]] == ["ngram", "suffix", "draft"]
    # a draft model as dear as the target never beats a lookup that is as good
    dear = RoundCostModel(CostModel(0.0, 10.0, 0.01, 10.0, 5.0, 0.0))
    choose_drafters(alphas, dear, rows, [4] * 4, explore_z=0.0)
    assert rows[2].drafter != "draft"


def test_one_drafter_chooses_nothing():
    row = _row("a")
    choose_drafters(DrafterAlphas(AcceptanceStats(), kinds=("ngram",)), RoundCostModel(recorded().fit()), [row], [4])
    assert row.drafter == ""


def simulate(cost: CostModel, kinds: str = "suffix,ngram", scale: dict[str, float] | None = None,
             num_requests: int = 24, learn_cost: bool = False):
    """A simulated job of `kinds`, planning from `cost` (the fitted profile) and timed by it."""
    config = load_config(None, [f"drafter.kind={kinds}", "scheduler.lookahead=adaptive", "scheduler.max_batch_rows=8",
                                f"scheduler.learn_cost={learn_cost}", "capacity.max_context=512"])
    outputs = {f"q{i}": (40 + i % 7, False) for i in range(num_requests)}
    recorder = MemoryRecorder()
    engine, _ = build_sim_engine(config, cost, DomainAcceptance({"*": (0.7, 20.0)}, seed=3), outputs, recorder,
                                 scheduler_cost=cost, drafter_alpha_scale=scale)
    for i in range(num_requests):
        engine.add(Row(f"q{i}", [5] * (30 + i), SamplingParams(max_new_tokens=64), arrival_s=0.0))
    engine.run()
    return recorder


def _decisions(recorder: MemoryRecorder) -> list[tuple[str, int, int, str]]:
    return [(s.request_id, s.round_index, s.k, s.drafter) for s in recorder.steps]


def test_a_fitted_profile_gives_the_same_decisions_every_run():
    cost = recorded().fit()
    first, second = simulate(cost), simulate(recorded().fit())
    assert _decisions(first) == _decisions(second)
    assert [r.limit_speedup for r in first.rounds] == [r.limit_speedup for r in second.rounds]


def test_rows_settle_on_the_drafter_that_is_accepted():
    recorder = simulate(recorded().fit(), scale={"suffix": 1.0, "ngram": 0.2})
    drafted = [s.drafter for s in recorder.steps if s.num_proposed]
    assert drafted.count("suffix") > 0.8 * len(drafted)
    recorder = simulate(recorded().fit(), scale={"suffix": 0.2, "ngram": 1.0})
    drafted = [s.drafter for s in recorder.steps if s.num_proposed]
    assert drafted.count("ngram") > 0.8 * len(drafted)


def test_the_ledger_holds_the_limit_beside_what_the_round_got():
    recorder = simulate(recorded().fit())
    decode = [r for r in recorder.rounds if r.num_decode_rows]
    assert all(r.plain_ms > 0 and r.predicted_ms >= r.plain_ms * 0.999 for r in decode)
    assert all(r.limit_speedup >= 1.0 for r in decode)
    assert max(r.limit_speedup for r in decode) > 1.5  # α 0.7 and lookups that cost no draft pass


def test_where_no_alpha_pays_nothing_drafts_and_nothing_probes():
    # a verify position costs as much as a whole plain round: k drafts cost k + 1 rounds
    linear = CostModel(0.0, 0.0, 5.0, 0.0, 0.0, 0.0, measured_draft=True)
    recorder = simulate(linear, kinds="suffix,draft")
    assert sum(r.num_proposed for r in recorder.rounds) == 0
    assert sum(r.num_draft_rows for r in recorder.rounds) == 0
    assert all(r.limit_speedup == 1.0 for r in recorder.rounds)
    # learning the draft model's price on the run (an unmeasured prior): the verify pass alone is too
    # dear for any drafts, so nothing probes it either
    unmeasured = CostModel(0.0, 0.0, 5.0, 1.0, 0.1, 0.0)
    recorder = simulate(unmeasured, kinds="draft", learn_cost=True)
    assert sum(r.num_draft_rows + r.num_draft_passes for r in recorder.rounds) == 0


def _gate_loss_share(max_loss_share: float, num_rounds: int, seed: int) -> float:
    """Drafting's time beyond plain decoding's for its tokens, as a share of the engine time, where
    drafting always loses (2x the time for 9 tokens instead of 8) and rounds vary by ±50 %."""
    rng = random.Random(seed)
    gate = DraftGate(max_loss_share=max_loss_share)
    total_ms = loss_ms = 0.0
    for _ in range(num_rounds):
        drafts = gate.drafts
        ms, tokens = (20.0, 9) if drafts else (10.0, 8)
        ms *= rng.uniform(0.5, 1.5)
        total_ms += ms
        loss_ms += ms - tokens / 0.8 if drafts else 0.0
        gate.observe(8, tokens, ms)
    return loss_ms / total_ms


def test_a_losing_comparison_costs_at_most_its_share_of_the_engine_time():
    for seed in range(4):
        bounded, unbounded = _gate_loss_share(0.02, 400, seed), _gate_loss_share(1e9, 400, seed)
        assert bounded <= 0.025 < unbounded  # 2 %, and the round that crossed it


def test_simulate_takes_each_drafters_acceptance_scale_and_lookup_match_share():
    from specbatch.cli.lab import _kind_values

    assert _kind_values("suffix=1, ngram=0.5", "--drafter-alpha", "SCALE") == (("suffix", 1.0), ("ngram", 0.5))
    assert _kind_values("", "--drafter-alpha", "SCALE") == ()
    assert _kind_values("suffix=2", "--drafter-alpha", "SCALE") == (("suffix", 2.0),)
    for bad in ("suffix", "ngram=x", "=1", "draft=-1"):
        with pytest.raises(ValueError, match="--drafter-alpha"):
            _kind_values(bad, "--drafter-alpha", "SCALE")
    with pytest.raises(ValueError, match="--lookup-match"):
        _kind_values("suffix=1.5", "--lookup-match", "SHARE", upper=1.0)


def test_a_drafters_gain_at_its_best_k_equals_the_search_over_every_k():
    rng = random.Random(43)
    cases = [(rng.choice([0.0, 1.0, rng.random()]), rng.randint(1, 8), rng.choice([0.0, rng.random() * 1.5]),
              rng.random()) for _ in range(2000)]
    for alpha, cap, price, fixed in cases:
        searched = max(expected_tokens(alpha, k) - 1 - price * k - fixed for k in range(1, cap + 1))
        assert _gain(alpha, cap, price, fixed) == pytest.approx(searched, abs=1e-12)
