"""Model families: the engine's greedy output equals each target's own greedy decoding (HF
`generate`, batch 1) on tiny random models built from the configs of the families users run, each
with a perturbed copy of itself as draft; families the slot cache cannot serve exactly are refused
at load, never run wrong."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from conftest import make_tokenizer, perturbed_copy, save_pair
from engine_helpers import assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from specbatch.config import ModelsConfig
from specbatch.engine.build import load_models
from specbatch.engine.loading import context_limit, load_model, unsupported_reason
from specbatch.engine.model_paths import ModelLoadError

DECODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, max_position_embeddings=256)
# model_type -> tiny config; a sliding window as long as the context masks nothing, so it is accepted
FAMILIES: dict[str, dict] = {
    "llama": DECODER,
    "qwen2": DECODER,
    "qwen3": dict(DECODER, head_dim=16),
    "mistral": dict(DECODER, sliding_window=None),
    "phi3": DECODER,
    "gemma": dict(DECODER, head_dim=16),
    "gemma2": dict(DECODER, head_dim=16, sliding_window=256, query_pre_attn_scalar=16),
    "gemma3_text": dict(DECODER, head_dim=16, sliding_window=256, query_pre_attn_scalar=16),
    "starcoder2": DECODER,
    "olmo2": DECODER,
    "stablelm": DECODER,
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     max_position_embeddings=256, rotary_pct=0.25),
    "opt": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128, max_position_embeddings=256,
                word_embed_proj_dim=64),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, rotary_dim=8),
    "phi": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                max_position_embeddings=256),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256),
}
EAGER_ONLY = {"gemma2"}  # transformers refuses sdpa for it (soft-capping): its references use eager
BATCH_1_AND_32 = ["llama", "qwen3", "gemma2", "gpt_neox", "opt"]  # the rest at batch 1 and 32 run with -m slow
NUM_PROMPTS = 32
pytestmark = pytest.mark.usefixtures("one_thread")


def attn_for(family: str) -> str:
    return "eager" if family in EAGER_ONLY else "sdpa"


@dataclass
class Family:
    """A saved tiny pair of one family, its requests, and the target's greedy references so far."""

    pair: tuple
    target: torch.nn.Module
    requests: list[tuple[list[int], int]]
    refs: list[list[int]] = field(default_factory=list)

    def references(self, count: int) -> list[list[int]]:
        tokenizer = self.pair[2]
        for prompt, max_new in self.requests[len(self.refs):count]:
            self.refs.append(greedy_reference(self.target, prompt, max_new, tokenizer.eos_token_id,
                                              tokenizer.pad_token_id))
        return self.refs[:count]


@pytest.fixture(scope="module")
def family_pairs(tmp_path_factory):
    """family -> Family, built on first use and shared by the module's tests."""
    tokenizer, built = make_tokenizer(), {}

    def get(family: str) -> Family:
        if family not in built:
            built[family] = _build(family, tokenizer, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def _build(family, tokenizer, root) -> Family:
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None, initializer_range=0.2,
                                  **FAMILIES[family])
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    pair = save_pair(root, target, perturbed_copy(target, 0.1, seed=1), tokenizer)
    models = load_models(tiny_config(pair, f"models.attn_implementation={attn_for(family)}", "drafter.kind=none"))
    return Family(pair, models.target, random_prompts(tokenizer, NUM_PROMPTS, seed=2, max_len=30))


def check_family(family_pairs, family: str, drafter: str, batch: int, attn: str | None = None) -> None:
    built = family_pairs(family)
    count = {1: 4, 7: 12, 32: NUM_PROMPTS}[batch]
    pair, requests, refs = built.pair, built.requests, built.references(count)
    config = tiny_config(pair, f"drafter.kind={drafter}", f"scheduler.max_batch_rows={batch}",
                         f"models.attn_implementation={attn or attn_for(family)}", "scheduler.prefill_chunk=fixed:16")
    rows, recorder, _ = run_engine(config, requests[:count])
    assert_exact(rows, refs)
    if drafter == "draft":
        assert sum(r.num_accepted for r in recorder.rounds) > 0


@pytest.mark.parametrize("drafter", ["draft", "ngram", "none"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exact_at_batch_7(family_pairs, family, drafter):
    check_family(family_pairs, family, drafter, 7)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exact_with_shared_prefixes_reused(family_pairs, family):
    """Rows sharing a prefix's KV blocks (cache.prefix) decode as the target alone, in every family."""
    from test_prefix_reuse import shared_prefix_prompts

    built = family_pairs(family)
    tokenizer = built.pair[2]
    requests = shared_prefix_prompts(tokenizer, 12)
    refs = [greedy_reference(built.target, prompt, max_new, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for prompt, max_new in requests]
    config = tiny_config(built.pair, "drafter.kind=draft", "scheduler.max_batch_rows=5",
                         f"models.attn_implementation={attn_for(family)}", "scheduler.prefill_chunk=fixed:16")
    rows, _, _ = run_engine(config, requests)
    assert_exact(rows, refs)
    assert sum(row.num_reused_tokens for row in rows.values()) > 0


SUBSET = [pytest.param(f, marks=() if f in BATCH_1_AND_32 else pytest.mark.slow) for f in FAMILIES]


@pytest.mark.parametrize("drafter", ["draft", "ngram", "none"])
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("family", SUBSET)
def test_family_exact_at_batch_1_and_32(family_pairs, family, batch, drafter):
    check_family(family_pairs, family, drafter, batch)


# (model_type, config overrides, words the refusal must contain)
REFUSED = [
    ("mistral", dict(sliding_window=16), "sliding-window attention (config.sliding_window=16)"),
    ("phi3", dict(sliding_window=2047, max_position_embeddings=4096), "config.sliding_window=2047"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=64, max_window_layers=1), "config.sliding_window=64"),
    ("gemma2", {}, "sliding-window attention (config.sliding_window=4096)"),
    ("gemma3_text", dict(sliding_window=512), "config.sliding_window=512"),
    ("gpt_neo", dict(num_layers=2, attention_types=[[["global"], 2]]), "not through transformers' attention interface"),
    ("mamba", {}, "hybrid or recurrent layers"),
    ("jamba", {}, "layer types ['linear_attention']"),
    ("qwen3_next", {}, "hybrid or recurrent layers"),
    ("recurrent_gemma", {}, "hybrid or recurrent layers"),
    ("lfm2", {}, "hybrid or recurrent layers"),
    ("rwkv", {}, "hybrid or recurrent layers"),
    ("bloom", {}, "ALiBi"),
    ("falcon", dict(alibi=True), "ALiBi"),
    ("bart", {}, "encoder-decoder"),
]


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_truncated_weight_file_is_a_load_error(tiny_pair, tmp_path, weights):
    """A half-copied checkpoint is the user's file to fix (exit 2), not an internal failure."""
    for file in tiny_pair[0].iterdir():
        if file.name != "model.safetensors":
            (tmp_path / file.name).write_bytes(file.read_bytes())
    whole = tiny_pair[0] / "model.safetensors"
    if weights == "pytorch_model.bin":
        torch.save(load_file(whole), tmp_path / "whole.bin")
        whole = tmp_path / "whole.bin"
    (tmp_path / weights).write_bytes(whole.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="cannot load a causal LM"):
        load_model(str(tmp_path), ModelsConfig(target=str(tmp_path)))


@pytest.mark.parametrize(("model_type", "overrides", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_unservable_family_is_refused_at_load(tmp_path, model_type, overrides, reason):
    """Refused from config.json alone, before weights load or a job is prepared."""
    AutoConfig.for_model(model_type, **overrides).save_pretrained(tmp_path)
    models = ModelsConfig(target=str(tmp_path))
    with pytest.raises(ModelLoadError, match="cannot be served exactly") as error:
        load_model(str(tmp_path), models)
    assert reason in str(error.value)
    with pytest.raises(ModelLoadError, match="cannot be served exactly"):
        context_limit(models)


@pytest.mark.parametrize(("model_type", "overrides"), [
    ("qwen2", dict(use_sliding_window=False, sliding_window=32768)),  # Qwen2's released configs
    ("mistral", dict(sliding_window=None)),
    ("mistral", dict(sliding_window=4096, max_position_embeddings=4096)),  # window covers the context
    ("nemotron", {}),
])
def test_full_attention_configs_are_accepted(model_type, overrides):
    assert unsupported_reason(AutoConfig.for_model(model_type, **overrides)) is None
