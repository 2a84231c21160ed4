"""Prefill chunks split into passes so that padding costs little (`sched.packing.prefill_passes`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.core import Row, SamplingParams
from specbatch.sched.packing import prefill_passes


def work(*sizes: int) -> list[tuple[Row, int]]:
    return [(Row(f"r{i}", [1] * (size + 1), SamplingParams()), size) for i, size in enumerate(sizes)]


def shapes(passes) -> list[list[int]]:
    return [[size for _, size in chunks] for chunks in passes]


def test_a_long_chunk_and_its_short_tail_run_apart_where_a_pass_costs_less_than_the_padding():
    assert shapes(prefill_passes(work(44, 256), positions_per_pass=15)) == [[256], [44]]
    assert shapes(prefill_passes(work(44, 256), positions_per_pass=1000)) == [[256, 44]]  # host-bound passes


def test_similar_chunks_share_a_pass():
    assert shapes(prefill_passes(work(98, 100, 97, 20, 21), positions_per_pass=15)) == [[100, 98, 97], [21, 20]]
    assert shapes(prefill_passes(work(7), positions_per_pass=15)) == [[7]]
    assert prefill_passes([], positions_per_pass=15) == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.floats(0, 500))
def test_every_chunk_runs_once_and_the_split_costs_no_more_than_one_pass(sizes, per_pass):
    chunks = work(*sizes)
    passes = prefill_passes(chunks, per_pass)
    assert sorted(id(item) for chunks_ in passes for item in chunks_) == sorted(id(item) for item in chunks)
    cost = sum(per_pass + len(p) * max(size for _, size in p) for p in passes)
    assert cost <= per_pass + len(sizes) * max(sizes) + 1e-9
