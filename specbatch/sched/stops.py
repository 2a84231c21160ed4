"""Committing emitted tokens: EOS, max_new_tokens, the context limit and stop strings.

Tokens emitted after a stop (an accepted block may run past it) are discarded and never counted
as committed. EOS is kept in `output_ids` (as Hugging Face `generate` does) but not in the text; a
stop string is kept in neither the text nor the tokens after the one that completed it.
"""

from __future__ import annotations

from collections.abc import Callable

from specbatch.core import Row, Status


class StopChecker:
    def __init__(self, eos_token_ids: set[int], decode: Callable[[list[int]], str], max_context: int) -> None:
        self.eos_token_ids, self.decode, self.max_context = eos_token_ids, decode, max_context

    def commit(self, row: Row, emitted: list[int]) -> int:
        """Append emitted tokens until a stop; returns how many were committed."""
        for count, token in enumerate(emitted, start=1):
            row.output_ids.append(token)
            reason = self._finish_reason(row, token)
            if reason is not None:
                row.status, row.finish_reason = Status.COMPLETED, reason
                return count
        return len(emitted)

    def _finish_reason(self, row: Row, token: int) -> str | None:
        if token in self.eos_token_ids:
            return "eos"
        if row.params.stop and self._hit_stop(row):
            return "stop"
        if row.num_output_tokens >= row.params.max_new_tokens or row.num_tokens >= self.max_context:
            return "length"
        return None

    def _hit_stop(self, row: Row) -> bool:
        window = max(len(stop) for stop in row.params.stop) + 8
        tail = self.decode(row.output_ids[-window:])
        return any(stop in tail for stop in row.params.stop)

    def text(self, row: Row) -> str:
        text = self.decode([t for t in row.output_ids if t not in self.eos_token_ids])
        if row.finish_reason == "stop":
            cut = min((text.find(s) for s in row.params.stop if s in text), default=len(text))
            text = text[:cut]
        return text
