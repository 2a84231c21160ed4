"""Acceptance models: accepted-prefix law, per-domain Beta α, replay of recorded histories."""

from __future__ import annotations

import random
import statistics

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbatch.sim.acceptance import DomainAcceptance, ReplayAcceptance, accepted_prefix, read_step_histories


@pytest.mark.parametrize(("alpha", "k"), [(0.3, 1), (0.6, 4), (0.9, 8)])
def test_accepted_prefix_mean_matches_closed_form(alpha: float, k: int) -> None:
    rng = random.Random(0)
    draws = [accepted_prefix(alpha, k, rng) for _ in range(40_000)]
    assert all(0 <= d <= k for d in draws)
    assert statistics.fmean(draws) == pytest.approx(sum(alpha**i for i in range(1, k + 1)), rel=0.03)
    assert sum(d == 0 for d in draws) / len(draws) == pytest.approx(1 - alpha, abs=0.01)


def test_accepted_prefix_edges_use_one_draw() -> None:
    rng = random.Random(0)
    assert accepted_prefix(0.0, 5, rng) == 0 and accepted_prefix(1.0, 5, rng) == 5
    assert accepted_prefix(0.7, 0, rng) == 0
    a, b = random.Random(1), random.Random(1)
    accepted_prefix(0.5, 7, a)
    b.random()
    assert a.random() == b.random()  # exactly one random number per call, whatever the outcome
    with pytest.raises(ValueError):
        accepted_prefix(1.5, 3, rng)


def test_domain_beta_means_and_determinism() -> None:
    model = DomainAcceptance({"code": (0.8, 20.0), "prose": (0.4, 5.0)}, seed=3)
    code = [model.alpha(f"c{i}", "code") for i in range(5000)]
    prose = [model.alpha(f"p{i}", "prose") for i in range(5000)]
    assert statistics.fmean(code) == pytest.approx(0.8, abs=0.01)
    assert statistics.fmean(prose) == pytest.approx(0.4, abs=0.015)
    # Beta variance mean(1 − mean)/(c + 1)
    assert statistics.variance(code) == pytest.approx(0.8 * 0.2 / 21, rel=0.1)
    # α depends on (seed, request_id) only: a fresh model, asked in another order, agrees.
    again = DomainAcceptance({"code": (0.8, 20.0), "prose": (0.4, 5.0)}, seed=3)
    assert [again.alpha(f"c{i}", "code") for i in reversed(range(5000))] == code[::-1]
    assert DomainAcceptance({"code": (0.8, 20.0)}, seed=4).alpha("c0", "code") != code[0]


def test_domain_acceptance_default_release_and_errors() -> None:
    model = DomainAcceptance({"*": (1.0, 1.0)})
    assert model.num_accepted("r", "anything", 0, 4, random.Random(0)) == 4
    model.release("r")
    assert "r" not in model._alphas
    with pytest.raises(KeyError):
        DomainAcceptance({"code": (0.5, 2.0)}).alpha("r", "prose")
    with pytest.raises(ValueError):
        DomainAcceptance({"code": (1.2, 2.0)})


def test_replay_reproduces_recorded_history() -> None:
    history = [(2, 4), (4, 4), (0, 4), (1, 3)]
    replay = ReplayAcceptance({"r": history})
    rng = random.Random(0)
    position, replayed = 0, []
    for _, k in history:
        accepted = replay.num_accepted("r", "code", position, k, rng)
        replayed.append((accepted, k))
        position += accepted + 1
    assert replayed == history
    assert replay.alpha("r") == pytest.approx(7 / 10)  # 7 accepts, 3 rejects


def test_replay_with_other_lookahead_follows_positions() -> None:
    replay = ReplayAcceptance({"r": [(2, 4)]}, fallback_alpha=0.0)  # accepts at 0, 1; reject at 2
    rng = random.Random(0)
    assert replay.num_accepted("r", "", 0, 1, rng) == 1
    assert replay.num_accepted("r", "", 1, 8, rng) == 1
    assert replay.num_accepted("r", "", 2, 8, rng) == 0
    # Past the history the request's own α (2 / 3) applies; with α = 1 everything is accepted.
    assert ReplayAcceptance({"r": [(3, 3)]}).num_accepted("r", "", 0, 6, rng) == 6
    with pytest.raises(KeyError):
        replay.num_accepted("other", "", 0, 2, rng)


def test_loader_reads_steps_parquet(tmp_path) -> None:
    steps = tmp_path / "steps"
    steps.mkdir()
    # request a: first output token came from prefill, so decode rounds start at position 1.
    pq.write_table(
        pa.table({
            "request_id": ["a", "a", "b"], "worker_id": [0, 0, 0], "round_index": [3, 2, 2],
            "k": [4, 4, 0], "num_accepted": [1, 4, 0], "num_committed": [2, 5, 1],
            "num_output_tokens": [8, 6, 2],
        }),
        steps / "part-000.parquet",
    )  # fmt: skip
    histories, starts = read_step_histories(tmp_path)
    assert histories == {"a": [(4, 4), (1, 4)], "b": [(0, 0)]}
    assert starts == {"a": [1, 6], "b": [1]}
    replay = ReplayAcceptance.from_job(tmp_path)
    rng = random.Random(0)
    assert replay.num_accepted("a", "", 1, 4, rng) == 4
    assert replay.num_accepted("a", "", 6, 4, rng) == 1
    assert replay.alpha("b") == replay.fallback_alpha == pytest.approx(5 / 6)


def _steps(rows: list[tuple[str, int, int, int, int, int]]) -> pa.Table:
    names = ("request_id", "round_index", "k", "num_accepted", "num_committed", "num_output_tokens")
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(names)})


def test_loader_keeps_committed_parts_and_furthest_attempt(tmp_path) -> None:
    for folder in ("steps", "results"):
        (tmp_path / folder).mkdir()
    # run A was killed after one round of "a" (its part committed with other work); run B re-ran "a".
    pq.write_table(
        _steps([("a", 0, 4, 0, 1, 2), ("b", 0, 2, 2, 3, 4)]), tmp_path / "steps/part-w00-A-00000.parquet"
    )
    pq.write_table(
        _steps([("a", 0, 4, 3, 4, 5), ("a", 1, 4, 1, 2, 7)]), tmp_path / "steps/part-w01-B-00000.parquet"
    )
    pq.write_table(_steps([("c", 0, 4, 4, 5, 6)]), tmp_path / "steps/part-w01-B-00001.parquet")  # uncommitted
    for name in ("part-w00-A-00000", "part-w01-B-00000"):
        pq.write_table(pa.table({"request_id": ["x"]}), tmp_path / f"results/{name}.parquet")
    histories, starts = read_step_histories(tmp_path)
    assert histories == {"a": [(3, 4), (1, 4)], "b": [(2, 2)]}
    assert starts == {"a": [1, 5], "b": [1]}
