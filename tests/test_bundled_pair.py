"""The embedded default: the bundled demo pair loads with an empty config, is exact, drafts well on
code, and `specbatch submit` runs on it with no options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_helpers import greedy_reference

from specbatch.config import JobConfig
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.engine.loading import BUNDLED_DIR
from specbatch.lab.prompts import heldout_prompts
from specbatch.loop import MemoryRecorder, generate

pytestmark = pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")


@pytest.fixture(scope="module")
def bundled():
    return load_models(JobConfig())


def test_models_path_prints_bundled_directories():
    for which in ("target", "draft"):
        out = subprocess.run([sys.executable, "-m", "specbatch.cli", "models", "path", which],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out.endswith(f"demo/{which}")


def test_bundled_pair_is_exact_and_the_draft_is_accepted(bundled):
    prompts = heldout_prompts(bundled.tokenizer, 8, 32)
    recorder = MemoryRecorder()
    engine = build_hf_engine(JobConfig(), bundled, recorder)
    rows = [p.to_row() for p in prompts]
    generate(engine, rows)
    eos, pad = bundled.tokenizer.eos_token_id, bundled.tokenizer.pad_token_id
    for prompt, row in zip(prompts, rows, strict=True):
        assert row.output_ids == greedy_reference(bundled.target, list(prompt.prompt_ids), prompt.max_new_tokens,
                                                  eos, pad)
    code = [r for r in rows if r.domain == "code"]
    assert sum(r.num_accepted for r in code) / sum(r.num_proposed for r in code) > 0.05  # k=4, α≈0.37


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
