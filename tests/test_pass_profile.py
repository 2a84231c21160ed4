"""Costs measured on the model in use (issue 43): recorded pass times → the cost model, its cache,
and the speedup limit it implies. No model runs here except in the one engine test."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pyarrow as pa
import pytest

from specbatch.core import PassShape
from specbatch.sched.costmodel import CPU_DEMO_PROFILE, CostModel
from specbatch.sched.online_cost import OnlineCostFit
from specbatch.sched.pass_profile import (
    PassProfile,
    PassTiming,
    cached_profile,
    no_alpha_pays,
    pass_ms,
    save_profile,
    speedup_limit,
)
from specbatch.sched.roundcost import DecodeShape, RoundCostModel

# A model with known coefficients; recorded times are its predictions (± a fixed 1 % wobble). A row of
# several positions reads its KV at 3x a one-position row's price, as the paged kernel's lanes do
TRUE = CostModel(0.0, target_passes=20.0, target_rows=0.05, draft_passes=4.0, draft_rows=0.01,
                 kv_tokens_read=0.0005, wide_kv_tokens_read=0.001)


def recorded(model: CostModel = TRUE) -> PassProfile:
    timings = []
    for i, (rows, query_len, kv_len) in enumerate((r, q, kv) for r in (1, 4, 16, 32) for q in (1, 2, 5, 9)
                                                  for kv in (32, 544)):
        ms = pass_ms(model, PassTiming("target", rows, query_len, kv_len, 0.0))
        timings.append(PassTiming("target", rows, query_len, kv_len, ms * (1.01 if i % 2 else 0.99)))
    for rows, query_len in ((1, 1), (4, 1), (16, 1), (32, 1), (1, 64)):
        timings.append(PassTiming("draft", rows, query_len, 32,
                                  model.draft_passes + model.draft_rows * rows * query_len))
    return PassProfile("k", timings, "recorded")


def test_fit_recovers_the_pass_costs_and_is_deterministic():
    first, second = recorded().fit(), recorded().fit()
    assert first == second
    assert first.intercept_ms == 0.0 and first.measured_draft
    assert first.target_passes == pytest.approx(20.0, rel=0.05)
    assert first.target_rows == pytest.approx(0.05, rel=0.3)
    assert first.kv_tokens_read == pytest.approx(0.0005, rel=0.3)
    assert first.wide_kv_tokens_read == pytest.approx(0.001, rel=0.3)  # one KV price cannot fit both kinds
    assert first.draft_passes == pytest.approx(4.0, rel=1e-6)
    assert first.draft_rows == pytest.approx(0.01, rel=1e-6)
    assert first.mape is not None and first.mape < 0.02


def test_no_draft_timings_keep_the_fallback_draft_price():
    profile = recorded()
    profile.timings = [t for t in profile.timings if t.role == "target"]
    fallback = CostModel(1.0, 1.0, 1.0, draft_passes=7.0, draft_rows=0.3, kv_tokens_read=0.0)
    model = profile.fit(fallback)
    assert (model.draft_passes, model.draft_rows, model.measured_draft) == (7.0, 0.3, False)


def test_cache_round_trip_and_the_model_file_is_a_cost_model(tmp_path):
    profile = recorded()
    model_path = save_profile(profile, tmp_path)
    assert cached_profile("k", tmp_path) == profile
    assert cached_profile("other", tmp_path) is None
    assert CostModel.load(model_path) == profile.fit()  # what `simulate --cost-model` reads
    (tmp_path / "k.passes.json").write_text("{not json")
    assert cached_profile("k", tmp_path) is None  # damaged: measured again


def test_a_measured_prior_needs_no_probes():
    assert OnlineCostFit(recorded().fit()).knows_draft_cost
    assert not OnlineCostFit(TRUE).knows_draft_cost


def test_speedup_limit_is_the_formula_at_the_best_k():
    # one row, only passes cost (no per-row price): T(K) = T(0), the limit is E(α, K) at K = cap
    flat = RoundCostModel(CostModel(0.0, 10.0, 0.0, 0.0, 0.0, 0.0), uses_draft_model=False)
    limit, k = speedup_limit(flat, [0.5], [4], [0], [False])
    assert (limit, k) == (pytest.approx((1 - 0.5**5) / 0.5), 4)
    # rows cost as much as a pass: T(K)/T(0) = (10 + 10(1 + K)) / 20
    dear = RoundCostModel(CostModel(0.0, 10.0, 10.0, 0.0, 0.0, 0.0), uses_draft_model=False)
    limit, k = speedup_limit(dear, [0.9], [8], [0], [False])
    expected = max((1 - 0.9 ** (j + 1)) / 0.1 / ((20 + 10 * j) / 20) for j in range(1, 9))
    assert limit == pytest.approx(expected) and k >= 1
    assert speedup_limit(dear, [0.0], [8], [0], [False]) == (1.0, 0)


def test_speedup_limit_stopping_past_the_peak_finds_the_best_k_of_a_full_search():
    """It stops once the speedup fell twice in a row; on mixed batches (α, caps, KV, lookup and
    model rows) under a timed profile and the CPU prior that is the best of every K."""

    def full_search(round_cost, alphas, caps, starts, models):
        """The limit's formula at every K (module docstring), nothing skipped."""
        plain_ms = round_cost.decode_ms(DecodeShape(len(alphas), max(starts), sum_start=sum(starts)))
        wide = [start for start, cap in zip(starts, caps, strict=True) if cap >= 1]
        best = 1.0
        for k_max in range(1, max(caps) + 1):
            ks = [min(cap, k_max) for cap in caps]
            tokens = sum((1 - a ** (k + 1)) / (1 - a) for a, k in zip(alphas, ks, strict=True))
            drafting = [k for k, model in zip(ks, models, strict=True) if model and k]
            num_lookup = sum(1 for cap, model in zip(caps, models, strict=True) if cap and not model)
            shape = DecodeShape(len(alphas), max(starts), k_max, len(drafting), 1 if drafting else 0, sum(drafting),
                                sum(starts), sum(ks), len(drafting), num_lookup, num_wide=len(wide),
                                sum_wide_start=sum(wide))
            best = max(best, tokens / len(alphas) * plain_ms / round_cost.decode_ms(shape))
        return best

    rng = random.Random(43)
    for cost in (recorded().fit(), CPU_DEMO_PROFILE, TRUE):
        for flat in (False, True):
            round_cost = RoundCostModel(cost, flat=flat)
            for _ in range(60):
                n = rng.choice([1, 2, 8, 32])
                alphas = [rng.uniform(0.05, 0.98) for _ in range(n)]
                caps = [rng.choice([0, 1, 3, 8]) for _ in range(n)]
                starts = [rng.randrange(10, 900) for _ in range(n)]
                models = [rng.random() < 0.5 for _ in range(n)]
                limit, _ = speedup_limit(round_cost, alphas, caps, starts, models)
                assert limit == pytest.approx(full_search(round_cost, alphas, caps, starts, models))


def test_no_alpha_pays_where_a_position_costs_as_much_as_a_token():
    # every extra position costs a whole plain round: (k + 1) tokens for (k + 1)x the time at best
    linear = RoundCostModel(CostModel(0.0, 0.0, 1.0, 0.0, 0.0, 0.0), uses_draft_model=False)
    assert no_alpha_pays(linear, [0] * 8, 4, uses_draft_model=False)
    assert not no_alpha_pays(RoundCostModel(recorded().fit()), [0] * 8, 4, uses_draft_model=True)


def test_profile_json_names_its_fields():
    data = json.loads(recorded().to_json())
    assert set(data) == {"key", "description", "timings"}
    assert set(data["timings"][0]) == {"role", "num_rows", "query_len", "kv_len", "ms"}


def test_a_flat_pass_prices_each_rows_own_kv_and_charges_every_row_to_the_largest_k():
    cost = CostModel(1.0, 2.0, 0.5, 3.0, 0.25, 0.01)
    flat = RoundCostModel(cost, flat=True)
    shape = DecodeShape()
    for start, k, lag in ((10, 2, 1), (30, 0, 0), (50, 3, 4)):
        shape.add(start, k, lag)
    # verify: 3 rows x (1 + 3) = 12 positions, KV Σ start 90 + 12; draft: 3 passes, lags 1 + 4 + Σ (k − 1) 3
    assert flat.decode_ms(shape) == pytest.approx(1 + 2 + 0.5 * 12 + 0.01 * 102 + 3 * 3 + 0.25 * 8)
    padded = RoundCostModel(cost)  # every row reads the longest row's KV, and step 0 pads to the largest lag
    assert padded.decode_ms(shape) == pytest.approx(1 + 2 + 0.5 * 12 + 0.01 * 3 * 54 + 3 * 3 + 0.25 * (2 * 4 + 3))
    # rows verifying drafts read their KV again at the wide price: in a flat pass only those rows (each to
    # 1 + the largest k past its start), in a bucketed pass every row once any row drafts
    wide = replace(cost, wide_kv_tokens_read=0.02)
    assert RoundCostModel(wide, flat=True).decode_ms(shape) == pytest.approx(
        flat.decode_ms(shape) + 0.02 * ((10 + 4) + (50 + 4)))
    assert RoundCostModel(wide).decode_ms(shape) == pytest.approx(padded.decode_ms(shape) + 0.02 * 3 * 54)
    plain = DecodeShape()
    for start in (10, 30, 50):
        plain.add(start, 0)
    assert RoundCostModel(wide, flat=True).decode_ms(plain) == pytest.approx(flat.decode_ms(plain))


def test_a_flat_pass_counts_the_kv_its_rows_of_several_positions_read():
    shape = PassShape.flat([0, 10, 20], [5, 1, 3])  # a prefill chunk, a plain row, a row verifying 2 drafts
    assert (shape.num_kv_tokens_read, shape.num_wide_kv_tokens_read) == (5 + 11 + 23, 5 + 23)
    assert PassShape.flat([7, 9], [1, 1]).num_wide_kv_tokens_read == 0


def test_a_ledger_fit_prices_wide_kv_apart_and_reads_ledgers_from_before_it():
    truth = CostModel(1.0, target_passes=2.0, target_rows=0.05, draft_passes=0.0, draft_rows=0.0,
                      kv_tokens_read=0.0005, wide_kv_tokens_read=0.0015)
    rows = []
    for i in range(40):
        kv = 200 + 37 * i
        wide = kv if i % 2 else 0
        rows.append({"num_target_passes": 1, "num_target_rows": 8 + i % 5, "num_padded_target_rows": 0,
                     "num_draft_passes": 0, "num_draft_rows": 0, "num_padded_draft_rows": 0,
                     "num_kv_tokens_read": kv, "num_wide_kv_tokens_read": wide,
                     "round_ms": truth.predict_ms(1, 8 + i % 5, 0, 0, kv, wide)})
    fitted = CostModel.fit(pa.Table.from_pylist(rows))
    assert fitted.kv_tokens_read == pytest.approx(0.0005, rel=0.01)
    assert fitted.wide_kv_tokens_read == pytest.approx(0.0015, rel=0.01)
    older = pa.Table.from_pylist([{k: v for k, v in row.items() if k != "num_wide_kv_tokens_read"} for row in rows])
    assert CostModel.fit(older).wide_kv_tokens_read == 0.0


def test_a_ledger_fit_prices_drafting_by_lookup():
    """n-gram and suffix drafting run no pass, but their rows and indexed tokens cost host time: a fit
    that left them out priced a real job's lookups at nothing in its simulation."""
    truth = CostModel(0.5, target_passes=0.5, target_rows=0.05, draft_passes=0.0, draft_rows=0.0,
                      kv_tokens_read=0.0, lookup_rows=0.05, lookup_tokens=0.01)
    rows = []
    for i in range(40):
        lookups, indexed, positions = i % 3, (150 if i % 7 == 0 else i % 4), 1 + 3 * (i // 3 % 3)
        rows.append({"num_target_passes": 1, "num_target_rows": positions, "num_lookup_rows": lookups,
                     "num_indexed_tokens": indexed * bool(lookups),
                     "round_ms": truth.predict_ms(1, positions) + truth.lookup_ms(lookups, indexed * bool(lookups))})
    fitted = CostModel.fit(pa.Table.from_pylist(rows))
    assert (fitted.lookup_rows, fitted.lookup_tokens) == (pytest.approx(0.05, rel=0.01), pytest.approx(0.01, rel=0.01))
    assert fitted.predict_rounds(pa.Table.from_pylist(rows)) == pytest.approx([row["round_ms"] for row in rows])
