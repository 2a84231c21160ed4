"""`sampling.coupling: gumbel` gives each seeded request the target's own sample, whatever the batch,
drafter, lookahead, worker count or resume; both couplings keep the target's law (test_sampling.py)."""

from __future__ import annotations

import signal

import pytest
from engine_helpers import random_prompts, run_engine, tiny_config
from job_helpers import results, submit, write_config, write_jsonl

from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.loop import MemoryRecorder, generate

SAMPLED = {"temperature": 0.8, "top_p": 0.95}


def sampled_outputs(config, prompts, models, lookahead=None) -> dict[str, list[int]]:
    engine = build_hf_engine(config, models, MemoryRecorder())
    if lookahead is not None:
        engine.scheduler.lookahead = lookahead
    rows = [Row(f"r{i}", prompt, SamplingParams(max_new_tokens=max_new, seed=100 + i, **SAMPLED))
            for i, (prompt, max_new) in enumerate(prompts)]
    return {request_id: row.output_ids for request_id, row in generate(engine, rows).items()}


@pytest.fixture(scope="module")
def prompts(tiny_pair):
    return random_prompts(tiny_pair[2], 12, seed=11)


@pytest.fixture(scope="module")
def models(tiny_pair):
    return load_models(tiny_config(tiny_pair))


@pytest.fixture(scope="module")
def reference(tiny_pair, prompts, models):
    """The target alone, one row at a time: no drafts, batch 1."""
    config = tiny_config(tiny_pair, "sampling.coupling=gumbel", "drafter.kind=none", "scheduler.max_batch_rows=1")
    return sampled_outputs(config, prompts, models)


@pytest.mark.parametrize(("drafter", "lookahead", "batch"), [
    ("none", "fixed:0", 12), ("draft", "fixed:4", 1), ("draft", "fixed:4", 12), ("draft", "adaptive", 5),
    ("ngram", "fixed:4", 12), ("draft", "fixed:8", 3),
])
def test_gumbel_output_is_the_targets_own_sample(tiny_pair, prompts, models, reference, drafter, lookahead, batch):
    config = tiny_config(tiny_pair, "sampling.coupling=gumbel", f"drafter.kind={drafter}",
                         f"scheduler.lookahead={lookahead}", f"scheduler.max_batch_rows={batch}")
    assert sampled_outputs(config, prompts, models) == reference


def test_rejection_coupling_depends_on_the_batch(tiny_pair, prompts, models):
    """Why gumbel exists: with rejection, the same seeds give other text once k or batching change."""
    outputs = [sampled_outputs(tiny_config(tiny_pair, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}"),
                               prompts, models) for drafter, batch in (("none", 1), ("draft", 12))]
    assert outputs[0] != outputs[1]


def test_gumbel_accepts_drafts(tiny_pair, prompts, models):
    """The drafter proposes with the target's noise, so it agrees often (a draft equal to the target
    accepts everything)."""
    target = tiny_pair[0]
    config = tiny_config((target, target, tiny_pair[2]), "sampling.coupling=gumbel", "scheduler.lookahead=fixed:3")
    rows = [(prompt, max_new) for prompt, max_new in prompts]
    _, recorder, _ = run_engine(config, rows, models=load_models(config), seed=7, **SAMPLED)
    proposed = sum(r.num_proposed for r in recorder.rounds)
    assert proposed and sum(r.num_accepted for r in recorder.rounds) == proposed


@pytest.mark.slow
def test_gumbel_job_is_identical_across_workers_and_a_kill(tmp_path, tiny_pair):
    records = [{"id": f"q{i}", "prompt": f"def f{i}(x):\n    return x * {i}", "max_new_tokens": 24,
                "temperature": 0.9, "seed": i} for i in range(24)]
    dataset = write_jsonl(tmp_path / "data.jsonl", records)
    runs = {}
    for name, workers, crash in (("one", 1, None), ("two", 2, None), ("killed", 1, "part_committed:2")):
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, tiny_pair, sampling={"coupling": "gumbel"},
                              workers={"num_processes": workers})
        if crash is not None:
            killed = submit(dataset, config, name, tmp_path / "out", env={"SPECBATCH_CRASH_AT": crash})
            assert killed.returncode == -signal.SIGKILL
        run = submit(dataset, config, name, tmp_path / "out")
        assert run.returncode == 0, run.stderr
        runs[name] = {r["request_id"]: r["output_token_ids"] for r in results(tmp_path / "out" / name)}
    assert len(runs["one"]) == len(records)
    assert runs["one"] == runs["two"] == runs["killed"]
