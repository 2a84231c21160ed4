"""One request cannot stop a job: a temperature too small to divide by is greedy, and an error raised
while serving one request drops that request as `failed` while every other one completes exactly;
what is not a request's fault (memory, device, file system) still ends the worker."""

from __future__ import annotations

import errno
from collections import defaultdict

import pytest
import torch
from engine_helpers import random_prompts, run_engine, tiny_config
from job_helpers import results, submit, write_config, write_jsonl

from specbatch.core import RoundOutcome, RoundPlan, Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.isolation import MAX_FAILED_IN_A_ROW, plan_rows, split_plan
from specbatch.loop import MemoryRecorder, generate

NUM_REQUESTS = 6
BAD = "r3"


class FailingFor:
    """The real backend, raising `error` for every plan that holds `request_id` once that request has
    `after_tokens` output tokens (0: at its first prefill)."""

    def __init__(self, backend, request_id: str | None, error: BaseException, after_tokens: int = 0) -> None:
        self.backend, self.request_id, self.error, self.after_tokens = backend, request_id, error, after_tokens

    def admit(self, row: Row) -> None:
        self.backend.admit(row)

    def release(self, row: Row, finished: bool) -> None:
        self.backend.release(row, finished)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        for row in plan_rows(plan):
            if self.request_id in (None, row.request_id) and row.num_output_tokens >= self.after_tokens:
                raise self.error
        return self.backend.execute(plan)


def run_failing(config, models, requests, request_id: str | None, error: BaseException, after_tokens: int = 0):
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder)
    engine.backend = FailingFor(engine.backend, request_id, error, after_tokens)
    rows = [Row(f"r{i}", prompt, SamplingParams(max_new_tokens=max_new))
            for i, (prompt, max_new) in enumerate(requests)]
    return generate(engine, rows), recorder


@pytest.fixture(scope="module")
def requests(tiny_pair):
    return [(prompt, max(max_new, 8)) for prompt, max_new in random_prompts(tiny_pair[2], NUM_REQUESTS, seed=31)]


@pytest.fixture(scope="module")
def outputs_without_bad(tiny_pair, requests):
    """Greedy outputs of the other requests run without the bad one (the same in any batch, §7.1)."""
    good = [request for i, request in enumerate(requests) if f"r{i}" != BAD]
    rows, _, _ = run_engine(tiny_config(tiny_pair), good)
    return [row.output_ids for row in rows.values()]


def test_temperature_too_small_to_divide_by_is_greedy(tiny_pair, requests):
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=4")
    models = load_models(config)
    greedy, _, _ = run_engine(config, requests, models=models)
    tiny, recorder, _ = run_engine(config, requests, models=models, temperature=1e-308)
    assert all(r.status == "completed" for r in recorder.results)
    assert {rid: row.output_ids for rid, row in tiny.items()} == {rid: row.output_ids for rid, row in greedy.items()}


@pytest.mark.parametrize("after_tokens", [0, 3])  # fails at its prefill / in the middle of decoding
@pytest.mark.parametrize("options", [
    ("drafter.kind=draft", "scheduler.max_batch_rows=4"),
    ("drafter.kind=ngram", "scheduler.max_batch_rows=6", "scheduler.prefill_chunk=fixed:8"),
    ("drafter.kind=draft", "scheduler.max_batch_rows=1"),  # every plan holds one row
])
def test_failing_request_is_dropped_and_the_others_are_exact(tiny_pair, requests, outputs_without_bad, options,
                                                            after_tokens):
    config = tiny_config(tiny_pair, *options)
    rows, recorder = run_failing(config, load_models(config), requests, BAD, ValueError("no such token"), after_tokens)
    assert [row.output_ids for rid, row in rows.items() if rid != BAD] == outputs_without_bad
    result = {r.request_id: r for r in recorder.results}
    assert result[BAD].status == "dropped" and result[BAD].drop_reason == "failed"
    assert result[BAD].drop_message == "ValueError: no such token"
    assert len(rows[BAD].output_ids) == after_tokens  # what it committed before the fault
    assert all(result[rid].status == "completed" for rid in rows if rid != BAD)
    assert_accounting(rows, recorder)


def assert_accounting(rows: dict[str, Row], recorder: MemoryRecorder) -> None:
    """DESIGN §7.3-7.4 with a failed request: each executed part of a round is a round."""
    steps_by_round = defaultdict(list)
    for step in recorder.steps:
        steps_by_round[step.round_index].append(step)
    assert [r.round_index for r in recorder.rounds] == list(range(len(recorder.rounds)))
    for record in recorder.rounds:
        steps = steps_by_round[record.round_index]
        assert record.num_committed == sum(s.num_committed for s in steps)
        assert record.num_accepted == sum(s.num_accepted for s in steps)
        assert all(s.num_committed <= s.num_accepted + 1 for s in steps)  # less only when it stopped early
        assert record.num_target_rows == sum(1 + s.num_proposed for s in steps) + record.num_prefill_tokens
    assert sum(r.num_committed for r in recorder.rounds) == sum(len(row.output_ids) for row in rows.values())
    for name in ("num_target_rows", "num_draft_rows", "num_proposed"):
        assert sum(getattr(r, name) for r in recorder.rounds) == sum(getattr(q, name) for q in recorder.requests)
    assert sorted(r.request_id for r in recorder.results) == sorted(rows)


@pytest.mark.parametrize("error", [
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: device-side assert triggered"),
    OSError(errno.ENOSPC, "No space left on device"),
    KeyboardInterrupt(),
], ids=lambda error: type(error).__name__)
def test_what_is_not_a_request_fault_ends_the_worker(tiny_pair, requests, error):
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=4")
    with pytest.raises(type(error)):
        run_failing(config, load_models(config), requests, "r1", error, after_tokens=2)


def test_every_request_failing_ends_the_worker(tiny_pair, requests):
    """Failures with no success between them are the engine's, not the records': `failed` rows are
    never run again, so the worker stops before it turns a whole job into them."""
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=4")
    many = requests * (MAX_FAILED_IN_A_ROW // len(requests) + 1)
    with pytest.raises(ValueError, match="broken"):
        run_failing(config, load_models(config), many, None, ValueError("broken"))


def test_split_plan_keeps_a_rows_prefill_and_verify_together():
    rows = [Row(f"r{i}", [1, 2, 3], SamplingParams()) for i in range(3)]
    plan = RoundPlan(prefill=[(rows[2], 2)], decode=[(rows[0], 1), (rows[1], 0), (rows[2], 3)], plan_ms=5.0)
    first, second = split_plan(plan)
    assert plan_rows(first) == [rows[2]] and first.prefill == [(rows[2], 2)] and first.decode == [(rows[2], 3)]
    assert plan_rows(second) == rows[:2] and not second.prefill
    assert (first.plan_ms, second.plan_ms) == (5.0, 0.0)


@pytest.mark.slow  # a whole job through the CLI; the logic is tested without one above
def test_job_with_a_tiny_temperature_completes(tmp_path, tiny_pair):
    records = [{"id": "zero", "prompt": "def add(a, b):", "max_new_tokens": 12, "temperature": 0},
               {"id": "tiny", "prompt": "def add(a, b):", "max_new_tokens": 12, "temperature": 1e-308},
               {"id": "warm", "prompt": "The quick brown fox", "max_new_tokens": 12, "temperature": 0.8}]
    dataset = write_jsonl(tmp_path / "data.jsonl", records)
    run = submit(dataset, write_config(tmp_path, tiny_pair), "tiny", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    rows = {r["request_id"]: r for r in results(tmp_path / "out" / "tiny")}
    assert [rows[name]["status"] for name in ("zero", "tiny", "warm")] == ["completed"] * 3
    assert list(rows["tiny"]["output_token_ids"]) == list(rows["zero"]["output_token_ids"])
