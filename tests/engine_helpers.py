"""Helpers shared by engine tests: build an engine on the tiny pair, reference greedy outputs."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import torch

from specbatch.config import load_config
from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.loop import MemoryRecorder, generate


@dataclass
class MixedLookahead:
    """Test policy: rows get k from a fixed cycle in the order they are first seen, so one batch
    mixes k = 0..8, the same in every process (no `hash()`, which PYTHONHASHSEED changes)."""

    cycle: tuple[int, ...] = (0, 3, 8, 1, 5, 2)
    name: str = "mixed"
    assigned: dict[str, int] = field(default_factory=dict)

    def choose(self, rows, caps):
        for row in rows:
            self.assigned.setdefault(row.request_id, self.cycle[len(self.assigned) % len(self.cycle)])
        return [min(self.assigned[r.request_id], cap) for r, cap in zip(rows, caps, strict=True)]

    def drafts_when_current(self, rows, caps):
        return any(self.assigned.get(r.request_id, 1) and cap for r, cap in zip(rows, caps, strict=True))


# Settings every tiny engine test runs under, e.g. "models.device=cuda;models.graphs=cuda-graphs"
# (benchmarks/gpu_check.sh runs the exactness tests so on a GPU); a test's own overrides come after.
TEST_SETTINGS = [item for item in os.environ.get("SPECBATCH_TEST_SET", "").split(";") if item]


def tiny_config(pair, *overrides: str):
    target, draft, _ = pair
    extra = [f"models.tokenizer={target.parent / 'tokenizer'}"] if (target.parent / "tokenizer").exists() else []
    return load_config(None, [f"models.target={target}", f"models.draft={draft}", "models.dtype=float64",
                              "drafter.kind=draft", "scheduler.lookahead=fixed:4", *extra, *TEST_SETTINGS, *overrides])


def random_prompts(tokenizer, n: int, seed: int = 0, max_len: int = 40) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    vocab = len(tokenizer)
    return [([rng.randrange(2, vocab) for _ in range(rng.randint(1, max_len))], rng.randint(1, 24))
            for _ in range(n)]


def run_engine(config, requests, lookahead=None, models=None, prepare=None, shared_prefix_tokens=0, **params):
    """Requests r0, r1, ... through one engine; `prepare(engine)` may adjust it before they run;
    `shared_prefix_tokens`: the pool's room for shared prefixes, as a job's ingest counts them."""
    models = models or load_models(config)
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder, shared_prefix_tokens=shared_prefix_tokens)
    if lookahead is not None:
        engine.scheduler.lookahead = lookahead
    if prepare is not None:
        prepare(engine)
    rows = [Row(f"r{i}", prompt, SamplingParams(max_new_tokens=max_new, **params))
            for i, (prompt, max_new) in enumerate(requests)]
    return generate(engine, rows), recorder, engine


def assert_exact(rows: dict[str, Row], refs: list[list[int]]) -> None:
    """Request r{i}'s output equals refs[i], the target's own greedy decoding, for every i."""
    for i, ref in enumerate(refs):
        assert rows[f"r{i}"].output_ids == ref, f"request r{i} diverged from the target's greedy output"


def greedy_reference(model, prompt: list[int], max_new_tokens: int, eos: int, pad: int) -> list[int]:
    """The target's own greedy decoding of one prompt alone (batch size 1), via HF generate."""
    output = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=max_new_tokens, do_sample=False,
                            eos_token_id=eos, pad_token_id=pad)
    return output[0, len(prompt):].tolist()
