"""Little's-law latency model: a hand-computed point, divergence at capacity, spec vs plain."""

from __future__ import annotations

import math

import pytest

from specbatch.lab.littles_law import (
    LatencyModel,
    latency_curve,
    plain_model,
    plot_latency_vs_rate,
    predict_latency,
    speculative_model,
    tokens_per_round,
)

# N = 100 tokens, t0 = 20 ms, t1 = 1 ms: A = 100·(0.020 + 0.001) = 2.1 s, B = 100·0.001 = 0.1 s.
PLAIN = plain_model("plain", num_output_tokens=100, verify_fixed_s=0.020, verify_per_position_s=0.001)


def test_hand_computed_point() -> None:
    assert PLAIN.load_independent_s == pytest.approx(2.1)
    assert PLAIN.load_dependent_s == pytest.approx(0.1)
    assert PLAIN.capacity_rps == pytest.approx(10.0)
    # λ = 5: W = 2.1 / (1 − 0.5) = 4.2 s, L = 21; check: 100 rounds of 0.020 + 0.001·(1 + 21) s.
    assert PLAIN.mean_latency_s(5.0) == pytest.approx(4.2)
    assert PLAIN.mean_batch_size(5.0) == pytest.approx(21.0)
    round_s = 0.020 + 0.001 * (1 + 21)
    assert 100 * round_s == pytest.approx(4.2)
    assert PLAIN.mean_latency_s(0.0) == pytest.approx(2.1)


def test_latency_diverges_at_capacity() -> None:
    latencies = predict_latency(PLAIN, [9.0, 9.9, 9.99, 9.999, 10.0, 12.0])
    assert latencies[:4] == sorted(latencies[:4])
    assert latencies[3] > 1000 * PLAIN.load_independent_s
    assert latencies[4] == math.inf and latencies[5] == math.inf


def test_tokens_per_round_closed_form() -> None:
    assert tokens_per_round(0.8, 4) == pytest.approx((1 - 0.8**5) / (1 - 0.8))
    assert tokens_per_round(1.0, 4) == 5 and tokens_per_round(0.0, 4) == 1 and tokens_per_round(0.5, 0) == 1


def test_speculation_wins_at_low_load_and_loses_capacity() -> None:
    spec = speculative_model(
        "spec k=4", 100, k=4, alpha=0.8, verify_fixed_s=0.020, verify_per_position_s=0.001,
        draft_fixed_s=0.002, draft_per_position_s=0.0001,
    )  # fmt: skip
    assert spec.round_fixed_s == pytest.approx(0.028)
    assert spec.round_per_request_s == pytest.approx(0.0054)
    assert spec.mean_latency_s(0.0) < PLAIN.mean_latency_s(0.0)
    assert spec.capacity_rps < PLAIN.capacity_rps
    crossover = next(
        r / 10 for r in range(1, 100) if spec.mean_latency_s(r / 10) > PLAIN.mean_latency_s(r / 10)
    )
    assert 0 < crossover < spec.capacity_rps


def test_prefill_counts_both_ways() -> None:
    model = LatencyModel("p", 10, 1.0, 0.01, 0.001, prefill_s=0.05)
    assert model.load_independent_s == pytest.approx(0.05 + 10 * 0.011)
    assert model.load_dependent_s == pytest.approx(0.05 + 10 * 0.001)


def test_invalid_models_and_rates() -> None:
    with pytest.raises(ValueError):
        LatencyModel("bad", 100, 1.0, 0.02, 0.0)  # no load-dependent cost: no finite capacity
    with pytest.raises(ValueError):
        LatencyModel("bad", 0, 1.0, 0.02, 0.001)
    with pytest.raises(ValueError):
        PLAIN.mean_latency_s(-1.0)


def test_plot_writes_png(tmp_path) -> None:
    rates = [0.5 * i for i in range(21)]
    path = plot_latency_vs_rate(
        {"plain": latency_curve(PLAIN, rates)},
        tmp_path / "plots" / "latency.png",
        points={"plain": [(2.0, 2.7), (5.0, 4.5)]},
        capacities={"plain": PLAIN.capacity_rps},
    )
    assert path.exists() and path.stat().st_size > 1000
