"""Committing emitted tokens: EOS, max_new_tokens, the context limit and stop strings.

Tokens emitted after a stop (an accepted block may run past it) are discarded and never counted
as committed. EOS is kept in `output_ids` (as Hugging Face `generate` does) but not in the text; a
stop string is kept in neither the text nor the tokens after the one that completed it.

Stop strings are searched in characters, not tokens: a byte-level tokenizer spends up to four
tokens on one character (emoji, CJK), so no token window sized from a stop's length is safe. Each
row's output is decoded incrementally (as vLLM's detokenizer does), a few tokens per commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specbatch.core import Row, Status

_INCOMPLETE = "\ufffd"  # what a decoder shows for the first bytes of a character still to come
_MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes: past that, a U+FFFD is in the text itself


@dataclass
class _TextScan:
    """Where a row's incremental decode stands. `tokens[prefix_offset:read_offset]` is text already
    seen, decoded again as context for the next tokens; `tail` is its last (longest stop - 1) chars."""

    prefix_offset: int = 0
    read_offset: int = 0
    tail: str = ""


class StopChecker:
    def __init__(self, eos_token_ids: set[int], decode: Callable[[list[int]], str], max_context: int) -> None:
        self.eos_token_ids, self.decode, self.max_context = eos_token_ids, decode, max_context
        self._scans: dict[str, _TextScan] = {}  # by request id: rows with stop strings still running

    def commit(self, row: Row, emitted: list[int]) -> int:
        """Append emitted tokens until a stop; returns how many were committed."""
        for count, token in enumerate(emitted, start=1):
            row.token_ids.append(token)
            reason = self._finish_reason(row, token)
            if reason is not None:
                row.status, row.finish_reason = Status.COMPLETED, reason
                self.forget(row)
                return count
        return len(emitted)

    def forget(self, row: Row) -> None:
        """Drop a finished (or cancelled, dropped) row's decode state."""
        self._scans.pop(row.request_id, None)

    def _finish_reason(self, row: Row, token: int) -> str | None:
        if token in self.eos_token_ids:
            return "eos"
        if row.params.stop and self._hit_stop(row):
            return "stop"
        if row.num_output_tokens >= row.params.max_new_tokens or row.num_tokens >= self.max_context:
            return "length"
        return None

    def _hit_stop(self, row: Row) -> bool:
        """Whether the characters the newest token completed finish a stop string."""
        scan = self._scans.setdefault(row.request_id, _TextScan())
        tokens, base = row.token_ids, row.num_prompt_tokens  # offsets count output tokens
        seen = self.decode(tokens[base + scan.prefix_offset : base + scan.read_offset])
        text = self.decode(tokens[base + scan.prefix_offset :])
        waiting = text.endswith(_INCOMPLETE) and row.num_output_tokens - scan.read_offset < _MAX_CHAR_TOKENS
        if len(text) <= len(seen) or waiting:
            return False  # no new complete character yet
        window = scan.tail + text[len(seen) :]  # a new stop ends in the new characters
        scan.prefix_offset, scan.read_offset = scan.read_offset, row.num_output_tokens
        keep = max(len(stop) for stop in row.params.stop) - 1
        scan.tail = window[-keep:] if keep else ""
        return any(stop in window for stop in row.params.stop)

    def text(self, row: Row) -> str:
        text = self.decode([t for t in row.output_ids if t not in self.eos_token_ids])
        if row.finish_reason == "stop":
            cut = min((text.find(s) for s in row.params.stop if s in text), default=len(text))
            text = text[:cut]
        return text
