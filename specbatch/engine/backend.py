"""HFBackend: the only code that runs models. It executes a round plan: prefill chunks, drafting,
one target verify pass, and the acceptance rule. It changes KV state, never the output lists:
committing tokens (and stops) is the loop's job."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specbatch.engine.drafters import Drafter, Proposals
from specbatch.engine.forward import PassShape, forward_rows
from specbatch.engine.sampling import accept_greedy, accept_sampled, request_generator, warp
from specbatch.engine.sequence import Sequence
from specbatch.engine.slot_cache import SlotCache
from specbatch.sched.buckets import ShapeBuckets
from specbatch.sched.plan import RoundPlan


@dataclass
class RowOutcome:
    row: Sequence
    k: int  # planned lookahead
    proposed: list[int]  # drafts actually offered
    num_accepted: int
    emitted: list[int]  # accepted drafts + correction-or-bonus token, before stops


@dataclass
class RoundOutcome:
    rows: list[RowOutcome] = field(default_factory=list)
    prefill_shape: PassShape | None = None
    verify_shape: PassShape | None = None
    proposals: Proposals | None = None
    num_draft_prefill_rows: int = 0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0


class HFBackend:
    def __init__(
        self,
        target: torch.nn.Module,
        target_cache: SlotCache,
        drafter: Drafter,
        buckets: ShapeBuckets,
        vocab_size: int,
        mask_dtype: torch.dtype | None,
        job_seed: int = 0,
    ) -> None:
        self.target, self.cache, self.drafter, self.buckets = target, target_cache, drafter, buckets
        self.vocab_size, self.mask_dtype, self.job_seed = vocab_size, mask_dtype, job_seed
        self.scratch_slot = target_cache.num_slots - 1
        self.slot_owner: dict[int, Sequence] = {}
        self.generators: dict[str, torch.Generator] = {}
        self._sync = torch.cuda.synchronize if target_cache.keys[0].is_cuda else (lambda: None)

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots - 1  # the last slot is scratch space for padded batch rows

    def admit(self, row: Sequence) -> None:
        slot = min(set(range(self.num_slots)) - set(self.slot_owner))
        row.slot, self.slot_owner[slot] = slot, row
        row.num_computed = row.num_draft_computed = 0
        if row.request_id not in self.generators:
            self.generators[row.request_id] = request_generator(row.request_id, row.params.seed, self.job_seed)

    def release(self, row: Sequence, finished: bool) -> None:
        if row.slot is not None:
            del self.slot_owner[row.slot]
            row.slot = None
        if finished:
            self.generators.pop(row.request_id, None)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        outcome = RoundOutcome()
        self._arrange_slots([row for row, _ in plan.decode])
        decode = sorted(plan.decode, key=lambda item: item[0].slot)  # slots 0..D-1: a cache view
        if plan.prefill:
            started = time.perf_counter()
            outcome.prefill_shape, outcome.num_draft_prefill_rows = self._prefill(plan.prefill)
            self._sync()
            outcome.prefill_ms = (time.perf_counter() - started) * 1000
        if decode:
            rows, ks = [row for row, _ in decode], [k for _, k in decode]
            started = time.perf_counter()
            outcome.proposals = self.drafter.propose(rows, ks, self.generators)
            self._sync()
            outcome.draft_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            outcome.rows, outcome.verify_shape = self._verify(rows, ks, outcome.proposals)
            outcome.verify_ms = (time.perf_counter() - started) * 1000
        return outcome

    def _prefill(self, work: list[tuple[Sequence, int]]) -> tuple[PassShape, int]:
        rows = [row for row, _ in work]
        chunks = [row.token_ids[row.num_computed : row.num_computed + size] for row, size in work]
        bucket = self.buckets.fit(len(rows), max(len(c) for c in chunks))
        _, shape = forward_rows(
            self.target, self.cache, [r.slot for r in rows], [r.num_computed for r in rows], chunks,
            bucket.query_len, bucket.batch_rows, self.buckets.kv_len_multiple, self.mask_dtype,
            self.scratch_slot, keep_logits=False,
        )
        num_draft_rows = 0
        if self.drafter.uses_model:
            ends = [row.num_computed + size for row, size in work]
            draft_chunks = [row.token_ids[row.num_draft_computed : end] for row, end in zip(rows, ends)]
            draft_shape = self.drafter.prefill(
                [r.slot for r in rows], [r.num_draft_computed for r in rows], draft_chunks
            )
            num_draft_rows = draft_shape.num_real_positions
            for row, end in zip(rows, ends):
                row.num_draft_rows += end - row.num_draft_computed
                row.num_draft_computed = end
        for row, size in work:
            row.num_computed += size
        return shape, num_draft_rows

    def _verify(
        self, rows: list[Sequence], ks: list[int], proposals: Proposals
    ) -> tuple[list[RowOutcome], PassShape]:
        chunks = [[row.token_ids[-1]] + drafts for row, drafts in zip(rows, proposals.tokens)]
        bucket = self.buckets.fit(len(rows), max(len(c) for c in chunks))
        logits, shape = forward_rows(
            self.target, self.cache, [r.slot for r in rows], [r.num_computed for r in rows], chunks,
            bucket.query_len, bucket.batch_rows, self.buckets.kv_len_multiple, self.mask_dtype,
            self.scratch_slot,
        )
        logits = logits[..., : self.vocab_size]  # [rows, query_len, vocab]
        argmax = logits.argmax(dim=-1).tolist()  # [rows, query_len]
        self._sync()
        outcomes = []
        for index, (row, k) in enumerate(zip(rows, ks)):
            drafts = proposals.tokens[index]
            if row.params.is_greedy:
                num_accepted, token = accept_greedy(drafts, argmax[index][: len(drafts) + 1])
            else:
                target_probs = warp(logits[index, : len(drafts) + 1], row.params.temperature, row.params.top_p)
                num_accepted, token = accept_sampled(
                    drafts, proposals.draft_probs[index], target_probs, self.generators[row.request_id]
                )
            num_tokens_before = row.num_tokens
            row.num_computed = num_tokens_before + num_accepted  # pending + accepted drafts are valid
            self.drafter.after_accept(row, num_tokens_before, num_accepted)
            outcomes.append(RowOutcome(row, k, drafts, num_accepted, drafts[:num_accepted] + [token]))
        return outcomes, shape

    def _arrange_slots(self, decode_rows: list[Sequence]) -> None:
        """Keep decode rows in slots 0..D-1 so the verify pass reads a view of the cache instead of
        gathering it. Only rows outside that range move (one row's valid KV each), into the holes."""
        held = {row.slot for row in decode_rows}
        holes = [slot for slot in range(len(decode_rows)) if slot not in held]
        movers = [row for row in decode_rows if row.slot >= len(decode_rows)]
        for row, hole in zip(movers, holes):
            self._swap(row, hole)

    def _swap(self, row: Sequence, slot: int) -> None:
        occupant = self.slot_owner.get(slot)
        length = max(row.num_computed, row.num_draft_computed, 1)
        if occupant is not None:
            length = max(length, occupant.num_computed, occupant.num_draft_computed)
            self.cache.swap_slots(row.slot, slot, length)
            self._draft_cache_op("swap_slots", row.slot, slot, length)
            occupant.slot, self.slot_owner[row.slot] = row.slot, occupant
        else:
            self.cache.copy_slot(row.slot, slot, length)
            self._draft_cache_op("copy_slot", row.slot, slot, length)
            del self.slot_owner[row.slot]
        row.slot, self.slot_owner[slot] = slot, row

    def _draft_cache_op(self, name: str, a: int, b: int, length: int) -> None:
        draft_cache = getattr(self.drafter, "cache", None)
        if draft_cache is not None:
            getattr(draft_cache, name)(a, b, length)
