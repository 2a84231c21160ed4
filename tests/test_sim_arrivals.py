"""Arrival processes and synthetic workloads: statistics with fixed seeds, parsing, determinism."""

from __future__ import annotations

import json
import random
import statistics

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbatch.sim.arrivals import GammaGaps, Offline, OnOff, Poisson, Replay, parse_arrival
from specbatch.sim.workload import (
    DomainMix,
    FixedLength,
    LogNormalLength,
    UniformLength,
    Workload,
    parse_domains,
    parse_length,
)


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times[:-1]], times, strict=True)]


def test_offline_all_at_zero() -> None:
    assert Offline().times(5, random.Random(0)) == [0.0] * 5


def test_poisson_mean_gap_and_cv() -> None:
    times = Poisson(4.0).times(50_000, random.Random(1))
    assert times == sorted(times)
    g = gaps(times)
    assert statistics.fmean(g) == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.5])
def test_gamma_mean_and_cv(cv: float) -> None:
    g = gaps(GammaGaps(4.0, cv).times(100_000, random.Random(2)))
    assert statistics.fmean(g) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(g) / statistics.fmean(g) == pytest.approx(cv, rel=0.08)


def test_gamma_cv_zero_is_evenly_spaced() -> None:
    assert GammaGaps(2.0, 0.0).times(3, random.Random(0)) == [0.5, 1.0, 1.5]


def test_onoff_mean_rate_and_burstiness() -> None:
    process = OnOff(8.0, 2.0, 3.0)
    times = process.times(50_000, random.Random(3))
    assert times == sorted(times)
    assert len(times) / times[-1] == pytest.approx(process.mean_rate, rel=0.08)  # 3.2/s
    g = gaps(times)
    assert statistics.stdev(g) / statistics.fmean(g) > 1.5  # burstier than Poisson


def test_same_seed_same_times_and_different_seed_differs() -> None:
    for process in (Poisson(3.0), OnOff(8.0, 2.0, 3.0), GammaGaps(4.0, 2.5)):
        assert process.times(100, random.Random(7)) == process.times(100, random.Random(7))
        assert process.times(100, random.Random(7)) != process.times(100, random.Random(8))


class CountingRandom(random.Random):
    """A seeded generator that counts the uniform draws every distribution method makes."""

    num_draws = 0

    def random(self) -> float:
        self.num_draws += 1
        return super().random()


def test_million_poisson_arrivals_are_one_pass() -> None:
    """One uniform draw per arrival and nothing per request besides: linear, the same trace as a plain
    generator. Counted, not timed; the time (~0.2 s unloaded) is in benchmarks/timing_bench.py."""
    rng = CountingRandom(0)
    times = Poisson(100.0).times(1_000_000, rng)
    assert len(times) == 1_000_000 and rng.num_draws == 1_000_000
    assert times[:1000] == Poisson(100.0).times(1000, random.Random(0))
    assert times[-1] == pytest.approx(10_000.0, rel=0.01)  # n / rate


def test_parse_arrival() -> None:
    assert parse_arrival("offline") == Offline()
    assert parse_arrival("poisson:4.0") == Poisson(4.0)
    assert parse_arrival("onoff:8.0,2.0,3.0") == OnOff(8.0, 2.0, 3.0)
    assert parse_arrival("gamma:4.0,2.5") == GammaGaps(4.0, 2.5)
    assert "poisson" in parse_arrival("poisson:4").describe()


@pytest.mark.parametrize(
    "spec", ["poisson", "poisson:-1", "poisson:x", "gamma:4", "onoff:1,2", "burst:3", ""]
)
def test_parse_arrival_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_arrival(spec)


def test_replay_from_jsonl_and_parquet(tmp_path) -> None:
    values = [0.5, 0.1, 2.0]
    jsonl = tmp_path / "arrivals.jsonl"
    jsonl.write_text("".join(json.dumps({"arrival_s": v, "x": 1}) + "\n" for v in values))
    parquet = tmp_path / "arrivals.parquet"
    pq.write_table(pa.table({"arrival_s": values}), parquet)
    for path in (jsonl, parquet):
        process = parse_arrival(f"replay:{path}")
        assert process.times(3, random.Random(0)) == [0.1, 0.5, 2.0]
        assert process.times(2, random.Random(0)) == [0.1, 0.5]
        with pytest.raises(ValueError):
            process.times(4, random.Random(0))
    with pytest.raises(ValueError):
        Replay((1.0, -2.0))


def test_length_parsing_and_bounds() -> None:
    assert parse_length("fixed:7") == FixedLength(7)
    assert parse_length("uniform:3,9") == UniformLength(3, 9)
    assert parse_length("lognormal:100,1.0") == LogNormalLength(100.0, 1.0)
    assert parse_length("lognormal:100,1.0,500") == LogNormalLength(100.0, 1.0, 500)
    rng = random.Random(0)
    assert set(UniformLength(3, 9).sample(5000, rng)) == set(range(3, 10))
    heavy = LogNormalLength(100.0, 2.0, 500).sample(20_000, rng)
    assert min(heavy) >= 1 and max(heavy) == 500
    assert statistics.median(LogNormalLength(100.0, 0.5).sample(20_000, rng)) == pytest.approx(100, rel=0.05)
    for bad in ("fixed:0", "uniform:5,2", "lognormal:1", "zipf:3"):
        with pytest.raises(ValueError):
            parse_length(bad)


def test_domain_mix() -> None:
    mix = parse_domains("mix:code=1,prose=3")
    assert mix.domains == ("code", "prose")
    draws = mix.sample(20_000, random.Random(0))
    assert draws.count(1) / len(draws) == pytest.approx(0.75, abs=0.02)
    assert parse_domains("code") == DomainMix((("code", 1.0),))
    for bad in ("mix:code", "mix:code=-1", "mix:a=1,a=2"):
        with pytest.raises(ValueError):
            parse_domains(bad)


def test_workload_draw_is_deterministic_and_consistent() -> None:
    workload = Workload(
        domains=parse_domains("mix:code=0.5,prose=0.5"),
        prompt_len=parse_length("lognormal:200,1.0,4096"),
        output_len=parse_length("uniform:1,200"),
        max_new_tokens=128,
        arrival=Poisson(4.0),
    )
    a, b = workload.draw(2000, seed=5), workload.draw(2000, seed=5)
    assert list(a) == list(b)
    assert list(workload.draw(2000, seed=6)) != list(a)
    rows = list(a)
    assert len({r.request_id for r in rows}) == 2000
    assert all(1 <= r.num_output_tokens <= r.max_new_tokens == 128 for r in rows)
    assert {r.finish_reason for r in rows} == {"eos", "length"}
    assert all(r.num_output_tokens == 128 for r in rows if r.finish_reason == "length")
    assert [r.arrival_s for r in rows] == sorted(r.arrival_s for r in rows)
    # Changing only the arrival process leaves lengths and domains identical (separate streams).
    offline = Workload(workload.domains, workload.prompt_len, workload.output_len, 128).draw(2000, seed=5)
    assert offline.num_prompt_tokens == a.num_prompt_tokens and offline.domain_index == a.domain_index
    assert set(offline.arrival_s) == {0.0}
