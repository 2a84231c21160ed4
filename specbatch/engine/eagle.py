"""An EAGLE-3 draft head: one decoder layer that drafts from the target's own hidden states.

At position p the head reads the target's hidden states at p from three of its layers, fused by
`fc` into one vector g_p, and the embedding of token p + 1; it predicts token p + 2. The next chain
step feeds the head's own output (before its final norm) in place of g, so after one target pass
the head drafts k tokens with k one-layer steps. Acceptance is the target's exact rule, unchanged.

The layout is the one published with EAGLE-3 and read by vLLM and SGLang (`Eagle3LlamaForCausalLM`):
a Llama `config.json` with `draft_vocab_size` (and optionally `target_hidden_size` and
`eagle_config.eagle_aux_hidden_state_layer_ids`), and weights `midlayer.*` (or `layers.0.*`),
`fc.weight` [hidden, 3·target hidden], `norm.weight`, `lm_head.weight` [draft vocab, hidden], `d2t`
(draft id → target id − draft id) and `t2d` (target ids in the draft vocabulary); `embed_tokens.weight`
is optional, the target's embedding is used without it. A head for another target is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from specbatch.engine.loading import CORRUPT_WEIGHTS
from specbatch.engine.model_paths import ModelLoadError, resolve_dir

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Attention over the head's keys and values: (queries, keys, values) [batch, heads, len, head_dim] -> output
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class EagleAttention(nn.Module):
    """Llama attention whose projections read 2·hidden inputs (embedding and feature side by side)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads or self.num_heads
        self.head_dim: int = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = getattr(config, "attention_bias", False)
        self.q_proj = nn.Linear(2 * hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        batch, length, _ = x.shape
        query = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        out = attend(query, key, value)  # [batch, heads, length, head_dim]
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class EagleLayer(nn.Module):
    """The head's one decoder layer: attention over [norm(embedding), norm(feature)], residual on the feature."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = EagleAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = residual + self.self_attn(x, cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    d2t: torch.Tensor  # [draft vocab]: target id − draft id
    t2d: torch.Tensor  # [vocab]: whether a target id is in the draft vocabulary
    embed_tokens: nn.Module  # its own, or the target's

    def __init__(self, config: LlamaConfig, target_hidden_size: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.draft_vocab_size = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.fc = nn.Linear(3 * target_hidden_size, hidden, bias=False)
        self.midlayer = EagleLayer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, self.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.rotary = LlamaRotaryEmbedding(config)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))

    @property
    def num_kv_heads(self) -> int:
        return self.midlayer.self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.midlayer.self_attn.head_dim

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's three layers' hidden states [..., 3·target hidden] -> one feature [..., hidden]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        """One step over [batch, length] positions: the token after each position and its feature
        (fused target feature, or the head's previous output); returns the output before the norm."""
        cos, sin = self.rotary(hidden, positions)
        return self.midlayer(self.embed_tokens(token_ids), hidden, cos, sin, attend)

    def draft_logits(self, output: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(output))

    def to_target_vocab(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary -> the target's, -inf where the draft cannot propose."""
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        targets = torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t
        full[..., targets] = draft_logits
        return full


def sdpa_attend(mask: torch.Tensor | None, num_groups: int) -> Attend:
    """Scaled dot-product attention with a mask (bool: True attends; or additive); grouped KV heads."""
    def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query, repeat_kv(key, num_groups), repeat_kv(value, num_groups), attn_mask=mask,
            is_causal=mask is None)
    return attend


def aux_layer_ids(config: LlamaConfig, num_target_layers: int) -> tuple[int, ...]:
    """Which target layers' inputs the head reads: the config's, else vLLM's default (2, L/2, L − 3)."""
    eagle_config = getattr(config, "eagle_config", None) or {}
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    return tuple(ids) if ids else (2, num_target_layers // 2, num_target_layers - 3)


def target_fingerprint(target: PreTrainedModel) -> str:
    """What a head trained here records of its target: a hash of the target's input embedding, so a
    head for another checkpoint of the same shape is refused too (public heads carry none)."""
    weight = cast(torch.Tensor, target.get_input_embeddings().weight).detach().to(torch.float32).cpu().contiguous()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()[:16]


def head_config(target: PreTrainedModel, draft_vocab_size: int, aux_layers: tuple[int, ...],
                intermediate_size: int | None = None) -> LlamaConfig:
    """A head config for `target` in the public layout (hidden size and heads as the target's)."""
    text = target.config.get_text_config()
    fields: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "hidden_size": text.hidden_size, "num_hidden_layers": 1,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        "intermediate_size": intermediate_size or text.intermediate_size, "rms_norm_eps": text.rms_norm_eps,
        "vocab_size": text.vocab_size, "draft_vocab_size": draft_vocab_size,
        "max_position_embeddings": text.max_position_embeddings, "rope_parameters": text.rope_parameters,
        "tie_word_embeddings": False, "eos_token_id": text.eos_token_id, "pad_token_id": text.pad_token_id,
        "bos_token_id": text.bos_token_id, "target_hidden_size": text.hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True},
    }
    return LlamaConfig(**fields)


def save_head(head: EagleHead, directory: Path, target: PreTrainedModel | None = None) -> None:
    """Write `head` in the public layout; `target` records its fingerprint in the config."""
    directory.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    if target is not None:
        config["specbatch_target_fingerprint"] = target_fingerprint(target)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # a head over the target's whole vocabulary has no token maps: vLLM's loader refuses d2t there
    skipped = ("embed_tokens.", "rotary.", *(("d2t", "t2d") if head.draft_vocab_size == head.config.vocab_size else ()))
    state = {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()
             if not name.startswith(skipped)}
    save_file(state, str(directory / "model.safetensors"))


def load_head(name: str, target: PreTrainedModel) -> EagleHead:
    """Load a head in the public layout for `target` (its dtype and device); refuse a mismatch."""
    directory = resolve_dir(name)
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"EAGLE head {name!r}: cannot read config.json: {error}") from error
    config = LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    text = target.config.get_text_config()
    target_hidden = raw.get("target_hidden_size") or config.hidden_size
    problems = _mismatches(raw, config, target_hidden, target)
    if problems:
        raise ModelLoadError(f"EAGLE head {name!r} was not made for target {text.name_or_path!r}: "
                             + "; ".join(problems) + " (set models.eagle to a head for this target, or "
                             "--drafter draft|ngram|none)")
    weights = _read_weights(directory, name)
    head = EagleHead(config, target_hidden)
    shares_embedding = "embed_tokens.weight" not in weights
    if "d2t" not in weights:  # a head over the full vocabulary
        weights["d2t"] = torch.zeros(head.draft_vocab_size, dtype=torch.long)
    weights.setdefault("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
    expected = {k for k in head.state_dict()
                if not k.startswith("rotary.") and not (shares_embedding and k == "embed_tokens.weight")}
    if missing := sorted(expected - set(weights)):
        raise ModelLoadError(f"EAGLE head {name!r} lacks weights {missing}")
    if unknown := sorted(set(weights) - expected):
        raise ModelLoadError(f"EAGLE head {name!r} has weights this layout does not know: {unknown}")
    try:
        head.load_state_dict(weights, strict=False)
    except RuntimeError as error:
        raise ModelLoadError(f"EAGLE head {name!r}: {error}") from error
    parameter = next(target.parameters())
    head = head.to(device=parameter.device, dtype=parameter.dtype).eval().requires_grad_(False)
    if shares_embedding:
        head.embed_tokens = target.get_input_embeddings()
    return head


def _mismatches(raw: dict, config: LlamaConfig, target_hidden: int, target: PreTrainedModel) -> list[str]:
    text = target.config.get_text_config()
    problems = []
    if target_hidden != text.hidden_size:
        problems.append(f"it reads {target_hidden}-wide target features, the target's hidden size is "
                        f"{text.hidden_size}")
    if config.vocab_size != text.vocab_size:
        problems.append(f"its vocabulary has {config.vocab_size} tokens, the target's {text.vocab_size}")
    layers = aux_layer_ids(config, text.num_hidden_layers)
    if len(layers) != 3 or not all(0 <= i < text.num_hidden_layers for i in layers):
        problems.append(f"it reads target layers {list(layers)}, the target has {text.num_hidden_layers}")
    recorded = raw.get("specbatch_target_fingerprint")
    if recorded and recorded != target_fingerprint(target):
        problems.append("it was trained for a target with other weights (its target fingerprint differs)")
    return problems


def _read_weights(directory: Path, name: str) -> dict[str, torch.Tensor]:
    """The head's tensors under the layout's names (`layers.0.` read as `midlayer.`, a `model.` prefix dropped)."""
    for file in WEIGHT_FILES:
        path = directory / file
        if path.is_file():
            try:
                raw = load_file(str(path)) if file.endswith(".safetensors") else torch.load(path, weights_only=True)
            except (OSError, *CORRUPT_WEIGHTS) as error:
                raise ModelLoadError(f"EAGLE head {name!r}: cannot read {file}: {error}") from error
            break
    else:
        raise ModelLoadError(f"EAGLE head {name!r} has no {' or '.join(WEIGHT_FILES)}")
    weights = {}
    for key, tensor in raw.items():
        key = key.removeprefix("model.").replace("layers.0.", "midlayer.")
        weights[key] = tensor
    return weights
