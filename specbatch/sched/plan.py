"""The scheduler's output for one round: what the backend executes."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbatch.engine.sequence import Sequence


@dataclass
class RoundPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (row, chunk tokens)
    decode: list[tuple[Sequence, int]] = field(default_factory=list)  # (row, lookahead k)
    plan_ms: float = 0.0  # the scheduler's own time for this plan (policies included)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def num_target_rows(self) -> int:
        return sum(size for _, size in self.prefill) + sum(1 + k for _, k in self.decode)
