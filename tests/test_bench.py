"""`specbatch bench` runs every configuration on the same prompts, exactly, and charges graph
capture to the job it would serve (the figures themselves are benchmarks, never asserted here)."""

from __future__ import annotations

import io
import json
from dataclasses import fields

import pytest
import torch
from conftest import make_tokenizer
from rich.console import Console

from specbatch.config import JobConfig
from specbatch.core import Row, SamplingParams
from specbatch.engine import gemm_peak
from specbatch.engine.loading import load_tokenizer
from specbatch.engine.model_paths import BUNDLED_DIR
from specbatch.lab.bench import BenchResult, add_mfu, run_bench, summarize_engine, write_json
from specbatch.lab.prompts import file_prompts
from specbatch.loop import MemoryRecorder
from specbatch.records import RoundRecord


@pytest.mark.slow  # ~15 s: every configuration twice over
@pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")
def test_bench_runs_every_configuration_at_every_batch_size_exactly():
    results = run_bench(4, 16, (2, 1), overrides=["scheduler.lookahead=fixed:2"], assisted_prompts=2,
                        console=Console(file=io.StringIO()))
    configurations = ["hf-generate", "specbatch-none", "specbatch-eagle", "specbatch-draft", "specbatch-ngram",
                      "specbatch-suffix"]
    assert [(r.batch_rows, r.name) for r in results] == [
        *((1, name) for name in configurations), *((2, name) for name in configurations), (1, "hf-assisted")]
    assert all(r.exact_match == 1.0 for r in results)
    assert len({r.num_tokens for r in results}) == 2  # the same outputs (hf-assisted: 2 of the 4 prompts)
    for batch in (1, 2):
        rows = {r.name: r for r in results if r.batch_rows == batch}
        assert rows["hf-generate"].ratio_vs_hf_generate == 1.0 and rows["specbatch-none"].ratio_vs_none == 1.0
        assert rows["specbatch-draft"].alpha is not None and rows["specbatch-none"].alpha is None


@pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")
def test_a_bench_of_drafters_the_config_does_not_name_runs_and_repeats():
    """The embedded default drafts with the EAGLE head; a bench of the draft model alone loads no head
    and must not warm up (or run) with the config's drafter. With repeats, each row is one of its runs."""
    results = run_bench(2, 8, (1,), drafters=("none", "draft"), lookaheads=("fixed:2",),
                        console=Console(file=io.StringIO()), repeats=2)
    assert [r.name for r in results] == ["hf-generate", "specbatch-none", "specbatch-draft-fixed:2", "hf-assisted"]
    assert all(r.exact_match == 1.0 for r in results)
    assert [r.num_runs for r in results] == [2, 2, 2, 1]


@pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")
def test_every_row_reports_its_mfu_against_the_peak_measured_before_the_runs(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("SPECBATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_peak, "measure_gflops", lambda dtype, device: 100.0)
    out = io.StringIO()
    results = run_bench(1, 4, (1,), drafters=("none",), console=Console(file=out, width=400))
    num_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(BUNDLED_DIR / "target").parameters())
    assert [r.name for r in results] == ["hf-generate", "specbatch-none"]
    for result in results:
        assert result.gemm_peak_gflops == 100.0
        assert result.mfu == pytest.approx(result.tokens_per_s * 2 * num_params / 100e9)
        # prompts and verify windows count too: more than one position a token
        assert result.mfu_positions == pytest.approx(result.mfu * result.target_rows_per_token)
        assert result.mfu_positions > result.mfu
    table = out.getvalue()
    assert " MFU " in table and " MFU pos " in table and "100 GFLOPS float32 GEMM peak (2048³, measured)" in table
    write_json(results, tmp_path / "bench.json")
    assert all("mfu" in row for row in json.loads((tmp_path / "bench.json").read_text())["results"])


def test_a_row_that_did_not_run_has_no_mfu():
    peak = gemm_peak.GemmPeak(200.0, torch.float32, 2048, cached=True)
    ran = BenchResult(name="vllm-none", tokens_per_s=1000.0, exact_match=1.0, num_prompts=1, num_tokens=1, wall_s=1.0)
    failed = BenchResult(name="vllm-eagle-k4", tokens_per_s=0.0, exact_match=0.0, num_prompts=0, num_tokens=0,
                         wall_s=0.0, error="ValueError: no")
    add_mfu([ran, failed], 10_000_000, peak)
    assert ran.mfu == pytest.approx(0.1) and failed.mfu is None  # 1000 × 2 × 10M = 20 of 200 GFLOPS
    assert ran.mfu_positions is None  # a peer does not count its positions


def _round(**values) -> RoundRecord:
    return RoundRecord(**{f.name: 0 for f in fields(RoundRecord)} | values)


def test_graph_capture_is_timed_apart_and_charged_once_per_job():
    recorder = MemoryRecorder()
    recorder.add_round(_round(warmup_ms=30_000.0, round_ms=30_500.0))
    recorder.add_round(_round(round_ms=500.0))
    rows = [Row(f"r{index}", [1, 2], SamplingParams(max_new_tokens=10), output=list(range(10)))
            for index in range(10)]
    refs = {row.request_id: row.output_ids for row in rows}
    result = summarize_engine("specbatch-none-compile", rows, recorder, refs, wall_s=31.0, k=0, job_prompts=1000)
    assert result.warmup_s == pytest.approx(30.0)
    assert result.tokens_per_s == pytest.approx(100 / 1.0)  # 100 tokens in the 1 s after capture
    assert result.tokens_per_s_job == pytest.approx(100 * 100 / (1.0 * 100 + 30.0))  # 100× the prompts, one capture
    assert result.mask_overhead_share is None  # nothing masked


def test_a_constrained_rows_mask_overhead_is_the_wait_its_rounds_did_not_hide():
    recorder = MemoryRecorder()
    recorder.add_round(_round(round_ms=80.0, mask_ms=30.0, mask_wait_ms=4.0))  # masks filled beside the pass
    recorder.add_round(_round(round_ms=20.0))
    rows = [Row("r", [1, 2], SamplingParams(max_new_tokens=10), output=[3, 4])]
    result = summarize_engine("specbatch-none", rows, recorder, {"r": [3, 4]}, wall_s=0.1, k=0)
    assert result.mask_overhead_share == pytest.approx(4.0 / 100.0)


@pytest.mark.skipif(not (BUNDLED_DIR / "target" / "config.json").exists(), reason="demo pair not built")
def test_a_users_prompts_file_is_read_as_a_job_reads_it(tmp_path):
    """Malformed and over-long records are dropped as a job drops them; the rest keep dataset order,
    their own max_new_tokens and domain, and the ids a job's tokenization gives."""
    config = JobConfig.model_validate({"capacity": {"max_context": 64}})
    tokenizer = load_tokenizer(config.models)
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "z", "prompt": "def parse(text):\n", "max_new_tokens": 12, "domain": "code"}),
        "{not json",
        json.dumps({"id": "long", "prompt": "word " * 200}),
        json.dumps({"id": "a", "prompt": "The for statement"}),
    ]) + "\n")
    prompts, num_dropped = file_prompts(path, config, tokenizer)
    assert num_dropped == 2
    assert [(p.request_id, p.domain, p.max_new_tokens) for p in prompts] == [
        ("z", "code", 12), ("a", "", config.sampling.max_new_tokens)]
    assert list(prompts[1].prompt_ids) == tokenizer("The for statement", add_special_tokens=False)["input_ids"]


def test_a_peer_without_its_venv_is_refused_before_anything_runs(tmp_path):
    from specbatch.lab.peer import PeerError

    with pytest.raises(PeerError, match="setup_vllm.sh"):
        run_bench(4, 16, (1,), console=Console(file=io.StringIO()), peer="vllm", peer_venv=tmp_path / "none")


def test_peer_rows_carry_ratios_and_agreement_at_their_batch_size():
    from specbatch.lab.bench import BenchResult, _peer_rows

    refs = {"a": [1, 2], "b": [3]}
    ours = [BenchResult(name="hf-generate", batch_rows=8, tokens_per_s=50.0, exact_match=1.0, num_prompts=2,
                        num_tokens=3, wall_s=0.06),
            BenchResult(name="specbatch-none", batch_rows=8, tokens_per_s=100.0, exact_match=1.0, num_prompts=2,
                        num_tokens=3, wall_s=0.03, outputs=refs)]
    peer = {"results": [
        {"mode": "none", "batch_rows": 8, "startup_s": 40.0, "wall_s": 0.05, "outputs": {"a": [1, 2], "b": [4]}},
        {"mode": "eagle", "batch_rows": 8, "error": "ValueError: no"}]}
    rows = _peer_rows(peer, refs, ours, 4)
    assert [r.name for r in rows] == ["vllm-none", "vllm-eagle-k4"]
    assert rows[0].tokens_per_s == pytest.approx(60.0) and rows[0].warmup_s == 40.0
    assert rows[0].same_as_specbatch == 0.5 and rows[0].exact_match == 0.5
    assert rows[0].ratio_vs_none == pytest.approx(0.6) and ours[1].ratio_vs_peer == pytest.approx(100 / 60)
    assert rows[1].error == "ValueError: no" and rows[1].ratio_vs_peer is None


def _vllm_guidance_grammar(fields: dict) -> str:
    """The grammar vLLM's llguidance backend compiles from `StructuredOutputsParams(**fields)` with its
    default config (free whitespace allowed): vllm/v1/structured_output/backend_guidance.py."""
    import llguidance

    if "json" in fields:
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(fields["json"]),
                                                             defaults={"whitespace_flexible": True})
    kind, text = next(iter(fields.items()))
    return llguidance.grammar_from(kind, text)


@pytest.mark.parametrize("fields", [
    {"json_schema": {"type": "object", "properties": {"k": {"enum": ["yes", "no"]}, "n": {"type": "integer"},
                                                      "tags": {"type": "array", "items": {"type": "string"}}},
                     "required": ["k", "n", "tags"], "additionalProperties": False}},
    {"response_format": {"type": "json_object"}}, {"choice": ["alpha", "beta", "be"]},
    {"regex": "[0-9]{2}-[a-c]+"}, {"grammar": 'start: "print(" NUM ")"\nNUM: /[0-9]+/'}])
def test_the_peer_masks_each_constraint_as_specbatch_does(fields):
    """vLLM must run the job's grammar, not its own reading of the schema: the same mask at every
    step of valid and near-valid outputs (free whitespace, compact separators), or its outputs and
    speed answer a different question."""
    import llguidance

    from specbatch.data.constraints import llguidance_tokenizer, parse_constraint
    from specbatch.lab.peer import structured_output

    hf_tokenizer = make_tokenizer()
    tokenizer = llguidance_tokenizer(hf_tokenizer)
    constraint = parse_constraint(fields)
    assert constraint is not None
    ours = llguidance.LLMatcher(tokenizer, constraint.grammar(), log_level=0)
    peers = llguidance.LLMatcher(tokenizer, _vllm_guidance_grammar(structured_output(constraint)), log_level=0)
    texts = ['{"k": "yes", "n": 12, "tags": ["a", "b"]}', '{"k":"no","n":1,"tags":[]}', '{ "k": "no"}',
             "beta", "be", "12-abc", "print(42)", "print( 4)"]
    for text in texts:
        ours.reset()
        peers.reset()
        for token in hf_tokenizer.encode(text):
            assert ours.compute_bitmask() == peers.compute_bitmask()
            if not ours.consume_token(token):
                assert not peers.consume_token(token)
                break
            assert peers.consume_token(token)


def test_a_peer_rows_valid_share_counts_the_outputs_it_finished():
    from specbatch.lab.bench import _peer_valid_share
    from specbatch.lab.prompts import BenchPrompt

    tokenizer = make_tokenizer()
    choice = json.dumps({"kind": "choice", "text": json.dumps(["code", "prose"])})
    prompts = [BenchPrompt(name, "prose", (1, 2), 4, choice) for name in ("a", "b", "c")]
    outputs = {"a": tokenizer.encode("code"), "b": tokenizer.encode("poem"), "c": tokenizer.encode("pro")}
    run = {"mode": "none", "batch_rows": 8, "outputs": outputs,
           "finish_reasons": {"a": "stop", "b": "stop", "c": "length"}}
    assert _peer_valid_share(run, prompts, tokenizer) == 0.5  # "pro" ran out of tokens: not judged
