"""The streamed GEMM (`engine/streamed_gemm.py`): the product to float32 (bfloat16) rounding for any
shape (panels cut short, k in no whole vectors, row tiles and row blocks cut short), a row's bits
independent of the rows beside it and of the thread count, and post-ops rounding as the separate ops."""

from __future__ import annotations

import math

import pytest
import torch

from specbatch.engine import packed_linear
from specbatch.engine.packed_linear import PackedLinear
from specbatch.engine.streamed_gemm import Panels, load, serves

pytestmark = pytest.mark.skipif(load() is None, reason="no C compiler here")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not serves(torch.bfloat16), reason="no AVX512-BF16 here"))]


def weights(out_features: int, in_features: int, bias: bool, seed: int = 0, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    return weight, torch.randn(out_features, generator=generator).to(dtype) if bias else None


@pytest.mark.parametrize(("rows", "out_features", "in_features"),
                         [(1, 48, 16), (3, 50, 18), (8, 97, 64), (9, 144, 100), (21, 7, 576), (64, 200, 34),
                          (300, 60, 40)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_product_to_its_dtypes_rounding(rows, out_features, in_features, bias, dtype):
    weight, b = weights(out_features, in_features, bias, dtype=dtype)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = torch.nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
    got = Panels(weight, b).linear(x)
    assert got.dtype == dtype and got.shape == (rows, out_features)
    # float32: the sum's rounding; bfloat16: the output's (2^-8 of it) besides
    relative = 0 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(got.double(), expected, rtol=relative, atol=2e-5 * in_features**0.5)


def test_an_odd_width_is_not_laid_out_in_bfloat16():
    assert Panels.packs(torch.zeros(4, 17)) and not Panels.packs(torch.zeros(4, 17, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads(dtype):
    weight, bias = weights(150, 96, True, dtype=dtype)
    panels = Panels(weight, bias)
    x = torch.randn(290, 96, generator=torch.Generator().manual_seed(2)).to(dtype)  # rows in three blocks
    together = panels.linear(x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for row in (*range(19), 127, 128, 200, 289):
            assert torch.equal(panels.linear(x[row : row + 1].contiguous())[0], together[row])
        assert torch.equal(panels.linear(x[5:13].contiguous()), together[5:13])
        assert torch.equal(panels.linear(x[100:290].contiguous()), together[100:290])
    finally:
        torch.set_num_threads(threads)


def test_float32_post_ops_round_as_the_separate_ops():
    weight, bias = weights(100, 40, True)
    panels = Panels(weight, bias)
    generator = torch.Generator().manual_seed(3)
    x, other = torch.randn(6, 40, generator=generator), torch.randn(6, 100, generator=generator)
    plain = panels.linear(x)
    assert torch.equal(panels.linear(x, "add", other), other + plain)
    assert torch.equal(panels.linear(x, "mul", other), plain * other)
    # another exponential: the last bit may differ
    torch.testing.assert_close(panels.linear(x, "silu"), torch.nn.functional.silu(plain), rtol=2e-7, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_bfloat16_post_ops_apply_before_the_one_rounding(dtype):
    weight, bias = weights(100, 40, True, dtype=dtype)
    panels = Panels(weight, bias)
    generator = torch.Generator().manual_seed(3)
    x, other = (torch.randn(6, 40, generator=generator).to(dtype),
                torch.randn(6, 100, generator=generator).to(dtype))
    exact = torch.nn.functional.linear(x.float(), weight.float(), bias.float())  # bfloat16 products are exact
    for op, expected in (("add", exact + other.float()), ("mul", exact * other.float()),
                         ("silu", torch.nn.functional.silu(exact))):
        got = panels.linear(x, op, other if op != "silu" else None)
        torch.testing.assert_close(got.float(), expected, rtol=2**-8, atol=1e-6)  # the one rounding
    # rounded twice (the sum, then the product) a share of the elements would land elsewhere
    assert not torch.equal(panels.linear(x, "mul", other), panels.linear(x) * other)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["none", "add", "mul", "silu"])
def test_whole_panels_post_ops_keep_the_bits_of_the_element_wise_epilogue(dtype, op):
    """Columns 48-51 lie in a whole panel of a 100-column weight (its post-op applied a vector at a
    time, SiLU's exponential transcribed from libm's) and in the cut-short last panel of the same
    weight's first 52 columns (applied element by element, libm's `expf` itself): the same bits, sums
    past ±88 (where the exponential leaves the vector path) among them."""
    weight, bias = weights(100, 40, True, dtype=dtype)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(300, 40, generator=generator) * torch.tensor([1.0] * 290 + [30.0] * 10)[:, None]
    x, other = x.to(dtype), torch.randn(300, 100, generator=generator).to(dtype)
    whole, cut = Panels(weight, bias), Panels(weight[:52].contiguous(), bias[:52].contiguous())
    sums = whole.linear(x)[:, 48:52].float()
    assert sums.abs().max() > 88 and sums.abs().min() < 88
    got = whole.linear(x, op, other if op in ("add", "mul") else None)[:, 48:52]
    expected = cut.linear(x, op, other[:, :52].contiguous() if op in ("add", "mul") else None)[:, 48:52]
    assert torch.equal(got, expected)


def test_a_layer_streams_up_to_its_bound_and_hands_more_rows_or_strided_inputs_to_torch(monkeypatch):
    weight, bias = weights(64, 32, True)
    layer = PackedLinear(weight, bias)
    for bound in (math.inf, 64):  # every count (float32 here), or the library's GEMM from 65 rows
        monkeypatch.setattr(packed_linear, "panel_rows", lambda dtype, bound=bound: bound)
        for rows in (1, 64, 65, 129, 400):
            x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
            assert layer.fuses(x) == (rows <= bound)
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    strided = torch.randn(32, 8).t()
    assert not layer.fuses(strided)  # not contiguous: torch runs it
    torch.testing.assert_close(layer(strided), torch.nn.functional.linear(strided, weight, bias))
