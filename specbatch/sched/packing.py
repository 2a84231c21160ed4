"""Packing: which decodable rows share a round when they do not all fit (token budget, largest
batch bucket) or when fitting them all would pad badly (a batch just past a bucket boundary).

The verify pass pads every row to the batch bucket B' and the longest query (1 + max k), and
attends over the longest row's KV for every bucket row, so one outlier in KV length or k costs the
whole batch. A candidate batch size n is each bucket size below the number of rows, plus the
largest that fits; for each, the rows are the must-run ones (skipped `max_skips` rounds already:
no row starves) and then those nearest to an anchor row in KV-length bucket and acceptance (similar
length, similar k). The cost model picks n by predicted throughput

    Σ_i E(α_i, k̂) / T_verify(n rows, their max KV, k̂),     k̂ = the recent mean k,

ties going to the larger n. With no batch buckets and everything fitting, every row runs (O(n)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specbatch.core import Row
from specbatch.sched.context import SchedContext
from specbatch.sched.estimates import expected_tokens
from specbatch.sched.roundcost import DecodeShape, draft_lag


@dataclass
class Packer:
    ctx: SchedContext
    max_skips: int = 2
    skipped: dict[str, int] = field(default_factory=dict)  # request_id → rounds skipped in a row

    def select(self, rows: list[Row], max_rows: int, max_tokens: int) -> list[Row]:
        """Rows to decode this round, in their given order."""
        num_fit = min(len(rows), max_rows, max_tokens)
        smaller = [b for b in self.ctx.round_cost.buckets.batch_rows if b < num_fit]
        if num_fit == len(rows) and not smaller:
            self.skipped.clear()
            return rows
        best = max((self._candidate(rows, n) for n in [num_fit, *smaller]), key=lambda c: (c[0], len(c[1])))
        chosen = best[1]
        chosen_ids = {id(row) for row in chosen}
        self.skipped = {row.request_id: self.skipped.get(row.request_id, 0) + 1
                        for row in rows if id(row) not in chosen_ids}
        return [row for row in rows if id(row) in chosen_ids]

    def _candidate(self, rows: list[Row], n: int) -> tuple[float, list[Row]]:
        """(predicted tokens per ms, rows) of a batch of n rows."""
        must = sorted((r for r in rows if self.skipped.get(r.request_id, 0) >= self.max_skips),
                      key=lambda r: -self.skipped[r.request_id])[:n]
        anchor = must[0] if must else max(rows, key=lambda r: self.skipped.get(r.request_id, 0))
        must_ids = {id(r) for r in must}
        rest = sorted((r for r in rows if id(r) not in must_ids), key=lambda r: self._distance(r, anchor))
        chosen = must + rest[: n - len(must)]
        return self._throughput(chosen), chosen

    def _distance(self, row: Row, anchor: Row) -> tuple[int, float]:
        buckets = self.ctx.round_cost.buckets
        kv_gap = abs(buckets.kv_len(row.num_tokens) - buckets.kv_len(anchor.num_tokens))
        return kv_gap, abs(self.ctx.alpha(row) - self.ctx.alpha(anchor))

    def _throughput(self, rows: list[Row]) -> float:
        k = round(self.ctx.recent_k)
        shape = DecodeShape()
        for row in rows:
            shape.add(row.num_computed, k, draft_lag(row) if k else 0)
        tokens = sum(expected_tokens(self.ctx.alpha(row), k) for row in rows)
        return tokens / self.ctx.round_cost.decode_ms(shape)
