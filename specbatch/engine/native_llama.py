"""The Llama family's decoder step, written for the engine's flat passes (Llama, SmolLM2, Mistral,
Qwen2, Qwen3).

transformers' modeling code runs a pass as hundreds of small operators: three projections where
one matrix multiply does (q, k, v), two where one does (gate, up), the rotary tables and masks
rebuilt every pass. Here each layer is RMSNorm, one fused QKV GEMM, rotary with the write into the
paged cache (queries rotated in place, keys rotated straight into the pool, one C pass), attention
over it (`paged_cache.attend`), the output projection with the residual added in the GEMM, RMSNorm,
the gate GEMM with its SiLU, the up GEMM times the gate, and the down projection with the residual:
the same maths in the same order as the Hugging Face layers (RMSNorm in float32, as theirs), on the
same weights. The fused weights are the model's own: its projections become views into them, so the
Hugging Face path keeps working (a `generate` baseline, training). On a CPU each GEMM's weight is
also packed once for oneDNN (`engine/packed_linear.py`, a second copy of the weights), and RMSNorm
and rotary run as one C pass each (`engine/fused_ops.py`), rounding as Hugging Face's in bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specbatch.engine import fused_ops
from specbatch.engine.layer_loop import LayerLoop
from specbatch.engine.packed_linear import PackedLinear
from specbatch.engine.paged_cache import PagedKVCache, PassLayout, attend
from specbatch.engine.rotary_table import RotaryTable

NATIVE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def native_reason(model: PreTrainedModel) -> str | None:
    """Why this model runs through transformers' modeling code instead, or None if it runs natively."""
    config = model.config.get_text_config()
    if config.model_type not in NATIVE_MODEL_TYPES:
        return f"model_type {config.model_type!r} has no native step"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    return None


@dataclass
class _Layer:
    input_norm: torch.Tensor  # [hidden]
    qkv: PackedLinear  # hidden -> q + 2·kv dims
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3's per-head RMSNorm)
    k_norm: torch.Tensor | None
    out: PackedLinear  # q dims -> hidden
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2·intermediate, hidden]
    gate: PackedLinear  # hidden -> intermediate: gate_up's halves, packed apart for their fused post-ops
    up: PackedLinear
    down: PackedLinear  # intermediate -> hidden


class NativeLlama:
    """The decoder of a Llama-family model over the paged cache; `forward` is one flat pass."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config.get_text_config()
        inner: Any = model.model
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.lm_head = PackedLinear(model.lm_head.weight, model.lm_head.bias)
        self.final_norm = inner.norm.weight
        self.eps = config.rms_norm_eps
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.layers = [_fuse(layer) for layer in inner.layers]
        dtype = self.final_norm.dtype
        self.rotary_table = (RotaryTable(self.rotary, self.embed.weight.dtype, self.embed.weight.device)
                             if RotaryTable.serves(self.rotary) else None)
        self.loop = (LayerLoop(self.layers, dtype, self.num_heads, self.num_kv_heads, self.head_dim, self.eps,
                               self.scaling)
                     if LayerLoop.serves(self.layers, dtype, self.head_dim) else None)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, num_positions: int, cache: PagedKVCache,
                layout: PassLayout, kept: torch.Tensor | None, keep_logits: bool = True,
                feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """input_ids, positions: [tokens], every position below `num_positions`. Returns logits [kept
        tokens, vocab] (every token's where `kept` is None; None without `keep_logits`) and the hidden
        states `feature_layers` name (Hugging Face's numbering: 0 the embeddings, i the output of layer
        i - 1, the last after the final norm)."""
        hidden = self.embed(input_ids)  # [tokens, hidden]
        if self.rotary_table is not None:
            cos, sin = self.rotary_table.lookup(positions, num_positions)  # [tokens, head_dim]
        else:
            cos, sin = self.rotary(hidden[None], positions[None])  # [1, tokens, head_dim]
            cos, sin = cos[0].contiguous(), sin[0].contiguous()
        hidden, states = self._layers(hidden, cos, sin, cache, layout, feature_layers)
        hidden = _rms_norm(hidden, self.final_norm, self.eps)
        states[len(self.layers)] = hidden
        wanted = [states[index] for index in feature_layers]
        if not keep_logits:
            return None, wanted
        return self.lm_head(hidden if kept is None else hidden[kept]), wanted

    def _layers(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: PagedKVCache,
                layout: PassLayout, feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The decoder layers over `hidden` (the embeddings, a tensor of this pass's own), and the inputs
        of the layers `feature_layers` names: in one C call where the loop takes the pass, stopping
        where a layer's input is wanted, else layer by layer."""
        states: dict[int, torch.Tensor] = {}
        if self.loop is not None and self.loop.takes(hidden, cos, sin, cache):
            done = 0
            for index in sorted({index for index in feature_layers if index < len(self.layers)}):
                self.loop.run_(hidden, cos, sin, cache, layout, done, index)
                states[index], done = hidden.clone(), index  # the loop updates `hidden` in place
            self.loop.run_(hidden, cos, sin, cache, layout, done, len(self.layers))
            return hidden, states
        for index, layer in enumerate(self.layers):
            if index in feature_layers:
                states[index] = hidden
            hidden = self._layer(layer, index, hidden, cos, sin, cache, layout)
        return hidden, states

    def _layer(self, layer: _Layer, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: PagedKVCache, layout: PassLayout) -> torch.Tensor:
        num_tokens, dim, heads = hidden.shape[0], self.head_dim, self.num_heads
        qkv = layer.qkv(_rms_norm(hidden, layer.input_norm, self.eps))
        q_dims, kv_dims = heads * dim, self.num_kv_heads * dim
        qk = qkv[:, : q_dims + kv_dims].view(num_tokens, heads + self.num_kv_heads, dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            qk = torch.cat((_rms_norm(qk[:, :heads], layer.q_norm, self.eps),
                            _rms_norm(qk[:, heads:], layer.k_norm, self.eps)), dim=1)
        v = qkv[:, q_dims + kv_dims :].view(num_tokens, self.num_kv_heads, dim)
        if not fused_ops.rotate_and_write_(qk, v, cos, sin, heads, layout.slot_mapping, cache.keys[index],
                                           cache.values[index]):
            if not fused_ops.rotate_(qk, cos, sin):  # queries and keys in one go, in place where it can
                qk = _rotate(qk, cos[:, None], sin[:, None])
            cache.write(index, qk[:, heads:], v, layout)
        attended = attend(qk[:, :heads], cache.keys[index], cache.values[index], layout, self.scaling)
        hidden = layer.out.add(attended.reshape(num_tokens, q_dims), hidden)
        return self._mlp(layer, _rms_norm(hidden, layer.post_norm, self.eps), hidden)

    @staticmethod
    def _mlp(layer: _Layer, normed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + down(SiLU(gate(x)) · up(x)): streamed or packed, the gate and up GEMMs apart with
        the SiLU and the product as their post-ops; otherwise one gate-up GEMM (one call, not two)."""
        if layer.gate.fuses(normed):
            return layer.down.add(layer.up.mul(normed, layer.gate.silu(normed)), residual)
        gate, up = F.linear(normed, layer.gate_up).chunk(2, dim=-1)
        return layer.down.add(F.silu(gate) * up, residual)


def _fuse(layer: Any) -> _Layer:
    """One layer's weights, q/k/v and gate/up each in one tensor; the layer's own projections are
    pointed at views of it, so the weights are held once."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv = _concat_into(attention.q_proj, attention.k_proj, attention.v_proj)
    bias = None
    if attention.q_proj.bias is not None:
        bias = _concat_into(attention.q_proj, attention.k_proj, attention.v_proj, name="bias")
    gate_up = _concat_into(mlp.gate_proj, mlp.up_proj)
    q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    gate, up = gate_up.chunk(2)
    return _Layer(layer.input_layernorm.weight, PackedLinear(qkv, bias), q_norm.weight if q_norm is not None else None,
                  k_norm.weight if k_norm is not None else None,
                  PackedLinear(attention.o_proj.weight, attention.o_proj.bias),  # Llama's attention_bias has one
                  layer.post_attention_layernorm.weight, gate_up, PackedLinear(gate), PackedLinear(up),
                  PackedLinear(mlp.down_proj.weight))


def _concat_into(*linears: Any, name: str = "weight") -> torch.Tensor:
    parts = [getattr(linear, name) for linear in linears]
    fused = torch.cat([part.detach() for part in parts])
    offset = 0
    for linear, part in zip(linears, parts, strict=True):
        getattr(linear, name).data = fused[offset : offset + part.shape[0]]
        offset += part.shape[0]
    return fused


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: normalised in float32 whatever the model's dtype (float64 too),
    rounded to it, then times the weight (in float32 one fused op, the same products in the same order)."""
    fused = fused_ops.rms_norm(hidden, weight, eps)
    if fused is not None:
        return fused
    if hidden.dtype == torch.float32:
        return F.rms_norm(hidden, hidden.shape[-1:], weight, eps)
    return weight * F.rms_norm(hidden.float(), hidden.shape[-1:], None, eps).to(hidden.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as `apply_rotary_pos_emb`: x·cos + rotate_half(x)·sin. x: [tokens, heads, dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
