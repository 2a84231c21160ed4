"""An engine that is done frees its KV caches at once, without waiting for the garbage collector:
a process that builds engines one after another (the bench, a test run) held every old engine's
gigabytes of slot caches until the collector happened to run, and the bench ran out of memory."""

from __future__ import annotations

import gc
import weakref

import pytest
from engine_helpers import random_prompts, run_engine, tiny_config

from specbatch.engine.build import load_models


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
