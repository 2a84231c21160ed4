"""The embedded default: the bundled demo pair loads with an empty config, is exact, drafts well on
code, and `specbatch submit` runs on it with no options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_helpers import greedy_reference

from specbatch.config import DrafterConfig, JobConfig, load_config
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.engine.model_paths import BUNDLED_DIR
from specbatch.lab.prompts import heldout_prompts
from specbatch.loop import MemoryRecorder, generate

pytestmark = pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")


@pytest.fixture(scope="module")
def bundled():
    """The bundled models for each drafter kind, loaded once."""
    loaded: dict[str, object] = {}

    def models(kind: str):
        if kind not in loaded:
            loaded[kind] = load_models(JobConfig(drafter=DrafterConfig(kind=kind)))
        return loaded[kind]
    return models


def test_models_path_prints_bundled_directories():
    for which in ("target", "draft"):
        out = subprocess.run([sys.executable, "-m", "specbatch.cli", "models", "path", which],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out.endswith(f"demo/{which}")


# (drafter, lookahead, least acceptance on code): the distilled draft's per-token greedy α is ≈ 0.83 on
# code, the EAGLE head's too; with k = 4 the accepted share of proposals is lower than α
# (the default suite runs the embedded default and k = 4 for each drafter; the rest, ~25 s each, `-m slow`)
@pytest.mark.parametrize(("kind", "lookahead", "least_acceptance"), [
    ("draft", "fixed:4", 0.4), pytest.param("draft", "fixed:1", 0.7, marks=pytest.mark.slow),
    ("draft", "adaptive", None), ("eagle", "fixed:4", 0.4),
    pytest.param("eagle", "fixed:1", 0.7, marks=pytest.mark.slow),
    pytest.param("eagle", "adaptive", None, marks=pytest.mark.slow)])
def test_bundled_pair_is_exact_and_the_drafter_is_accepted(bundled, kind, lookahead, least_acceptance):
    models = bundled(kind)
    config = load_config(None, [f"drafter.kind={kind}", f"scheduler.lookahead={lookahead}",
                                "scheduler.max_batch_rows=7"])
    prompts = heldout_prompts(models.tokenizer, 16, 32)
    recorder = MemoryRecorder()
    engine = build_hf_engine(config, models, recorder)
    rows = [p.to_row() for p in prompts]
    generate(engine, rows)
    eos, pad = models.tokenizer.eos_token_id, models.tokenizer.pad_token_id
    for prompt, row in zip(prompts, rows, strict=True):
        assert row.output_ids == greedy_reference(models.target, list(prompt.prompt_ids), prompt.max_new_tokens,
                                                  eos, pad)
    if least_acceptance is not None:
        code = [r for r in rows if r.domain == "code"]
        assert sum(r.num_accepted for r in code) / sum(r.num_proposed for r in code) > least_acceptance


def test_the_embedded_default_drafts_with_the_bundled_draft_adaptively():
    config = JobConfig()
    assert (config.drafter.kind, str(config.scheduler.lookahead), config.models.draft) == (
        "draft", "adaptive", "bundled:draft")


def test_submit_runs_on_the_embedded_default(tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "max_new_tokens": 16}) + "\n"
                               for i, p in enumerate(["def parse(text):\n", "The for statement"])))
    run = subprocess.run([sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--job-id", "d",
                          "--output", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in (tmp_path / "d" / "results.jsonl").read_text().splitlines()]
    assert [line["status"] for line in lines] == ["completed", "completed"]
    assert all(line["text"] for line in lines)
