"""Grammar-forced tokens as free drafts (issue 42).

Where a row's grammar allows a single continuation (a schema's keys, quotes and braces, an enum's
only completion), llguidance names its tokens (`compute_ff_tokens`, the canonical tokenization of
the forced text, the only tokens its mask allows there). `ForcedDrafter` proposes them, up to the
row's k, in place of the configured drafter's proposals for that row this round: point masses
(q = 1) the target verifies like any draft, so the law stays exact, and under the masked target
p(x) = 1 wherever the mask is a single token, so they are accepted. A drafter that drafts from
tokens alone (n-gram, suffix: `continue_after`) continues after them up to k; a model drafter does
not (it would first have to be fed them), and catches up on them once they are committed, as on any
lag. Rows with nothing forced draft with the configured drafter.
"""

from __future__ import annotations

from typing import Any

import torch

from specbatch.core import PassShape, Proposals, Row
from specbatch.engine.constraints import GrammarRuntime
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import Drafter


class ForcedDrafter:
    """Wraps the job's drafter: forced tokens first, the drafter's proposals for the other rows."""

    def __init__(self, inner: Drafter, grammar: GrammarRuntime) -> None:
        self.inner, self.grammar = inner, grammar
        self.uses_model = inner.uses_model

    def __getattr__(self, name: str) -> Any:  # what else the backend or a test reads off the drafter
        return getattr(self.inner, name)

    def prefill(self, rows: list[Row], caches: Any, starts: list[int], ends: list[int]) -> PassShape | None:
        return self.inner.prefill(rows, caches, starts, ends)

    def observe(self, rows: list[Row], starts: list[int], lengths: list[int], features: torch.Tensor) -> None:
        self.inner.observe(rows, starts, lengths, features)

    def forget(self, row: Row) -> None:
        self.inner.forget(row)

    def propose(self, rows: list[Row], ks: list[int], caches: Any, starts: list[int],
                coupling: Coupling) -> Proposals:
        forced = [self.grammar.forced_tokens(row, k) for row, k in zip(rows, ks, strict=True)]
        inner_ks = [0 if tokens else k for tokens, k in zip(forced, ks, strict=True)]
        proposals = self.inner.propose(rows, inner_ks, caches, starts, coupling)
        extend = getattr(self.inner, "continue_after", None)  # a drafter that drafts from tokens alone
        for index, (row, k, tokens) in enumerate(zip(rows, ks, forced, strict=True)):
            if tokens:
                after = extend(row, tokens, k - len(tokens)) if extend is not None and k > len(tokens) else []
                proposals.tokens[index], proposals.draft_probs[index] = tokens + after, None  # point masses
        proposals.num_forced = [len(tokens) for tokens in forced]
        return proposals
