"""Attention over the paged cache (`engine/paged_cache.py`): the in-place kernel (float64, float32,
bfloat16 pools) and the gathered SDPA path (every dtype) both equal attention written out by hand, for rows of
mixed query lengths and block tables in any order."""

from __future__ import annotations

import sys

import pytest
import torch

from specbatch.engine import paged_cache, paged_kernel
from specbatch.engine.paged_cache import build_layout

KV_HEADS, HEADS, DIM, BLOCK = 3, 9, 32, 4
TABLES = [[3, 7, 1, 9, 0], [2, 5, 6, 8, 4], [10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
STARTS, LENGTHS = [11, 16, 2, 0], [3, 1, 2, 19]  # verify windows, a decode step, a prefill chunk (4 tasks)


def by_hand(q, keys, values, scale):
    out, token = [], 0
    for table, start, length in zip(TABLES, STARTS, LENGTHS, strict=True):
        positions = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start + length)])
        k = keys[:, positions].repeat_interleave(HEADS // KV_HEADS, 0)  # [heads, positions, dim]
        v = values[:, positions].repeat_interleave(HEADS // KV_HEADS, 0)
        for i in range(length):
            weights = torch.softmax((q[token][:, None] * k[:, : start + i + 1]).sum(-1) * scale, -1)
            out.append((weights[..., None] * v[:, : start + i + 1]).sum(1))
            token += 1
    return torch.stack(out)


@pytest.mark.parametrize(("dtype", "tolerance", "kernel"), [
    (torch.float64, 1e-12, True), (torch.float32, 1e-5, True), (torch.bfloat16, 2e-2, True),  # the kernel's
    (torch.float64, 1e-12, False), (torch.float32, 1e-5, False), (torch.bfloat16, 2e-2, False),
])
def test_attention_over_blocks_is_attention(monkeypatch, dtype, tolerance, kernel):
    if kernel and paged_kernel.load() is None:
        pytest.skip("no C compiler here: the gathered path is the one that runs")
    if not kernel:
        monkeypatch.setattr(paged_kernel, "supports", lambda *tensors: False)
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(KV_HEADS, 20 * BLOCK, DIM, generator=generator).to(dtype)
    values = torch.randn(KV_HEADS, 20 * BLOCK, DIM, generator=generator).to(dtype)
    q = torch.randn(sum(LENGTHS), HEADS, DIM, generator=generator).to(dtype)
    layout = build_layout(TABLES, STARTS, LENGTHS, BLOCK, torch.device("cpu"))
    got = paged_cache.attend(q, keys, values, layout, 0.25)
    expected = by_hand(q.double(), keys.double(), values.double(), 0.25)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=tolerance)


def test_loading_the_kernel_leaves_subnormals_alone():
    """A C library's fast-math flags compile only: linked, gcc's start-up code would set flush-to-zero for the
    whole process, changing torch's (and Python's) arithmetic on tiny numbers."""
    if paged_kernel.load() is None:
        pytest.skip("no C compiler here")
    tiny = sys.float_info.min
    assert tiny / 2 > 0
    assert torch.tensor([tiny], dtype=torch.float64).div(2).item() > 0


def _random_pools(dtype: torch.dtype, num_blocks: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(KV_HEADS, num_blocks * BLOCK, dim, generator=generator).to(dtype)
    return keys, torch.randn(KV_HEADS, num_blocks * BLOCK, dim, generator=generator).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block", "start"), [(BLOCK, 37), (16, 37), (16, 160), (32, 121)])
# in bfloat16: 16 is widened to float32, 48 and 64 scored in pairs; values in 1, 3 and 4 vectors
@pytest.mark.parametrize("dim", [16, 48, 64])
@pytest.mark.parametrize("window", [5, 6])  # across dimensions, lanes in threes (15) and not (18: 16 + 2)
def test_the_kernel_gives_a_token_the_same_bits_in_any_row(monkeypatch, dtype, block, start, dim, window):
    """Batch invariance, what keeps speculation's greedy output plain decoding's: a token verified in
    a row of 5 or 6 (lanes across the vector) attends exactly as when decoded alone (lanes across
    dimensions), and either way of laying out the work gives the same bits; with blocks of fewer
    positions than a vector, of one vector (decoding scores whole groups of 16 keys) and of two, and
    rows that end inside a group and on its edge."""
    if paged_kernel.load() is None:
        pytest.skip("no C compiler here")
    table = [5, 0, 9, 3, 11, 7, 2, 8, 1, 10, 4, 6]
    keys, values = _random_pools(dtype, len(table) * block // BLOCK, dim, seed=1)
    q = torch.randn(window, HEADS, dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    verified = paged_cache.attend(q, keys, values, build_layout([table], [start], [window], block, torch.device("cpu")),
                                  0.125)
    decoded = paged_cache.attend(q, keys, values, build_layout([table] * window, [start + i for i in range(window)],
                                                               [1] * window, block, torch.device("cpu")), 0.125)
    assert torch.equal(verified, decoded)
    for few_lanes in (0, paged_kernel.WIDTH):  # every row across lanes, then every row across dimensions
        monkeypatch.setattr(paged_kernel, "FEW_LANES", few_lanes)
        layout = build_layout([table] * 2, [start, start + 2], [window, 1], block, torch.device("cpu"))
        both = paged_cache.attend(torch.cat([q, q[2:3]]), keys, values, layout, 0.125)
        assert torch.equal(both[:window], verified) and torch.equal(both[window], verified[2])
