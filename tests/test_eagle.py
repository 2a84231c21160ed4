"""The EAGLE-3 drafter: greedy output identical to the target's own, the public head layout, and
heads made for another target refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import llama, perturbed_copy
from engine_helpers import MixedLookahead, assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from safetensors.torch import load_file

from specbatch.core import Row, SamplingParams
from specbatch.engine.build import build_hf_engine, load_models
from specbatch.engine.eagle import load_head, save_head, sdpa_attend
from specbatch.engine.model_paths import ModelLoadError
from specbatch.loop import MemoryRecorder

NUM_PROMPTS = 32


@pytest.fixture(scope="module")
def eagle_references(tiny_pair, tiny_eagle):
    config = tiny_config(tiny_pair, "drafter.kind=eagle", f"models.eagle={tiny_eagle}")
    models = load_models(config)
    tokenizer = tiny_pair[2]
    requests = random_prompts(tokenizer, NUM_PROMPTS, seed=3)
    refs = [greedy_reference(models.target, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for p, m in requests]
    return models, requests, refs


@pytest.mark.parametrize("lookahead", ["fixed:1", "fixed:3", "fixed:5", "mixed"])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_eagle_greedy_matches_target(tiny_pair, tiny_eagle, eagle_references, lookahead, batch):
    models, requests, refs = eagle_references
    count = {1: 6, 7: 14, 32: NUM_PROMPTS}[batch]
    policy = MixedLookahead() if lookahead == "mixed" else None
    config = tiny_config(tiny_pair, "drafter.kind=eagle", f"models.eagle={tiny_eagle}",
                         f"scheduler.max_batch_rows={batch}", "scheduler.prefill_chunk=fixed:16",
                         f"scheduler.lookahead={'fixed:8' if policy else lookahead}")
    rows, recorder, _ = run_engine(config, requests[:count], lookahead=policy, models=models)
    assert_exact(rows, refs[:count])
    assert sum(r.num_accepted for r in recorder.rounds) > 0
    assert sum(r.num_proposed for r in recorder.rounds) > sum(r.num_accepted for r in recorder.rounds)


def test_eagle_rows_join_and_leave(tiny_pair, tiny_eagle, eagle_references):
    """Few slots, chunked prefill, requests arriving while others run: features follow each request."""
    models, requests, refs = eagle_references
    config = tiny_config(tiny_pair, "drafter.kind=eagle", f"models.eagle={tiny_eagle}", "scheduler.max_batch_rows=3",
                         "scheduler.prefill_chunk=fixed:5", "scheduler.lookahead=fixed:3")
    engine = build_hf_engine(config, models, MemoryRecorder())
    rows = [Row(f"r{i}", p, SamplingParams(max_new_tokens=m)) for i, (p, m) in enumerate(requests[:12])]
    for row in rows[:4]:
        engine.add(row)
    for round_index in range(200):
        if round_index % 3 == 0 and round_index // 3 + 4 < len(rows):
            engine.add(rows[round_index // 3 + 4])
        engine.step()
    engine.run()
    assert_exact({r.request_id: r for r in rows}, refs[:12])


def test_a_head_for_another_target_is_refused(tiny_pair, tiny_eagle, small_vocab_pair, tmp_path):
    other_shape = load_models(tiny_config(small_vocab_pair, "drafter.kind=none")).target
    with pytest.raises(ModelLoadError, match="was not made for target.*hidden size.*vocabulary"):
        load_head(str(tiny_eagle), other_shape)
    same_shape = perturbed_copy(load_models(tiny_config(tiny_pair, "drafter.kind=none")).target, 0.3, seed=9)
    with pytest.raises(ModelLoadError, match="fingerprint differs"):
        load_head(str(tiny_eagle), same_shape)
    config = json.loads((tiny_eagle / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 7]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((tiny_eagle / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match=r"reads target layers \[0, 1, 7\], the target has 2"):
        load_head(str(tmp_path), load_models(tiny_config(tiny_pair, "drafter.kind=none")).target)
    with pytest.raises(ModelLoadError, match="cannot read config.json"):
        load_head(str(tmp_path / "missing"), same_shape)


def test_a_truncated_head_is_a_load_error(tiny_pair, tiny_eagle, tmp_path):
    (tmp_path / "config.json").write_bytes((tiny_eagle / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes((tiny_eagle / "model.safetensors").read_bytes()[:1000])
    target = load_models(tiny_config(tiny_pair, "drafter.kind=none")).target
    with pytest.raises(ModelLoadError, match="cannot read model.safetensors"):
        load_head(str(tmp_path), target)


PUBLIC_NAMES = {
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def public_head(target_hidden: int, vocab: int, draft_vocab: int, prefix: str = "midlayer.") -> tuple[dict, dict]:
    """A random head written as the published EAGLE-3 checkpoints are: a Llama config.json with
    draft_vocab_size (no eagle_config: the loader's default layers) and the published tensor names,
    here for a 4-layer target with hidden size `target_hidden` and 2 KV heads."""
    generator = torch.Generator().manual_seed(11)
    hidden, heads, kv_heads, head_dim, inter = target_hidden, 4, 2, target_hidden // 4, 2 * target_hidden

    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.2

    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "max_position_embeddings": 256, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    d2t = torch.tensor([vocab - draft_vocab] * draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[vocab - draft_vocab:] = True
    weights = {
        f"{prefix}input_layernorm.weight": 1 + rand(hidden), f"{prefix}hidden_norm.weight": 1 + rand(hidden),
        f"{prefix}post_attention_layernorm.weight": 1 + rand(hidden),
        f"{prefix}self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        f"{prefix}self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        f"{prefix}self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        f"{prefix}self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        f"{prefix}mlp.gate_proj.weight": rand(inter, hidden), f"{prefix}mlp.up_proj.weight": rand(inter, hidden),
        f"{prefix}mlp.down_proj.weight": rand(hidden, inter), "fc.weight": rand(hidden, 3 * target_hidden),
        "norm.weight": 1 + rand(hidden), "lm_head.weight": rand(draft_vocab, hidden), "d2t": d2t, "t2d": t2d,
    }
    return config, weights


@pytest.mark.parametrize("prefix", ["midlayer.", "layers.0."])
def test_a_head_in_the_public_layout_round_trips(tmp_path, prefix):
    """Written with the published names (as pytorch_model.bin), loaded, saved again: the same tensors
    under the published names, the target's layers (2, L/2, L − 3) read, and the same drafts."""
    target = llama(300, 64, 4, seed=2, eos=0)
    config, weights = public_head(64, 300, 200, prefix)
    (tmp_path / "public").mkdir()
    (tmp_path / "public" / "config.json").write_text(json.dumps(config))
    torch.save(weights, tmp_path / "public" / "pytorch_model.bin")
    head = load_head(str(tmp_path / "public"), target)
    assert head.embed_tokens is target.get_input_embeddings()  # no embed_tokens in the file: the target's
    for name, tensor in weights.items():
        assert torch.equal(head.state_dict()[name.replace("layers.0.", "midlayer.")], tensor), name
    save_head(head, tmp_path / "again")
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(saved) == PUBLIC_NAMES
    assert all(torch.equal(saved[name.replace("layers.0.", "midlayer.")], weights[name]) for name in weights)
    again = load_head(str(tmp_path / "again"), target)
    tokens = torch.randint(0, 300, (2, 5), generator=torch.Generator().manual_seed(0))
    features = torch.randn(2, 5, 3 * 64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(5).expand(2, -1)
    outputs = []
    for loaded in (head, again):
        out = loaded(tokens, loaded.fuse(features), positions, sdpa_attend(None, 2))
        outputs.append(loaded.to_target_vocab(loaded.draft_logits(out)))
    assert torch.equal(outputs[0], outputs[1])
    assert torch.isinf(outputs[0][..., :100]).all() and torch.isfinite(outputs[0][..., 100:]).all()


def test_a_public_head_with_its_own_embedding_and_unknown_weights(tmp_path):
    target = llama(300, 64, 4, seed=2, eos=0)
    config, weights = public_head(64, 300, 300)
    weights["embed_tokens.weight"] = torch.randn(300, 64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(weights, tmp_path / "pytorch_model.bin")
    head = load_head(str(tmp_path), target)
    assert torch.equal(head.embed_tokens.weight, weights["embed_tokens.weight"])
    weights["midlayer.extra.weight"] = torch.zeros(1)
    torch.save(weights, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="does not know.*midlayer.extra.weight"):
        load_head(str(tmp_path), target)


def test_eagle_head_has_the_layout_config(tiny_eagle):
    config = json.loads((tiny_eagle / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 300 and config["vocab_size"] == 320
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    assert config["target_hidden_size"] == 64 and len(config["specbatch_target_fingerprint"]) == 16


def test_a_head_over_the_whole_vocabulary_is_saved_without_token_maps(tmp_path):
    """vLLM's loader has no `draft_id_to_target_id` where the draft vocabulary is the target's and refuses
    a file that carries `d2t`; such a head is saved without d2t/t2d and loads back the same."""
    target = llama(300, 64, 4, seed=2, eos=0)
    config, weights = public_head(64, 300, 300)
    (tmp_path / "public").mkdir()
    (tmp_path / "public" / "config.json").write_text(json.dumps(config))
    torch.save(weights, tmp_path / "public" / "pytorch_model.bin")
    head = load_head(str(tmp_path / "public"), target)
    save_head(head, tmp_path / "again")
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert not {"d2t", "t2d"} & set(saved) and set(saved) == PUBLIC_NAMES - {"d2t", "t2d"}
    again = load_head(str(tmp_path / "again"), target)
    assert torch.equal(again.d2t, torch.zeros(300, dtype=torch.long)) and bool(again.t2d.all())
