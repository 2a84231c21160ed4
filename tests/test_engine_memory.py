"""An engine that is done frees its KV caches at once, without waiting for the garbage collector:
a process that builds engines one after another (the bench, a test run) held every old engine's
gigabytes of slot caches until the collector happened to run, and the bench ran out of memory."""

from __future__ import annotations

import gc
import weakref

import pytest
from engine_helpers import random_prompts, run_engine, tiny_config

from specbatch.engine.build import load_models
from specbatch.loop import fewer_collections


@pytest.mark.parametrize("drafter", ["none", "draft", "ngram", "eagle"])
def test_a_finished_engine_frees_its_caches_without_the_collector(tiny_pair, tiny_eagle, drafter):
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", f"models.eagle={tiny_eagle}")
    models = load_models(config)
    gc.collect()
    gc.disable()
    try:
        rows, _, engine = run_engine(config, random_prompts(tiny_pair[2], 4), models=models)
        assert len(rows) == 4
        caches = [weakref.ref(engine.backend.target.cache.keys[0])]
        drafter = engine.backend.drafter
        if hasattr(drafter, "draft") or hasattr(drafter, "cache"):  # a draft model's blocks, an EAGLE head's lanes
            caches.append(weakref.ref((drafter.draft.cache if hasattr(drafter, "draft") else drafter.cache).keys[0]))
        del drafter
        del engine
        assert all(cache() is None for cache in caches)
    finally:
        gc.enable()


def test_rounds_run_with_fewer_collections_and_restore_the_threshold():
    """Engine.run and a worker's loop collect cyclic garbage every 100,000 allocations (a suffix
    index's many small objects made each default collection walk them all); after, the process's own
    threshold is back, even when a round raised."""
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() == (100_000, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a round failed")
    assert gc.get_threshold() == before
