"""RMSNorm and rotary in one pass each (`engine/fused_ops.py`): in bfloat16 they equal, bit for bit,
the Hugging Face code they replace, op by op; in float32 rotary does, and RMSNorm differs only by
the order its sum of squares is added in. Rotary with the cache write fused leaves the queries and
the paged pools exactly as rotary and `PagedKVCache.write` do."""

from __future__ import annotations

import pytest
import torch

from specbatch.engine import fused_ops
from specbatch.engine.paged_cache import PagedKVCache, build_layout


def hf_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward"""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(dtype)


def hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for one of q or k, x [tokens, heads, dim], cos/sin [tokens, dim]"""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@pytest.fixture(autouse=True)
def _needs_library():
    if fused_ops.load() is None:
        pytest.skip("no C compiler here: torch runs these")


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.bfloat16, 0.0), (torch.float32, 1e-6)])
def test_rms_norm_is_hugging_faces(dtype, tolerance):
    generator = torch.Generator().manual_seed(0)
    hidden = (torch.randn(37, 576, generator=generator) * 3).to(dtype)
    weight = torch.randn(576, generator=generator).to(dtype)
    got = fused_ops.rms_norm(hidden, weight, 1e-5)
    assert got is not None and got.dtype == dtype
    torch.testing.assert_close(got, hf_rms_norm(hidden, weight, 1e-5), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_in_place_is_hugging_faces_inside_a_fused_qkv_output(dtype):
    generator = torch.Generator().manual_seed(1)
    tokens, heads, kv_heads, dim = 11, 9, 3, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    angles = torch.randn(tokens, dim // 2, generator=generator)
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(dtype)
    qk = qkv[:, : (heads + kv_heads) * dim].view(tokens, heads + kv_heads, dim)  # tokens a row of qkv apart
    expected, values = hf_rotary(qk.clone(), cos, sin), qkv[:, (heads + kv_heads) * dim :].clone()
    assert fused_ops.rotate_(qk, cos, sin)
    assert torch.equal(qk, expected)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], values)  # the values untouched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_with_the_cache_write_is_rotary_then_the_write(dtype):
    generator = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, block = 9, 3, 64, 4
    tables, starts, lengths = [[5, 0, 9], [2, 7, 1]], [3, 0], [5, 9]  # a verify window, a prefill chunk
    layout = build_layout(tables, starts, lengths, block, torch.device("cpu"))
    tokens = sum(lengths)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=generator).to(dtype)
    angles = torch.randn(tokens, dim // 2, generator=generator)
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(dtype)
    caches = [PagedKVCache(1, 10, block, kv_heads, dim, dtype, "cpu") for _ in range(2)]
    for cache in caches:  # what earlier passes left in the pools stays
        cache.keys[0].normal_(generator=generator)
        cache.values[0].copy_(cache.keys[0])
    caches[1].keys[0].copy_(caches[0].keys[0])
    caches[1].values[0].copy_(caches[0].values[0])
    qk = qkv[:, : (heads + kv_heads) * dim].view(tokens, heads + kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    expected = qk.clone()
    assert fused_ops.rotate_(expected, cos, sin)
    caches[0].write(0, expected[:, heads:], v, layout)
    assert fused_ops.rotate_and_write_(qk, v, cos, sin, heads, layout.slot_mapping, caches[1].keys[0],
                                       caches[1].values[0])
    assert torch.equal(qk[:, :heads], expected[:, :heads])
    assert torch.equal(caches[1].keys[0], caches[0].keys[0]) and torch.equal(caches[1].values[0], caches[0].values[0])


def test_tensors_it_does_not_take_are_left_to_torch():
    assert fused_ops.rms_norm(torch.randn(3, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 1e-5) is None
    x = torch.randn(4, 2, 8).transpose(0, 1)  # heads not contiguous within a token
    assert not fused_ops.rotate_(x, torch.ones(2, 8), torch.zeros(2, 8))
