"""HFBackend: the only code that runs models. It executes a round plan: drafting, one flat target
pass (prefill chunks and verify windows together), and the acceptance rule. It reads the rows'
block tables from the scheduler's `KVBlocks` and owns the rows' lanes and random streams; it never
writes a row: committing tokens, KV validity and counters is the scheduler's commit step
(`sched/commit.py`), from the `RoundOutcome` returned here."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specbatch.core import PassShape, Proposals, RoundOutcome, RoundPlan, Row, RowOutcome
from specbatch.engine.argmax import greedy_tokens
from specbatch.engine.constraints import GrammarRuntime, MaskedCoupling
from specbatch.engine.coupling import Coupling
from specbatch.engine.drafters import Drafter
from specbatch.engine.forward import PagedModel, RowCache
from specbatch.engine.sampling import accept_greedy
from specbatch.records import ms_since
from specbatch.sched.kv_blocks import KVBlocks


class HFBackend:
    def __init__(self, target: PagedModel, drafter: Drafter, vocab_size: int, coupling: Coupling,
                 num_lanes: int, warm_up: Callable[[], None] | None = None,
                 grammar: GrammarRuntime | None = None) -> None:
        self.target, self.drafter = target, drafter
        self.grammar = grammar  # structured output: masks drafts and verify logits (engine/constraints.py)
        self.draft_coupling = coupling if grammar is None else MaskedCoupling(coupling, grammar)
        self._warm_up = warm_up  # compiles graphs; runs before the first round's passes, then never
        self.vocab_size, self.coupling = vocab_size, coupling
        self.kv: KVBlocks | None = None  # the scheduler's block tables (`use_kv_blocks`)
        self.lane_of: dict[str, int] = {}  # request id -> lane
        self.free_lanes = list(range(num_lanes))
        self._sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)

    def use_kv_blocks(self, kv: KVBlocks) -> None:
        """Read the rows' block tables from the scheduler's allocator."""
        self.kv = kv

    def admit(self, row: Row) -> None:
        self.lane_of[row.request_id] = self.free_lanes.pop(0)
        self.coupling.admit(row)
        if self.grammar is not None:
            self.grammar.admit(row)

    def release(self, row: Row, finished: bool) -> None:
        lane = self.lane_of.pop(row.request_id, None)
        if lane is not None:
            self.free_lanes.append(lane)
            self.free_lanes.sort()
        self.drafter.forget(row)
        if self.grammar is not None:
            self.grammar.release(row)  # a re-admitted row replays its output into a fresh matcher
        if finished:
            self.coupling.release(row)

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        """Draft-cache prefill, drafting, then one target pass over every row's new tokens (with a
        drafter that reads the target's features, the prefill chunks first in a pass of their own)."""
        outcome = RoundOutcome()
        if self._warm_up is not None:
            started = time.perf_counter()
            self._warm_up()
            self._warm_up = None
            outcome.warmup_ms = ms_since(started)
        prefill_first = bool(plan.prefill) and self.target.feature_layers != ()
        if prefill_first:
            started = time.perf_counter()
            outcome.prefill_shapes.append(self._prefill(plan.prefill))
            outcome.num_target_passes += 1
            self._sync()
            outcome.prefill_ms = ms_since(started)
        if plan.prefill and plan.draft_prefill:
            started = time.perf_counter()
            outcome.num_draft_prefill_positions = self._draft_prefill(plan.prefill)
            self._sync()
            outcome.draft_prefill_ms = ms_since(started)
            outcome.prefill_ms += outcome.draft_prefill_ms
        rows = [row for row, _ in plan.decode]
        ks = [k for _, k in plan.decode]
        starts = [plan.computed_after_prefill(row) for row in rows]
        proposals = Proposals([], [])
        if rows:
            alongside = outcome.num_draft_prefill_positions > 0  # this round's prefill filled the draft cache too
            draft_starts = [plan.draft_start(row, start, alongside) for row, start in zip(rows, starts, strict=True)]
            started = time.perf_counter()
            drafted_ks = [plan.drafted_k(row, k) for row, k in zip(rows, ks, strict=True)]
            if self.grammar is not None:
                self.grammar.begin(rows)  # matchers at the committed outputs
            proposals = outcome.proposals = self.drafter.propose(rows, drafted_ks, self.caches(rows), draft_starts,
                                                                 self.draft_coupling)
            self._sync()
            outcome.draft_ms = ms_since(started)  # a lookup's host time too (a suffix drafter's indexing)
            if plan.probe is not None:
                proposals.withdraw(next(i for i, row in enumerate(rows) if row is plan.probe))
            if self.grammar is not None:
                self.grammar.cut(rows, proposals)  # drafts the grammar rejects are never verified
        if rows or (plan.prefill and not prefill_first):
            self._target_pass(plan, rows, ks, starts, proposals, outcome, with_prefill=not prefill_first)
        return outcome

    def caches(self, rows: list[Row]) -> list[RowCache]:
        assert self.kv is not None, "use_kv_blocks() comes before a round"
        return [RowCache(self.kv.table(row.request_id), self.lane_of[row.request_id]) for row in rows]

    def _tables(self, rows: list[Row]) -> list[list[int]]:
        assert self.kv is not None, "use_kv_blocks() comes before a round"
        return [self.kv.table(row.request_id) for row in rows]

    def _target_pass(self, plan: RoundPlan, rows: list[Row], ks: list[int], starts: list[int],
                     proposals: Proposals, outcome: RoundOutcome, with_prefill: bool) -> None:
        """One flat pass: prefill-only rows' chunks, then each verifying row's prefill chunk (if its
        prefill completes this round), pending token and drafts; logits only at verify positions."""
        started = time.perf_counter()
        verifying = {id(row) for row in rows}
        prefill = plan.prefill if with_prefill else []
        sizes = {id(row): size for row, size in prefill}
        only_prefill = [(row, size) for row, size in prefill if id(row) not in verifying]
        pass_rows = [row for row, _ in only_prefill] + rows
        pass_starts = [row.num_computed for row, _ in only_prefill] + [start - sizes.get(id(row), 0)
                                                                       for row, start in zip(rows, starts, strict=True)]
        windows = [[row.last_token] + drafts for row, drafts in zip(rows, proposals.tokens, strict=True)]
        chunks = [row.token_ids[row.num_computed : row.num_computed + size] for row, size in only_prefill]
        chunks += [row.token_ids[start - sizes.get(id(row), 0) : start] + window
                   for row, start, window in zip(rows, starts, windows, strict=True)]
        keep = self._verify_positions(chunks[len(only_prefill):], windows, sum(map(len, chunks[: len(only_prefill)])))
        masks = self.grammar.start_masks(rows, proposals.tokens) if self.grammar is not None else None
        logits, shape = self.target.forward(self._tables(pass_rows), pass_starts, chunks, keep_logits=bool(rows),
                                            keep=keep)
        outcome.num_target_passes += 1
        self._observe(pass_rows, pass_starts, [len(chunk) for chunk in chunks])
        num_prefill = sum(size for _, size in prefill)
        if rows:
            assert logits is not None
            if self.grammar is not None:  # masks computed beside the pass, applied in place
                self.grammar.apply_masks(masks, logits[:, : self.vocab_size], outcome)
            outcome.rows = self._accept(rows, ks, logits[:, : self.vocab_size], windows, proposals)
            if self.grammar is not None:
                self.grammar.count_forced(outcome, proposals)
        self._sync()
        elapsed = ms_since(started)
        # one pass computed both: its time is split by positions (the cost model learns per position)
        share = num_prefill / max(shape.num_real_positions, 1)
        outcome.prefill_ms += elapsed * share
        outcome.verify_ms = elapsed - elapsed * share
        if num_prefill:
            outcome.prefill_shapes.append(PassShape.flat([row.num_computed for row, _ in prefill],
                                                     [size for _, size in prefill]))
        if rows:
            outcome.verify_shape = PassShape.flat(starts, [len(window) for window in windows])

    @staticmethod
    def _verify_positions(chunks: list[list[int]], windows: list[list[int]], offset: int) -> list[int]:
        """Flat indices of the verify windows' positions in a pass whose verifying rows start at `offset`."""
        keep: list[int] = []
        for chunk, window in zip(chunks, windows, strict=True):
            first = offset + len(chunk) - len(window)
            keep.extend(range(first, first + len(window)))
            offset += len(chunk)
        return keep

    def _prefill(self, work: list[tuple[Row, int]]) -> PassShape:
        """One target pass over these rows' prefill chunks alone (for a drafter reading its features)."""
        rows, starts = [row for row, _ in work], [row.num_computed for row, _ in work]
        chunks = [row.token_ids[row.num_computed : row.num_computed + size] for row, size in work]
        _, shape = self.target.forward(self._tables(rows), starts, chunks, keep_logits=False)
        self._observe(rows, starts, [len(chunk) for chunk in chunks])
        return shape

    def _draft_prefill(self, work: list[tuple[Row, int]]) -> int:
        """Fill the draft cache alongside the target's, to the same end, for the rows whose draft cache
        is current (`Row.draft_is_current`); returns the draft rows computed."""
        work = [(row, size) for row, size in work if row.draft_is_current]
        if not self.drafter.uses_model or not work:
            return 0
        rows = [row for row, _ in work]
        shape = self.drafter.prefill(rows, self.caches(rows), [row.num_draft_computed for row, _ in work],
                                     [row.num_computed + size for row, size in work])
        return shape.num_real_positions if shape else 0

    def _observe(self, rows: list[Row], starts: list[int], lengths: list[int]) -> None:
        """Hand a drafter that drafts from the target's hidden states those of the pass just run."""
        if self.target.features is not None:
            self.drafter.observe(rows, starts, lengths, self.target.features)

    def _accept(self, rows: list[Row], ks: list[int], logits: torch.Tensor, windows: list[list[int]],
                proposals: Proposals) -> list[RowOutcome]:
        """The acceptance rule per row over the verify logits [Σ window, vocab], rows in order."""
        argmax = greedy_tokens(logits)  # [Σ window]
        self._sync()
        outcomes, offset = [], 0
        for index, (row, k) in enumerate(zip(rows, ks, strict=True)):
            drafts, width = proposals.tokens[index], len(windows[index])
            if row.params.is_greedy:
                num_accepted, token = accept_greedy(drafts, argmax[offset : offset + width])
            else:
                num_accepted, token = self.coupling.verify(row, drafts, proposals.draft_probs[index],
                                                           logits[offset : offset + width])
            offset += width
            kept = proposals.num_kept[index] if proposals.num_kept else None
            indexed = proposals.indexed_to[index] if proposals.indexed_to else 0
            outcomes.append(RowOutcome(row, k, drafts, num_accepted, drafts[:num_accepted] + [token],
                                       proposals.num_fed[index], kept, indexed))
        return outcomes


