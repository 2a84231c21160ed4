"""HFBackend: the only code that runs models. It executes a round plan: prefill chunks, drafting,
one target verify pass, and the acceptance rule. It owns the KV slots and random streams of the
rows it serves and never writes a row: committing tokens, KV validity and counters is the
scheduler's commit step (`sched/commit.py`), from the `RoundOutcome` returned here."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specbatch.core import PassShape, PrefixCopy, Proposals, RoundOutcome, RoundPlan, Row, RowOutcome, Status
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import Drafter
from specbatch.engine.forward import SlotModel
from specbatch.engine.sampling import accept_greedy
from specbatch.engine.slot_cache import SlotCache
from specbatch.records import ms_since
from specbatch.sched.prefix_cache import PrefixCache, RetainedPrefix, copy_order


class HFBackend:
    def __init__(self, target: SlotModel, drafter: Drafter, vocab_size: int, coupling: Coupling,
                 draft_cache: SlotCache | None = None, warm_up: Callable[[], None] | None = None) -> None:
        self.target, self.cache, self.drafter = target, target.cache, drafter
        self.draft_cache = draft_cache  # moved along with the target's when rows change slots
        self._warm_up = warm_up  # captures graphs; runs before the first round's passes, then never
        self.vocab_size, self.coupling = vocab_size, coupling
        self.slot_of: dict[str, int] = {}  # request id -> slot
        self.slot_owner: dict[int, Row] = {}
        self.prefix: PrefixCache | None = None  # shared prefixes: whose KV a row copies, which free slots keep one
        self.retained: dict[int, RetainedPrefix] = {}  # the prefix cache's kept slots (free, but not to pad into)
        self._sync = torch.cuda.synchronize if self.cache.keys[0].is_cuda else (lambda: None)
        self._share_free_slots()

    def use_prefix_cache(self, prefix: PrefixCache) -> None:
        """Serve the scheduler's prefix copies; finished rows' slots keep their prefix while free."""
        self.prefix, self.retained = prefix, prefix.retained
        caches = [self.cache] + ([self.draft_cache] if self.draft_cache is not None else [])
        prefix.bytes_per_token = sum(cache.bytes_per_token for cache in caches)
        self._share_free_slots()

    def _share_free_slots(self) -> None:
        """Tell the models which slots padded rows may write: those no row owns and no prefix is kept in."""
        owners, retained = self.slot_owner, self.retained  # not self: a model referring back to its backend
        for model in (self.target, getattr(self.drafter, "draft", None)):  # kept every engine's caches alive
            if model is not None:
                model.is_free = lambda slot: slot not in owners and slot not in retained

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots - 1  # the last slot is scratch space for padded batch rows

    def admit(self, row: Row) -> None:
        free = sorted(set(range(self.num_slots)) - set(self.slot_owner))
        slot = free[0] if self.prefix is None else self.prefix.claim_slot(row, free)
        self.slot_of[row.request_id], self.slot_owner[slot] = slot, row
        self.coupling.admit(row)

    def release(self, row: Row, finished: bool) -> None:
        slot = self.slot_of.pop(row.request_id, None)
        if slot is not None:
            del self.slot_owner[slot]
        if self.prefix is not None:
            if slot is not None and row.status is Status.COMPLETED:
                self.prefix.retain(row, slot)  # its prompt's KV stays valid in the slot until it is reused
            else:
                self.prefix.forget(row)
        self.drafter.forget(row)
        if finished:
            self.coupling.release(row)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        """Prefill pass (the draft cache alongside), drafting, one verify pass, the acceptance rule."""
        outcome = RoundOutcome()
        if self._warm_up is not None:
            started = time.perf_counter()
            self._warm_up()  # before any pass: no row has KV yet for it to overwrite
            self._warm_up = None
            outcome.warmup_ms = ms_since(started)
        if plan.reuse:
            started = time.perf_counter()
            self._copy_prefixes(plan)
            self._sync()
            outcome.reuse_ms = ms_since(started)
        self._arrange_slots(plan)
        if plan.prefill:
            started = time.perf_counter()
            for work in plan.prefill_pass_work():
                outcome.prefill_shapes.append(self._prefill(work))
            slots = self._slots([row for row, _ in plan.prefill])
            if plan.draft_prefill:
                self._sync()
                draft_started = time.perf_counter()
                outcome.num_draft_prefill_positions = self._draft_prefill(plan.prefill, slots)
                self._sync()
                outcome.draft_prefill_ms = ms_since(draft_started)
            self._sync()
            outcome.prefill_ms = ms_since(started)
        if plan.decode:
            decode = sorted(plan.decode, key=lambda item: self.slot_of[item[0].request_id])  # slots 0..D-1: a view
            rows, ks = [row for row, _ in decode], [k for _, k in decode]
            slots, starts = self._slots(rows), [plan.computed_after_prefill(row) for row in rows]
            alongside = outcome.num_draft_prefill_positions > 0  # this round's prefill filled the draft cache too
            draft_starts = [plan.draft_start(row, start, alongside) for row, start in zip(rows, starts, strict=True)]
            started = time.perf_counter()
            drafted_ks = [plan.drafted_k(row, k) for row, k in zip(rows, ks, strict=True)]
            proposals = outcome.proposals = self.drafter.propose(rows, drafted_ks, slots, draft_starts, self.coupling)
            self._sync()
            outcome.draft_ms = ms_since(started)
            if plan.probe is not None:
                proposals.withdraw(next(i for i, row in enumerate(rows) if row is plan.probe))
            started = time.perf_counter()
            chunks = [[row.last_token] + drafts for row, drafts in zip(rows, proposals.tokens, strict=True)]
            logits, outcome.verify_shape = self.target.forward(slots, starts, chunks)
            assert logits is not None
            self._observe(rows, starts, [len(chunk) for chunk in chunks])
            outcome.rows = self._accept(rows, ks, logits[..., : self.vocab_size], proposals)
            outcome.verify_ms = ms_since(started)
        return outcome

    def _copy_prefixes(self, plan: RoundPlan) -> None:
        """Copy each planned shared prefix into its row's slot, before any pass or slot move of the
        round: a kept slot handed to a new row this round still holds its prefix until then."""
        for copy in copy_order(plan.reuse):
            source, slot = self._copy_slots(copy)
            if source == slot:
                continue  # admitted into the slot that keeps its prefix
            self.cache.copy_slot(source, slot, copy.end, copy.start)
            if self.draft_cache is not None and copy.draft_end > copy.draft_start:
                self.draft_cache.copy_slot(source, slot, copy.draft_end, copy.draft_start)

    def _copy_slots(self, copy: PrefixCopy) -> tuple[int, int]:
        """A copy's source and destination slots."""
        holder = copy.holder
        source = holder.slot if isinstance(holder, RetainedPrefix) else self.slot_of[holder.request_id]
        return source, self.slot_of[copy.row.request_id]

    def _prefill(self, work: list[tuple[Row, int]]) -> PassShape:
        """One target prefill pass over these rows' chunks."""
        rows, starts = [row for row, _ in work], [row.num_computed for row, _ in work]
        chunks = [row.token_ids[row.num_computed : row.num_computed + size] for row, size in work]
        _, shape = self.target.forward(self._slots(rows), starts, chunks, keep_logits=False)
        self._observe(rows, starts, [len(chunk) for chunk in chunks])
        return shape

    def _slots(self, rows: list[Row]) -> list[int]:
        return [self.slot_of[row.request_id] for row in rows]

    def _draft_prefill(self, work: list[tuple[Row, int]], slots: list[int]) -> int:
        """Catch the draft cache up to the same end as the target's; returns the draft rows computed."""
        if not self.drafter.uses_model:
            return 0
        shape = self.drafter.prefill([row for row, _ in work], slots, [row.num_draft_computed for row, _ in work],
                                     [row.num_computed + size for row, size in work])
        return shape.num_real_positions if shape else 0

    def _observe(self, rows: list[Row], starts: list[int], lengths: list[int]) -> None:
        """Hand a drafter that drafts from the target's hidden states those of the pass just run."""
        if self.target.features is not None:
            self.drafter.observe(rows, starts, lengths, self.target.features)

    def _accept(self, rows: list[Row], ks: list[int], logits: torch.Tensor, proposals: Proposals
                ) -> list[RowOutcome]:
        """The acceptance rule per row over the verify logits [rows, query_len, vocab]."""
        argmax = logits.argmax(dim=-1).tolist()  # [rows, query_len]
        self._sync()
        outcomes = []
        for index, (row, k) in enumerate(zip(rows, ks, strict=True)):
            drafts = proposals.tokens[index]
            if row.params.is_greedy:
                num_accepted, token = accept_greedy(drafts, argmax[index][: len(drafts) + 1])
            else:
                num_accepted, token = self.coupling.verify(row, drafts, proposals.draft_probs[index],
                                                           logits[index, : len(drafts) + 1])
            kept = proposals.num_kept[index] if proposals.num_kept else None
            outcomes.append(RowOutcome(row, k, drafts, num_accepted, drafts[:num_accepted] + [token],
                                       proposals.num_fed[index], kept))
        return outcomes

    def _arrange_slots(self, plan: RoundPlan) -> None:
        """Keep decode rows in slots 0..D-1 so the verify pass reads a view of the cache instead of
        gathering it, those whose prefill completes this round last (D-c..D-1, in prefill-pass
        order), and the rows that only prefill right after them, pass after pass, so each prefill
        pass reads a view too: a pass of 16 rows x 19 tokens after a 562-token shared prefix took
        45 ms from contiguous slots and 93 ms gathered. Only rows out of place move (one row's valid
        KV each), swapping with what is there. Rows in the slots the verify pass pads into
        (D..bucket-1) move up to free slots where there are any, so padded rows keep the view."""
        decoding = {id(row) for row, _ in plan.decode}
        prefilling = [row for work in plan.prefill_pass_work() for row, _ in work]
        completing = [row for row in prefilling if id(row) in decoding]
        first_completing = len(plan.decode) - len(completing)
        for slot, row in enumerate(completing, start=first_completing):
            if self.slot_of[row.request_id] != slot:
                self._move(row, slot)
        placed = {id(row) for row in completing}
        staying = [row for row, _ in plan.decode if id(row) not in placed]
        held = {self.slot_of[row.request_id] for row in staying}
        holes = [slot for slot in range(first_completing) if slot not in held]
        movers = [row for row in staying if self.slot_of[row.request_id] >= first_completing]
        for row, hole in zip(movers, holes, strict=True):
            self._move(row, hole)
        slot = self._clear_decode_padding(len(plan.decode))
        for row in (row for row in prefilling if id(row) not in decoding):
            if slot >= self.num_slots:  # the decode batch's padding took the rest: these gather
                break
            if self.slot_of[row.request_id] != slot:
                self._move(row, slot)
            slot += 1

    def _clear_decode_padding(self, num_decode_rows: int) -> int:
        """Free the slots the verify pass pads into (rows there move up to free slots, kept prefixes
        there are dropped); returns the first slot after them."""
        if not num_decode_rows or not self.target.pad_decode:
            return num_decode_rows
        padded_end = self.target.buckets.fit(num_decode_rows, 1).batch_rows
        if self.prefix is not None:
            for slot in range(num_decode_rows, padded_end):
                self.prefix.evict_slot(slot)  # padded rows write there: the verify pass keeps its view
        free_above = [slot for slot in range(padded_end, self.num_slots) if slot not in self.slot_owner]
        in_the_way = [self.slot_owner[slot] for slot in range(num_decode_rows, padded_end) if slot in self.slot_owner]
        for row, free in zip(in_the_way, free_above, strict=False):
            self._move(row, free)
        return padded_end

    def _move(self, row: Row, slot: int) -> None:
        """Move `row` into `slot`, swapping with its occupant if there is one."""
        source = self.slot_of[row.request_id]
        occupant = self.slot_owner.get(slot)
        length = max(row.num_computed, row.num_draft_computed, 1)
        caches = [self.cache] + ([self.draft_cache] if self.draft_cache is not None else [])
        if self.prefix is not None and occupant is None:
            self.prefix.evict_slot(slot)
        if occupant is not None:
            length = max(length, occupant.num_computed, occupant.num_draft_computed)
            for cache in caches:
                cache.swap_slots(source, slot, length)
            self.slot_of[occupant.request_id], self.slot_owner[source] = source, occupant
        else:
            for cache in caches:
                cache.copy_slot(source, slot, length)
            del self.slot_owner[source]
        self.slot_of[row.request_id], self.slot_owner[slot] = slot, row
