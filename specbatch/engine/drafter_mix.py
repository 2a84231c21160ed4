"""`DrafterMix`: several drafters in one job, each row drafting with the one its plan chose (issue 43).

The scheduler picks a drafter per row and round (`sched/drafter_choice.py`) and writes it on the row
(`Row.drafter`); the mix hands each sub-drafter every row, with k = 0 for the rows that are not its
own, and merges what they proposed row by row. Every sub-drafter keeps its own state for every row
(the draft model's cache, an EAGLE head's feature buffer, the suffix indexes), so a row that switches
drafter mid-row costs only the catch-up the model drafter's lag already prices. Switching keeps the
output law: each round's drafts are verified against the target with the q they were drawn from (a
point mass for n-gram and suffix drafts, the warped draft distribution for a model's), so greedy
rows keep the target's argmax and sampled rows the target's distribution, whichever drafter drafted
the round before.
"""

from __future__ import annotations

from typing import Any

import torch

from specbatch.core import PassShape, Proposals, Row
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import Drafter


class DrafterMix:
    def __init__(self, drafters: dict[str, Drafter]) -> None:
        """`drafters`: by kind, in the configured order; the first is a row's until a plan picks."""
        self.drafters = drafters
        self.default = next(iter(drafters))
        models = [drafter for drafter in drafters.values() if drafter.uses_model]
        self.uses_model = bool(models)
        # the draft model's `PagedModel`, where one runs (a row's block table serves its cache too; the job times it)
        self.draft = getattr(models[0], "draft", None) if models else None

    def kind_of(self, row: Row) -> str:
        return row.drafter if row.drafter in self.drafters else self.default

    def continue_after(self, row: Row, prefix: list[int], k: int) -> list[int]:
        """The row's drafter's drafts after `prefix`, where it drafts from tokens alone (n-gram, suffix)."""
        extend = getattr(self.drafters[self.kind_of(row)], "continue_after", None)
        return extend(row, prefix, k) if extend is not None else []

    def prefill(self, rows: list[Row], caches: list[Any], starts: list[int], ends: list[int]) -> PassShape | None:
        shapes = [drafter.prefill(rows, caches, starts, ends) for drafter in self.drafters.values()]
        return next((shape for shape in shapes if shape is not None), None)  # at most one runs a model

    def observe(self, rows: list[Row], starts: list[int], lengths: list[int], features: torch.Tensor) -> None:
        for drafter in self.drafters.values():
            drafter.observe(rows, starts, lengths, features)

    def forget(self, row: Row) -> None:
        for drafter in self.drafters.values():
            drafter.forget(row)

    def propose(self, rows: list[Row], ks: list[int], caches: list[Any], starts: list[int],
                coupling: Coupling) -> Proposals:
        """Each sub-drafter drafts for its own rows (`caches[i]`: row i's draft cache, whatever the
        backend's kind of it), the others' k set to 0."""
        kinds = [self.kind_of(row) for row in rows]
        merged = Proposals([[] for _ in rows], [None for _ in rows], [0 for _ in rows], [0 for _ in rows],
                           indexed_to=[0 for _ in rows])
        for kind, drafter in self.drafters.items():
            own = [k if row_kind == kind else 0 for k, row_kind in zip(ks, kinds, strict=True)]
            if not any(own):
                continue
            proposals = drafter.propose(rows, own, caches, starts, coupling)
            for i, k in enumerate(own):
                if k:
                    merged.tokens[i], merged.draft_probs[i] = proposals.tokens[i], proposals.draft_probs[i]
                    merged.num_fed[i] = proposals.num_fed[i]
                    merged.num_kept[i] = proposals.num_kept[i] if proposals.num_kept else proposals.num_fed[i]
                    merged.indexed_to[i] = proposals.indexed_to[i] if proposals.indexed_to else 0
            merged.num_draft_positions += proposals.num_draft_positions
            merged.num_padded_draft_positions += proposals.num_padded_draft_positions
            merged.num_passes += proposals.num_passes
            merged.num_lookup_rows += proposals.num_lookup_rows
            merged.num_indexed_tokens += proposals.num_indexed_tokens
        return merged
