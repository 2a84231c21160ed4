"""Deadline-sized prefill chunks (SLOWeave): the largest chunk whose predicted round time keeps
every running decode row within `tpot_slo_ms`.

Each verified row commits at least one token per round, so a round of at most tpot_slo_ms keeps
every running row's time per output token within the objective. The predicted round time of
"decode rows + prefill rows each given min(c, what it has left)" is non-decreasing in c (every cost
coefficient is ≥ 0), so the largest feasible c is found by binary search in O(log c_max) predictions.
With no decode rows there is no deadline to keep and the chunk is as large as the token budget.
If even a decode-only round misses the objective, `min_chunk` still lets admitted rows progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbatch.core import Row
from specbatch.sched.context import SchedContext
from specbatch.sched.roundcost import DecodeShape


@dataclass
class DeadlinePrefillChunk:
    ctx: SchedContext
    min_chunk: int = 16
    name: str = "deadline"

    def chunk_tokens(self, decode_rows: list[tuple[Row, int]], prefill_rows: Sequence[Row] = ()) -> int:
        budget_tokens = self.ctx.max_round_tokens - sum(1 + k for _, k in decode_rows)
        longest = max((row.num_prefill_remaining for row in prefill_rows), default=budget_tokens)
        high = max(0, min(longest, budget_tokens))
        if not decode_rows:
            return max(high, 1)
        if self.round_ms(decode_rows, prefill_rows, self.min_chunk) > self.ctx.tpot_slo_ms:
            return self.min_chunk
        low = self.min_chunk  # feasible
        while low < high:
            mid = (low + high + 1) // 2
            if self.round_ms(decode_rows, prefill_rows, mid) <= self.ctx.tpot_slo_ms:
                low = mid
            else:
                high = mid - 1
        return low

    def round_ms(self, decode_rows: list[tuple[Row, int]], prefill_rows: Sequence[Row],
                 chunk: int) -> float:
        """Predicted round: the decode batch, each prefill row's min(chunk, left) within the token
        budget, and a verify row (k = 0) for each row whose prefill completes."""
        shape = DecodeShape.of([r for r, _ in decode_rows], [k for _, k in decode_rows])
        budget = self.ctx.max_round_tokens - sum(1 + k for _, k in decode_rows)
        sizes, starts = [], []
        for row in prefill_rows:
            size = min(chunk, row.num_prefill_remaining, budget)
            if size <= 0:
                break
            sizes.append(size)
            starts.append(row.num_computed)
            budget -= size
            if size == row.num_prefill_remaining and budget >= 1:
                shape.add(row.num_computed + size, 0)
                budget -= 1
        round_cost = self.ctx.round_cost
        extra = round_cost.prefill_extra_ms(len(sizes), max(sizes, default=0), max(starts, default=0),
                                            sum(sizes))
        return round_cost.decode_ms(shape) + extra
