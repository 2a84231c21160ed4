"""The greedy-token kernel returns torch's `max(dim=-1).indices` (what greedy acceptance compared to
before it), on the cases a vectorised reduction can get wrong: ties, NaN, signed zeros, a row of -inf,
a largest value in any block, rows sliced out of wider logits."""

from __future__ import annotations

import pytest
import torch

from specbatch.engine.argmax import greedy_tokens, load

DTYPES = [torch.float32, torch.bfloat16]
BLOCK = 256  # kernels/argmax.c


@pytest.fixture(autouse=True)
def _kernel_built() -> None:
    if load() is None:
        pytest.skip("no C compiler here: torch runs instead")


def _torch(logits: torch.Tensor) -> list[int]:
    return logits.max(dim=-1).indices.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", [
    [1.0, float("nan"), 3.0, float("nan")],  # the first NaN, not the largest number
    [float("nan"), 5.0, float("nan")],
    [-0.0, 0.0, -1.0],  # signed zeros are equal: the first
    [0.0, -0.0],
    [2.0, 5.0, 5.0, 1.0],  # a tie: the first
    [float("-inf"), float("-inf")],
    [float("inf"), float("nan"), float("inf")],
    [-3.0],
])
def test_small_rows(dtype: torch.dtype, row: list[float]) -> None:
    logits = torch.tensor([row], dtype=dtype)
    assert greedy_tokens(logits) == _torch(logits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_largest_value_in_any_block(dtype: torch.dtype) -> None:
    cols = 5 * BLOCK + 17
    for position in (0, BLOCK - 1, BLOCK, 3 * BLOCK + 5, cols - 1):
        logits = torch.full((3, cols), -2.0, dtype=dtype)
        logits[:, position] = 4.0
        logits[1, cols - 1] = 4.0  # a tie in a later block: the first still wins
        assert greedy_tokens(logits) == _torch(logits) == [position] * 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_largest_across_blocks_and_nan_after_the_largest(dtype: torch.dtype) -> None:
    cols = 4 * BLOCK
    zeros = torch.full((2, cols), -1.0, dtype=dtype)
    zeros[0, 10], zeros[0, 3 * BLOCK] = -0.0, 0.0  # -0.0 first: equal, so it wins though 0.0's integer is larger
    zeros[1, BLOCK + 1], zeros[1, 2 * BLOCK] = 0.0, -0.0
    assert greedy_tokens(zeros) == _torch(zeros) == [10, BLOCK + 1]
    nan = torch.zeros((1, cols), dtype=dtype)
    nan[0, 7], nan[0, 2 * BLOCK + 3], nan[0, 3 * BLOCK] = 9.0, float("nan"), float("nan")
    assert greedy_tokens(nan) == _torch(nan) == [2 * BLOCK + 3]


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_logits_and_sliced_rows(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(7)
    for trial in range(60):
        rows = int(torch.randint(1, 40, (), generator=generator))
        cols = int(torch.randint(1, 3 * BLOCK, (), generator=generator))
        logits = torch.randn(rows, cols + 9, generator=generator).to(dtype)[:, :cols]  # rows cols + 9 apart
        if trial % 3 == 0:
            logits = torch.round(logits * 2) / 2  # many ties
        if trial % 4 == 0:
            logits[torch.rand(rows, cols, generator=generator) < 0.01] = float("nan")
        assert greedy_tokens(logits) == _torch(logits)


def test_a_vocabulary_the_size_of_a_real_models() -> None:
    logits = torch.randn(8, 49_152, generator=torch.Generator().manual_seed(3))
    assert greedy_tokens(logits) == _torch(logits)
    assert greedy_tokens(logits.to(torch.bfloat16)) == _torch(logits.to(torch.bfloat16))


def test_layouts_it_does_not_take_run_torch() -> None:
    logits = torch.randn(4, 100, dtype=torch.float64)
    assert greedy_tokens(logits) == _torch(logits)
    transposed = torch.randn(100, 4).t()  # columns not contiguous
    assert greedy_tokens(transposed) == _torch(transposed)
