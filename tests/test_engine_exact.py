"""Invariant 1: greedy speculative output equals the target's own greedy decoding, token for
token, for every drafter, lookahead (fixed and mixed per row), batch size and shape bucket."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import MixedLookahead, assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from transformers import LlamaForCausalLM

from specbatch.engine.build import hf_backend, load_models
from specbatch.engine.forward import cache_argument

NUM_PROMPTS = 32


@pytest.fixture(scope="module")
def references(tiny_pair):
    config = tiny_config(tiny_pair)
    models = load_models(config)
    tokenizer = tiny_pair[2]
    requests = random_prompts(tokenizer, NUM_PROMPTS)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    return requests, refs


@pytest.mark.parametrize("drafter", ["draft", "ngram", "suffix", "none"])
@pytest.mark.parametrize("lookahead", ["fixed:1", "fixed:3", "fixed:5", "mixed"])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_greedy_matches_target(tiny_pair, references, drafter, lookahead, batch):
    requests, refs = references
    count = {1: 6, 7: 14, 32: NUM_PROMPTS}[batch]
    policy = MixedLookahead() if lookahead == "mixed" else None
    config = tiny_config(tiny_pair, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                         f"scheduler.lookahead={'fixed:8' if policy else lookahead}",
                         "scheduler.prefill_chunk=fixed:16")
    rows, recorder, _ = run_engine(config, requests[:count], lookahead=policy)
    assert_exact(rows, refs[:count])
    if drafter == "draft":
        assert sum(r.num_accepted for r in recorder.rounds) > 0


@pytest.mark.parametrize("buckets", [("batch_rows=[4,8,16]", "query_len=[2,4,8,16]"), ("kv_len_multiple=64",)])
def test_greedy_exact_with_shape_buckets(tiny_pair, references, buckets):
    requests, refs = references
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=11", *(f"buckets.{b}" for b in buckets))
    rows, recorder, _ = run_engine(config, requests[:20])
    assert_exact(rows, refs[:20])
    # an eager pass is flat: buckets (for compiled steps) pad no row to another's length
    assert sum(r.num_padded_target_rows for r in recorder.rounds) == 0


def test_rows_join_and_leave_mid_run(tiny_pair, references):
    """Continuous batching: few slots, and new requests arrive while others run."""
    requests, refs = references
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=3", "scheduler.prefill_chunk=fixed:5")
    from specbatch.core import Row, SamplingParams
    from specbatch.engine.build import build_hf_engine as build
    from specbatch.loop import MemoryRecorder as Recorder

    models = load_models(config)
    engine = build(config, models, Recorder())
    rows = [Row(f"r{i}", p, SamplingParams(max_new_tokens=m)) for i, (p, m) in enumerate(requests[:12])]
    for row in rows[:4]:
        engine.add(row)
    for round_index in range(200):
        if round_index % 3 == 0 and round_index // 3 + 4 < len(rows):
            engine.add(rows[round_index // 3 + 4])
        engine.step()
    engine.run()
    assert_exact({r.request_id: r for r in rows}, refs[:12])


def test_gpt2_family_is_exact(tiny_gpt2):
    target, draft, tokenizer = tiny_gpt2
    config = tiny_config(tiny_gpt2, "scheduler.max_batch_rows=5")
    models = load_models(config)
    requests = random_prompts(tokenizer, 8, seed=5)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    for attn in ("sdpa", "eager"):
        config = tiny_config(tiny_gpt2, "scheduler.max_batch_rows=5", f"models.attn_implementation={attn}")
        rows, _, _ = run_engine(config, requests)
        assert_exact(rows, refs)


@pytest.mark.parametrize("pair", ["tiny_pair", "tiny_gpt2"])
@pytest.mark.parametrize("chunks", [[[5, 6, 7, 8], [9], [10, 11, 12, 13]], [[5, 6, 7], [8], [9, 10, 11], [12, 13]],
                                    [[5, 6], [7, 8]], [[5], [6], [7]]])
def test_a_draft_steps_logits_are_each_rows_last_positions(request, pair, chunks):
    """A draft step keeps logits at each row's last position only (`last_only`: ragged catch-up
    chunks, some rows ending at one position, all at one, or all single tokens): the full pass's
    logits there, over the same cache contents."""
    config = tiny_config(request.getfixturevalue(pair), "scheduler.max_batch_rows=6")
    backend, _ = hf_backend(config, load_models(config))
    draft = backend.drafter.draft
    tables, starts = draft.scratch_tables(len(chunks), 3 + max(map(len, chunks))), [3] * len(chunks)
    full, _ = draft.forward(tables, starts, chunks)  # [Σ chunk, vocab]
    last, _ = draft.forward(tables, starts, chunks, last_only=True)  # writes the same keys and values again
    ends = torch.tensor([len(chunk) for chunk in chunks]).cumsum(0) - 1
    torch.testing.assert_close(last, full[ends])


class PastKeyValuesLlama(LlamaForCausalLM):
    """A model whose forward takes its KV cache as `past_key_values`, as transformers 5.17 and older
    and remote-code models name it; given the cache under another name it would silently run without."""

    def forward(self, *args, past_key_values=None, **kwargs):
        assert "cache" not in kwargs, "the cache came under a name this model's forward does not take"
        return super().forward(*args, cache=past_key_values, **kwargs)


def test_a_model_that_takes_its_cache_as_past_key_values_gets_it_so(tiny_pair, references):
    config = tiny_config(tiny_pair, "scheduler.max_batch_rows=7", "drafter.kind=draft")
    models = load_models(config)
    legacy = PastKeyValuesLlama(models.target.config).to(models.target.dtype).eval()
    legacy.load_state_dict(models.target.state_dict())
    models.target = legacy
    assert cache_argument(models.target) == "past_key_values"
    requests, refs = references
    rows, _, _ = run_engine(config, requests[:7], models=models)
    assert_exact(rows, refs[:7])
