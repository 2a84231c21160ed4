"""Shape buckets: the allowed (batch rows, query length) shapes a pass is padded up to.

Fixed shapes let compiled graphs (CUDA graphs, torch.compile) be reused; every position computed
only because of a bucket is counted as a padded row. An empty list means "no padding" on that axis.
KV length is bucketed to a multiple (attention reads only up to the round's KV bucket).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from specbatch.core import PassShape


@dataclass(frozen=True)
class ShapeBucket:
    batch_rows: int
    query_len: int


@dataclass(frozen=True)
class ShapeBuckets:
    batch_rows: tuple[int, ...] = ()
    query_len: tuple[int, ...] = ()
    kv_len_multiple: int = 1

    def __post_init__(self) -> None:  # sorted once: every round's cost predictions fit shapes
        object.__setattr__(self, "batch_rows", tuple(sorted(self.batch_rows)))
        object.__setattr__(self, "query_len", tuple(sorted(self.query_len)))

    def fit(self, num_rows: int, query_len: int) -> ShapeBucket:
        """Smallest bucket holding the work; beyond the largest bucket the exact size is used."""
        return ShapeBucket(_round_up_to(self.batch_rows, num_rows), _round_up_to(self.query_len, query_len))

    def kv_len(self, num_positions: int, max_len: int | None = None) -> int:
        """KV length a pass attends over when its furthest row reads `num_positions` positions
        (largest start + query length): rounded up to the multiple, capped at a slot's length."""
        kv_len = -(-num_positions // self.kv_len_multiple) * self.kv_len_multiple
        return kv_len if max_len is None else min(kv_len, max_len)

    def pass_shape(self, num_rows: int, max_start: int, max_len: int, num_positions: int,
                   max_kv_len: int | None = None, pad: bool = True) -> PassShape:
        """The pass `PagedModel.forward` runs over ragged rows (the simulator prices the same): rows and
        query length padded up to a bucket where `pad`, KV length rounded up to the multiple over every
        position read (`max_start` the largest row start; padding rows start at 0)."""
        num_bucket_rows, query_len = num_rows, max_len
        if pad:
            bucket = self.fit(num_rows, max_len)
            num_bucket_rows, query_len = bucket.batch_rows, bucket.query_len
        return PassShape(num_rows, num_bucket_rows, query_len, self.kv_len(max_start + query_len, max_kv_len),
                         num_positions)

    def num_padded_positions(self, row_lengths: list[int]) -> int:
        """Positions a pass computes beyond Σ row_lengths once padded to its bucket."""
        if not row_lengths:
            return 0
        bucket = self.fit(len(row_lengths), max(row_lengths))
        return bucket.batch_rows * bucket.query_len - sum(row_lengths)


def _round_up_to(sizes: tuple[int, ...], value: int) -> int:
    """The smallest of the (sorted) sizes holding value; value itself past the largest."""
    index = bisect.bisect_left(sizes, value)
    return sizes[index] if index < len(sizes) else value
