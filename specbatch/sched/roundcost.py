"""Predicted round time of a planned round: the backend's pass shapes fed to the fitted CostModel.

The shapes mirror what the backend computes (engine/forward.py, engine/drafters.py):
- verify pass: B rows padded to the bucket (B', q') with q = 1 + max k; every row computes q'
  positions, so padded positions cost like real ones:  target rows = B'·q'; the pass attends over
  kv_len = ⌈max start + q'⌉ (rounded to the KV multiple) for every bucket row: kv read = B'·kv_len.
- draft model: step 0 feeds each drafting row its lag (tokens the draft cache lacks, ≥ 1: the pending
  token) padded to the largest lag, then one position per further draft:
      draft passes = max k,   draft rows = n_drafting · max lag + Σ (k_i − 1)
  A row that stops drafting lets its lag grow, so switching drafting back on costs real work here.
- prefill pass: m rows padded to (m', max chunk'), plus one draft prefill pass of Σ chunk rows.

`flat` (the paged engine, `engine/forward.py`, and the simulator since issue 40): every pass is one
flat batch of real tokens, no row padded to another's length. Then
- verify: every row is charged to the largest k, target rows = B·(1 + max k), and reads its own KV,
  kv read = Σ start_i + B·(1 + max k); the round's prefill chunks ride in the same pass (no pass of
  their own). Exact for plans whose rows share k, pessimistic for the others: sizing each row's k on
  its own α̂ (Σ (1 + k_i) priced exactly) drafted rows on noise in that estimate, 3.5 % slower than
  one k for the batch in a simulated job where drafting pays (tests/test_adaptive_learns_cost.py);
- draft model: draft rows = Σ lag_i + Σ (k_i − 1) over the rows it drafts for, passes = max k.
The plain round then prices each row's own KV, not the longest row's for every row. A row verifying
drafts reads its KV as a wide row (`CostModel.wide_kv_tokens_read`): wide KV = Σ over rows with k ≥ 1
of (start_i + 1 + max k), each at the batch's largest k as above; a bucketed pass of K ≥ 1 reads all
of its KV wide. Prefill chunks are wide rows too.

Drafting by lookup (n-gram, suffix) runs no pass, but its host time is in the round all the same:
    lookup ms = c_lr · rows drafting by lookup + c_lt · tokens their indexes catch up on
(a suffix drafter indexes a row's tokens up to its pending one, `index_lag`: its whole prompt the first
time). Priced, a lookup is no longer free, so plain decoding wins where it costs more than it commits.

Every coefficient of the cost model is ≥ 0, so each prediction is monotone in rows, k and chunk size
(the deadline prefill policy binary-searches over it).
"""

from __future__ import annotations

from dataclasses import dataclass

from specbatch.core import Row
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.costmodel import CostModel


@dataclass(slots=True)
class DecodeShape:
    """Aggregates of a verify batch that decide its cost; cheap to update row by row."""

    num_rows: int = 0
    max_start: int = 0  # largest num_computed (first query position) among rows
    max_k: int = 0
    num_drafting: int = 0  # rows with k ≥ 1
    max_lag: float = 0  # largest draft-cache lag among drafting rows
    sum_k: int = 0  # Σ k over drafting rows (those a draft model drafts for)
    sum_start: int = 0  # Σ num_computed over rows (a flat pass reads each row's own KV)
    sum_all_k: int = 0  # Σ k over every row, lookups' drafts too (a flat pass verifies each row's own)
    sum_lag: float = 0  # Σ draft-cache lag over drafting rows (a flat draft step feeds each its own)
    num_lookup: int = 0  # rows drafting by lookup (k ≥ 1, no model): host time, no pass
    sum_index_lag: float = 0  # Σ tokens their indexes catch up on (`index_lag`)
    num_wide: int = 0  # rows verifying drafts (k ≥ 1, either kind): they read their KV as wide rows
    sum_wide_start: int = 0  # Σ num_computed over those rows

    @classmethod
    def of(cls, rows: list[Row], ks: list[int], models: list[bool] | None = None,
           index_lags: list[int] | None = None) -> DecodeShape:
        """`models[i]`: whether row i's drafts come from a draft model (default: every row's); a row
        drafting by lookup adds verify positions and its lookup's host time (`index_lags[i]`: tokens
        its index catches up on, default 0)."""
        if not any(ks):  # plain decoding's round, the ledger's every round
            return cls.plain([row.num_computed for row in rows])
        shape = cls()
        for i, (row, k) in enumerate(zip(rows, ks, strict=True)):
            model = models is None or models[i]
            lag = 0 if not k else draft_lag(row) if model else index_lags[i] if index_lags else 0
            shape.add(row.num_computed, k, lag, model)
        return shape

    @classmethod
    def plain(cls, starts: list[int]) -> DecodeShape:
        """Plain decoding's batch of rows whose first query positions are `starts`: its sums alone."""
        return cls(len(starts), max(starts, default=0), sum_start=sum(starts))

    def add(self, start: int, k: int, lag: float = 0, model: bool = True) -> None:
        """One more row; if it drafts (k ≥ 1), `lag` is its draft cache's with a model, else its index's."""
        self.num_rows += 1
        self.max_start = max(self.max_start, start)
        self.max_k = max(self.max_k, k)
        self.sum_start += start
        self.sum_all_k += k
        if k > 0:
            self.num_wide += 1
            self.sum_wide_start += start
        if k > 0 and model:
            self.num_drafting += 1
            self.max_lag = max(self.max_lag, lag)
            self.sum_lag += lag
            self.sum_k += k
        elif k > 0:
            self.num_lookup += 1
            self.sum_index_lag += lag


def draft_lag(row: Row) -> int:
    """Tokens the draft cache must catch up on before drafting (the pending token at least). A row
    still prefilling verifies only once its prefill completes, which brings a current draft cache along."""
    if not row.is_decoding and row.draft_is_current:
        return 1
    return max(1, row.num_tokens - row.num_draft_computed)


def index_lag(row: Row) -> int:
    """Tokens a suffix drafter must add to the row's own index before drafting with it: all but the
    pending token that the index does not hold yet (the whole prompt, the first time), less a prompt
    prefix the row shares with an earlier row (its KV reused): the drafter indexes that once for all
    the rows that share it (`engine/suffix_drafter.py`)."""
    shared = min(row.num_reused_tokens, row.num_prompt_tokens)
    return max(0, row.num_tokens - 1 - max(row.num_indexed, shared))


class RoundCostModel:
    def __init__(self, cost: CostModel, buckets: ShapeBuckets | None = None,
                 uses_draft_model: bool = True, flat: bool = False) -> None:
        self.cost, self.buckets, self.uses_draft_model = cost, buckets or ShapeBuckets(), uses_draft_model
        self.flat = flat  # passes are flat batches of real tokens (module docstring)

    def verify_terms(self, num_rows: int, query_len: int, max_start: int) -> tuple[int, int]:
        """(target rows incl. padding, KV tokens read) of one pass over num_rows rows."""
        bucket = self.buckets.fit(num_rows, query_len)
        kv_len = self.buckets.kv_len(max_start + bucket.query_len)
        return bucket.batch_rows * bucket.query_len, bucket.batch_rows * kv_len

    def decode_ms(self, shape: DecodeShape) -> float:
        """Verify pass (+ drafting) of a batch; the intercept included."""
        if shape.num_rows == 0:
            return self.cost.intercept_ms
        if self.flat:
            rows = shape.num_rows * (1 + shape.max_k)
            kv = shape.sum_start + rows
            wide_kv = shape.sum_wide_start + shape.num_wide * (1 + shape.max_k)
        else:
            rows, kv = self.verify_terms(shape.num_rows, 1 + shape.max_k, shape.max_start)
            wide_kv = kv if shape.max_k > 0 else 0
        draft_passes, draft_positions = 0, 0.0
        if self.uses_draft_model and shape.max_k > 0 and shape.num_drafting > 0:  # (a lookup's drafts run no model)
            draft_passes = shape.max_k
            lags = shape.sum_lag if self.flat else shape.num_drafting * shape.max_lag
            draft_positions = lags + shape.sum_k - shape.num_drafting
        lookup_ms = self.cost.lookup_ms(shape.num_lookup, shape.sum_index_lag)
        return self.cost.predict_ms(1, rows, draft_passes, draft_positions, kv, wide_kv) + lookup_ms

    def prefill_extra_ms(self, num_rows: int, max_chunk: int, max_start: int, sum_chunk: int,
                         draft: bool = True) -> float:
        """What one prefill pass adds to a round (no intercept: the round pays that once); with
        `draft`, the draft cache filled beside it too."""
        if num_rows == 0 or max_chunk <= 0:
            return 0.0
        c = self.cost
        kv_ms = c.kv_tokens_read + (c.wide_kv_tokens_read if max_chunk > 1 else 0.0)
        if self.flat:  # in the verify pass: its positions and their KV (each row read to at most max_start)
            extra = c.target_rows * sum_chunk + kv_ms * (num_rows * max_start + sum_chunk)
        else:
            rows, kv = self.verify_terms(num_rows, max_chunk, max_start)
            extra = c.target_passes + c.target_rows * rows + kv_ms * kv
        if self.uses_draft_model and draft:
            extra += c.draft_passes + c.draft_rows * sum_chunk
        return extra

    def prefill_ms(self, prefill: list[tuple[Row, int]], draft: bool = True) -> float:
        """What a round's prefill chunks (row, tokens) add to it (`prefill_extra_ms`)."""
        sizes = [size for _, size in prefill]
        starts = [row.num_computed for row, _ in prefill]
        return self.prefill_extra_ms(len(sizes), max(sizes, default=0), max(starts, default=0), sum(sizes), draft)

    def round_ms(self, decode: list[tuple[Row, int]], prefill: list[tuple[Row, int]]) -> float:
        """Predicted time of a whole planned round (decode rows with k, prefill rows with chunk)."""
        shape = DecodeShape.of([r for r, _ in decode], [k for _, k in decode])
        extra = self.prefill_ms(prefill)
        if self.flat and prefill and not decode:
            extra += self.cost.target_passes  # a pass of prefill chunks alone
        return self.decode_ms(shape) + extra

    @property
    def draft_position_ms(self) -> float:
        """A draft row's price: none where drafting runs no model (n-gram lookup)."""
        return self.cost.draft_rows if self.uses_draft_model else 0.0

    def recompute_ms(self, num_tokens: int) -> float:
        """Marginal time to re-prefill num_tokens positions after a preemption by recompute."""
        c = self.cost
        kv_ms = c.kv_tokens_read + c.wide_kv_tokens_read
        return (c.target_rows + self.draft_position_ms + kv_ms * num_tokens / 2) * num_tokens

    def row_share_ms(self, batch_rows: int, k: int, kv_len: int) -> tuple[float, float]:
        """(t_verify, t_draft): one row's share of a verify pass with k drafts, and of one draft step,
        in a batch of batch_rows rows (per-pass costs split evenly; per-row costs whole)."""
        c, batch = self.cost, max(1, batch_rows)
        t_verify = ((c.intercept_ms + c.target_passes) / batch + c.target_rows * (1 + k)
                    + (c.kv_tokens_read + (c.wide_kv_tokens_read if k else 0.0)) * kv_len)
        t_draft = (c.draft_passes / batch + c.draft_rows) if self.uses_draft_model else 0.0
        return t_verify, t_draft
