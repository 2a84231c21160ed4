"""Drafters propose up to k tokens per row; the target verifies them in one pass.

`DraftModelDrafter` runs a small causal LM with its own paged cache (the target's block tables),
`NgramDrafter` looks the row's last n-gram up in its own prompt + output (prompt lookup), and
`NoDrafter` proposes nothing (k = 0 everywhere: plain decoding on the same path). The EAGLE-3 head,
which drafts from the target's hidden states, is `engine/eagle_drafter.py`; the suffix drafter, which
drafts from the whole job's outputs, `engine/suffix_drafter.py`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specbatch.core import PassShape, Proposals, Row
from specbatch.engine.argmax import greedy_tokens
from specbatch.engine.coupling import Coupling
from specbatch.engine.forward import PagedModel, RowCache


class Drafter(Protocol):
    uses_model: bool

    def prefill(self, rows: list[Row], caches: list[RowCache], starts: list[int], ends: list[int]) -> PassShape | None:
        """Fill the drafter's cache with positions starts..ends alongside the target's prefill chunks
        (no-op without a model)."""

    def observe(self, rows: list[Row], starts: list[int], lengths: list[int], features: torch.Tensor) -> None:
        """The target's hidden states of a pass (only for a drafter that reads them)."""

    def forget(self, row: Row) -> None:
        """A row left the engine (finished, preempted or cancelled): drop what the drafter keeps for it."""

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        """Draft up to ks[i] tokens for rows[i]; rows with k = 0 get none. `starts[i]` is how many
        of the row's tokens the draft cache holds (`caches[i]`); the drafter feeds it the rest."""


class NoDrafter:
    uses_model = False

    def prefill(self, rows: list[Row], caches: list[RowCache], starts: list[int], ends: list[int]) -> PassShape | None:
        return None

    def observe(self, rows: list[Row], starts: list[int], lengths: list[int], features: torch.Tensor) -> None:
        return None

    def forget(self, row: Row) -> None:
        return None

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        return Proposals([[] for _ in rows], [None for _ in rows], [0 for _ in rows])


class NgramDrafter(NoDrafter):
    """Prompt lookup: find the latest earlier occurrence of the row's last n tokens (n from ngram_max
    down to ngram_min) and propose the tokens that followed it. Proposals are point masses."""

    def __init__(self, ngram_min: int = 1, ngram_max: int = 3) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        tokens = [self.lookup(row.token_ids, k) if k > 0 else [] for row, k in zip(rows, ks, strict=True)]
        return Proposals(tokens, [None for _ in rows], [0 for _ in rows], num_lookup_rows=sum(k > 0 for k in ks))

    def continue_after(self, row: Row, prefix: list[int], k: int) -> list[int]:
        """Up to k drafts that follow the row's tokens and then `prefix` (drafts proposed ahead of
        these: a grammar's forced tokens, `engine/forced_drafter.py`)."""
        return self.lookup(row.token_ids + prefix, k)

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        for n in range(min(self.ngram_max, len(token_ids) - 1), self.ngram_min - 1, -1):
            suffix = token_ids[-n:]
            for start in range(len(token_ids) - n - 1, -1, -1):
                if token_ids[start : start + n] == suffix:
                    return token_ids[start + n : start + n + k]
        return []


class DraftModelDrafter(NoDrafter):
    uses_model = True

    def __init__(self, draft: PagedModel, vocab_size: int, target_device: torch.device) -> None:
        self.draft, self.vocab_size = draft, vocab_size  # vocab_size: the target's
        self.target_device = target_device  # where q and the random streams live (models.draft_device may differ)

    def prefill(self, rows: list[Row], caches: list[RowCache], starts: list[int], ends: list[int]) -> PassShape | None:
        chunks = [row.token_ids[start:end] for row, start, end in zip(rows, starts, ends, strict=True)]
        return self.draft.forward([cache.table for cache in caches], starts, chunks, keep_logits=False)[1]

    def propose(self, rows: list[Row], ks: list[int], caches: list[RowCache], starts: list[int],
                coupling: Coupling) -> Proposals:
        proposals = Proposals([[] for _ in rows], [None for _ in rows], [0 for _ in rows])
        fed_to = list(starts)  # per row: positions the draft cache holds
        q_rows: list[list[torch.Tensor]] = [[] for _ in rows]
        active = [i for i, k in enumerate(ks) if k > 0]
        step = 0
        while active:
            # step 0 catches the draft cache up (pending token, and any lag); later steps feed the last draft
            chunks = {i: rows[i].token_ids[fed_to[i] :] if step == 0 else proposals.tokens[i][-1:] for i in active}
            logits, shape = self.draft.forward([caches[i].table for i in active], [fed_to[i] for i in active],
                                               [chunks[i] for i in active], last_only=True)
            assert logits is not None
            last = self._to_target_vocab(logits).to(self.target_device)  # [active rows, vocab]
            # greedy rows' drafts in one argmax and one copy to the host, not one of each per row
            argmax = greedy_tokens(last) if any(rows[i].params.is_greedy for i in active) else []
            for row_index, i in enumerate(active):
                fed_to[i] += len(chunks[i])
                proposals.num_fed[i] += len(chunks[i])
                token, q = self._pick(rows[i], len(proposals.tokens[i]), last[row_index], coupling,
                                      argmax[row_index] if argmax else None)
                proposals.tokens[i].append(token)
                if q is not None:
                    q_rows[i].append(q)
            num_real = sum(len(chunk) for chunk in chunks.values())
            proposals.num_draft_positions += num_real
            proposals.num_padded_draft_positions += shape.num_padded_positions + shape.num_real_positions - num_real
            proposals.num_passes += 1
            active = [i for i in active if len(proposals.tokens[i]) < ks[i]]
            step += 1
        for i, row in enumerate(rows):
            if q_rows[i] and not row.params.is_greedy:
                proposals.draft_probs[i] = torch.stack(q_rows[i])
        return proposals

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Align the draft's output layer with the target's vocabulary (same tokenizer, maybe padded)."""
        if logits.shape[-1] >= self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((logits.shape[0], self.vocab_size - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _pick(self, row: Row, draft_index: int, logits: torch.Tensor, coupling: Coupling, argmax: int | None
              ) -> tuple[int, torch.Tensor | None]:
        """The row's next draft token from draft logits [vocab] (`argmax`: theirs, taken for the step's rows
        at once where any is greedy), and the q it was drawn from."""
        # a constrained row's argmax is masked: it draws through the coupling
        if argmax is not None and row.params.is_greedy and not coupling.constrains(row):
            return argmax, None
        return coupling.draft(row, row.num_output_tokens + draft_index, logits)
