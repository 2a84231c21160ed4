"""The streamed few-row GEMM (`engine/streamed_gemm.py`): the product to float32 rounding for any
shape (panels cut short, k in no whole vectors, row tiles cut short), a row's bits independent of
the rows beside it and of the thread count, and post-ops rounding as the separate ops."""

from __future__ import annotations

import pytest
import torch

from specbatch.engine.packed_linear import PANEL_ROWS, PackedLinear
from specbatch.engine.streamed_gemm import Panels, load

pytestmark = pytest.mark.skipif(load() is None, reason="no C compiler here")


def weights(out_features: int, in_features: int, bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator)
    return weight, torch.randn(out_features, generator=generator) if bias else None


@pytest.mark.parametrize(("rows", "out_features", "in_features"),
                         [(1, 48, 16), (3, 50, 17), (8, 97, 64), (9, 144, 100), (21, 7, 576), (64, 200, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_product_to_float32_rounding(rows, out_features, in_features, bias):
    weight, b = weights(out_features, in_features, bias)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1))
    expected = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    got = Panels(weight, b).linear(x)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-5 * in_features**0.5)


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads():
    weight, bias = weights(150, 96, True)
    panels = Panels(weight, bias)
    x = torch.randn(19, 96, generator=torch.Generator().manual_seed(2))
    together = panels.linear(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for row in range(x.shape[0]):
            assert torch.equal(panels.linear(x[row : row + 1].contiguous())[0], together[row])
        assert torch.equal(panels.linear(x[5:13].contiguous()), together[5:13])
    finally:
        torch.set_num_threads(threads)


def test_post_ops_round_as_the_separate_ops():
    weight, bias = weights(100, 40, True)
    panels = Panels(weight, bias)
    generator = torch.Generator().manual_seed(3)
    x, other = torch.randn(6, 40, generator=generator), torch.randn(6, 100, generator=generator)
    plain = panels.linear(x)
    assert torch.equal(panels.linear(x, "add", other), other + plain)
    assert torch.equal(panels.linear(x, "mul", other), plain * other)
    torch.testing.assert_close(panels.linear(x, "silu"), torch.nn.functional.silu(plain), rtol=2e-7, atol=1e-7)


def test_a_linear_layer_streams_few_rows_and_hands_many_to_torch():
    weight, bias = weights(64, 32, True)
    layer = PackedLinear(weight, bias)
    few, many = torch.randn(PANEL_ROWS, 32), torch.randn(PANEL_ROWS + 1, 32)
    assert layer.fuses(few) and not layer.fuses(many)
    assert not layer.fuses(torch.randn(32, 8).t())  # not contiguous: torch runs it
    for x in (few, many):
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
