"""Captured graphs (`models.graphs`): the bucket set a job gets, where padded rows go, and, in the
slow suite, greedy output of compiled passes identical to the target's own (eager) greedy decoding."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import MixedLookahead, assert_exact, greedy_reference, random_prompts, run_engine, tiny_config

from specbatch.config import ConfigError, JobConfig, load_config
from specbatch.engine.build import load_models
from specbatch.engine.graphs import warm_shapes
from specbatch.engine.sampling import request_generator
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.factory import job_buckets


def test_eager_keeps_the_configured_buckets():
    config = load_config(None, ["buckets.batch_rows=[4,8]", "buckets.kv_len_multiple=16"])
    assert job_buckets(config) == ShapeBuckets((4, 8), (), 16)
    assert job_buckets(JobConfig()) == ShapeBuckets((), (), 32)


def test_compile_pads_only_sizes_of_one():
    assert job_buckets(load_config(None, ["models.graphs=compile"])) == ShapeBuckets((2,), (2,), 32)
    plain = load_config(None, ["models.graphs=compile", "drafter.kind=none", "scheduler.lookahead=fixed:0",
                               "scheduler.max_lookahead=0"])
    assert job_buckets(plain) == ShapeBuckets((2,), (), 32)  # no verify pass ever has 2 positions
    configured = load_config(None, ["models.graphs=compile", "buckets.batch_rows=[8]"])
    assert job_buckets(configured) == ShapeBuckets((8,), (), 32)


def test_cuda_graphs_get_powers_of_two_and_one_plus_k():
    config = JobConfig.model_validate({"models": {"graphs": "cuda-graphs", "device": "cuda"},
                                       "scheduler": {"max_batch_rows": 24, "max_lookahead": 6}})
    assert job_buckets(config) == ShapeBuckets((2, 4, 8, 16, 24), (2, 3, 5, 7), 32)


def test_cuda_graphs_on_a_cpu_are_refused():
    with pytest.raises(ConfigError, match="cuda-graphs needs CUDA devices, not cpu"):
        load_config(None, ["models.graphs=cuda-graphs"])
    with pytest.raises(ConfigError, match="not cpu and cuda:0"):
        load_config(None, ["models.graphs=cuda-graphs", "models.device=cuda:0", "models.draft_device=cpu"])
    load_config(None, ["models.graphs=cuda-graphs", "models.device=cuda:0"])  # the draft follows the target


def test_warm_shapes_are_one_pass_per_padded_shape():
    assert warm_shapes(ShapeBuckets((2,), (2,)), 32, 5) == [(1, 1), (1, 5), (32, 1), (32, 5)]
    assert warm_shapes(ShapeBuckets((2, 4, 8), (2, 5)), 8, 5) == [
        (1, 1), (1, 5), (4, 1), (4, 5), (8, 1), (8, 5)]


def test_request_generators_live_on_the_given_device():
    assert request_generator("r0", None, 0, "cpu").device.type == "cpu"
    same = [torch.rand(3, generator=request_generator("r0", None, 0)) for _ in range(2)]
    assert torch.equal(*same)


@pytest.fixture(scope="module")
def compiled(tiny_pair):
    """One tiny pair loaded once, so each of its graphs compiles once for the whole module."""
    config = tiny_config(tiny_pair, "models.graphs=compile")
    models = load_models(config)
    tokenizer = tiny_pair[2]
    requests = random_prompts(tokenizer, 32)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    return models, requests, refs


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["draft", "ngram", "none"])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_compiled_greedy_matches_the_target(tiny_pair, compiled, drafter, batch):
    models, requests, refs = compiled
    count = {1: 4, 7: 12, 32: 32}[batch]
    lookahead = "fixed:0" if drafter == "none" else "fixed:3"
    config = tiny_config(tiny_pair, "models.graphs=compile", f"drafter.kind={drafter}",
                         f"scheduler.max_batch_rows={batch}", f"scheduler.lookahead={lookahead}",
                         "scheduler.prefill_chunk=fixed:16")
    rows, recorder, _ = run_engine(config, requests[:count], models=models)
    assert_exact(rows, refs[:count])
    first, *rest = recorder.rounds
    assert first.warmup_ms > 0 and all(r.warmup_ms == 0 for r in rest)
    assert first.round_ms >= first.warmup_ms


@pytest.mark.slow
def test_compiled_mixed_lookahead_with_rows_joining_and_leaving(tiny_pair, compiled):
    models, requests, refs = compiled
    config = tiny_config(tiny_pair, "models.graphs=compile", "scheduler.max_batch_rows=5",
                         "scheduler.lookahead=fixed:8", "scheduler.prefill_chunk=fixed:5")
    rows, recorder, _ = run_engine(config, requests, lookahead=MixedLookahead(), models=models)
    assert_exact(rows, refs)
    assert len({r.query_len for r in recorder.rounds if r.query_len}) > 2
