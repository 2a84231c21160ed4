"""The GEMM peak behind `specbatch bench`'s MFU: measured once per machine and dtype, then read back
(the measurement is replaced by a counter: what is checked is the caching, not the speed)."""

from __future__ import annotations

import pytest
import torch

from specbatch.engine import gemm_peak as module
from specbatch.engine import streamed_gemm
from specbatch.engine.gemm_peak import gemm_peak, measure_gflops, mfu, products


def test_a_peak_is_measured_once_per_dtype_and_then_read_back(tmp_path, monkeypatch):
    measured = []

    def measure(dtype: torch.dtype, device: str) -> float:
        measured.append(dtype)
        return 100.0 * len(measured)

    monkeypatch.setattr(module, "measure_gflops", measure)
    first = gemm_peak(torch.float32, directory=tmp_path)
    again = gemm_peak(torch.float32, directory=tmp_path)
    other = gemm_peak(torch.bfloat16, directory=tmp_path)
    assert measured == [torch.float32, torch.bfloat16]
    assert (first.gflops, first.cached) == (100.0, False)
    assert (again.gflops, again.cached) == (100.0, True)
    assert (other.gflops, other.cached) == (200.0, False)
    assert again.describe() == "100 GFLOPS float32 GEMM peak (2048³, cached)"


def test_an_unreadable_cache_entry_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "measure_gflops", lambda dtype, device: 50.0)
    gemm_peak(torch.float32, directory=tmp_path)
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    assert not gemm_peak(torch.float32, directory=tmp_path).cached


def test_mfu_is_twice_the_parameters_per_token_over_the_peak():
    # 100 tok/s through 135M weights: 27 GFLOP/s of a 270 GFLOPS peak
    assert mfu(100.0, 135_000_000, 270.0) == pytest.approx(0.1)


def test_a_small_real_measurement_runs():
    assert measure_gflops(torch.float32, size=32, repeats=1) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_peak_is_sought_through_the_engines_own_gemms_and_each_computes_the_product(dtype):
    """Torch's matmul is not the machine's peak where the engine's kernels beat it (float32 on an AMD
    EPYC: 163-204 against 396-459 GFLOPS), so each GEMM a pass may run is timed; each must be the
    product itself, or its time says nothing."""
    torch.manual_seed(0)
    x, weight = torch.randn(8, 64).to(dtype), torch.randn(48, 64).to(dtype)
    ways = products(weight)
    expected = (x.float() @ weight.float().T)
    assert len(ways) >= 1 + streamed_gemm.serves(dtype)
    for product in ways:
        torch.testing.assert_close(product(x).float(), expected, rtol=2e-2, atol=2e-2)
