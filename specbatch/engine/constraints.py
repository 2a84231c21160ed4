"""Structured output under speculation (issue 42): grammar masks for drafts and verify positions.

The law sampled is the target's per-step masked, renormalised distribution (what vLLM and SGLang
sample): at output position t, p_t ∝ p(· | history) · 1[token allowed by the grammar after the
committed tokens]. Speculation keeps it exact:

- Each constrained row has an llguidance matcher advanced only by *committed* tokens (`begin` syncs
  it from the row's output, so a stop, a preemption or a resume needs nothing else); drafting and
  the mask walk consume drafts speculatively and roll them back.
- A drafter that samples (draft model, EAGLE) draws from its own masked law: `MaskedCoupling` masks
  its logits at each draft step, so q is masked and the acceptance ratio p/q is the masked pair's.
- A draft the grammar rejects (a point-mass drafter's n-gram, anything past EOS) is cut before the
  verify pass (`cut`). For a point mass x with p(x) = 0 the rule would reject x with probability 1
  and resample from norm(max(0, p − δx)) = p: cutting it and sampling p there is the same law. A
  sampled draft from a masked q is never invalid except after EOS, whose successors are discarded
  by the stop rule anyway. So cutting never biases.
- The verify pass gets a mask for every position of a row (k + 1), computed by llguidance's thread
  pool on a worker thread while the pass runs (`start_masks`), applied in place on its logits.

Greedy rows: the target's argmax over masked logits, the same as decoding alone under the masks.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import llguidance
import llguidance.torch
import torch

from specbatch.core import Proposals, RoundOutcome, Row
from specbatch.data.constraints import Constraint, llguidance_tokenizer
from specbatch.engine.coupling import Coupling
from specbatch.records import ms_since

MAX_CACHED_CONSTRAINTS = 256  # compiled constraints kept per worker (LRU); a fresh matcher is a deep copy


class ConstraintFault(ValueError):
    """A row's constraint failed in the engine (does not compile here, or a committed token left it):
    a request's fault, so the engine drops that row alone (`isolation.is_request_fault`)."""


@dataclass
class _RowGrammar:
    matcher: Any  # llguidance.LLMatcher at the row's committed output, plus `num_speculative` tokens; None: error
    error: str | None = None  # why the constraint did not compile here (raised in the row's first round)
    num_consumed: int = 0  # committed output tokens the matcher has consumed
    num_speculative: int = 0  # drafts consumed this round, rolled back before the next


@dataclass
class _MaskJob:
    future: Future[tuple[torch.Tensor, float]]  # the bitmask [len(positions), words] and the ms its fill took
    positions: list[int]  # the verify logits' rows (flat positions) the bitmask's rows mask, in order


class GrammarRuntime:
    """One worker's constraints: the llguidance tokenizer, compiled constraints (LRU), row matchers."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_id: int, num_threads: int = 2,
                 max_cached: int = MAX_CACHED_CONSTRAINTS) -> None:
        self.hf_tokenizer, self.num_threads = hf_tokenizer, num_threads
        self.vocab_size, self.eos_token_id, self.max_cached = vocab_size, eos_token_id, max_cached
        self.compiled: OrderedDict[str, Any] = OrderedDict()  # constraint JSON -> a fresh matcher
        self.rows: dict[str, _RowGrammar] = {}
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")  # starts on first use
        self.num_compiled = 0

    @cached_property
    def tokenizer(self) -> Any:
        """llguidance's view of the vocabulary, built on the first constrained row (~0.3 s for 49k tokens)."""
        return llguidance_tokenizer(self.hf_tokenizer, self.vocab_size, self.eos_token_id)

    @cached_property
    def executor(self) -> Any:
        return llguidance.LLExecutor(self.num_threads)

    # rows --------------------------------------------------------------------------------------
    def admit(self, row: Row) -> None:
        """Give a constrained row a matcher at the start of its output (`begin` replays what it has)."""
        if row.params.constraint is None or row.request_id in self.rows:
            return
        try:
            self.rows[row.request_id] = _RowGrammar(self._fresh_matcher(row.params.constraint))
        except ConstraintFault as fault:  # raised inside execute, where the engine drops the row alone
            self.rows[row.request_id] = _RowGrammar(None, str(fault))

    def release(self, row: Row) -> None:
        self.rows.pop(row.request_id, None)

    def begin(self, rows: list[Row]) -> None:
        """Before drafting: each constrained row's matcher at exactly its committed output."""
        for row in rows:
            state = self.rows.get(row.request_id)
            if state is None:
                continue
            if state.error is not None:
                raise ConstraintFault(state.error)
            self._rollback(state)
            new = row.output_ids[state.num_consumed :]
            if new and not state.matcher.consume_tokens(new):
                raise ConstraintFault(f"committed tokens left the constraint: {state.matcher.get_error()}")
            state.num_consumed += len(new)

    # drafting ----------------------------------------------------------------------------------
    def draft_mask(self, row: Row, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [vocab] masked at the row's speculative state (its drafts so far this round).
        Where the drafter gives every allowed token -inf (an EAGLE head's reduced vocabulary may lack
        them), the allowed tokens get equal logits: whatever law it draws from, q is that law."""
        state = self.rows[row.request_id]
        bitmask = self._bitmask(1)
        llguidance.torch.fill_next_token_bitmask(state.matcher, bitmask, 0)
        self._allow_eos_after_stop(bitmask)
        bitmask = bitmask.to(logits.device)
        masked = apply_bitmask(logits[None], bitmask)[0]
        if bool(torch.isneginf(masked).all()):
            masked = apply_bitmask(torch.zeros_like(logits)[None], bitmask)[0]
        return masked

    def consume_draft(self, row: Row, token: int) -> None:
        """Advance the row's speculative state by a draft (one outside the grammar is not consumed:
        `cut` removes it and what follows)."""
        state = self.rows[row.request_id]
        if not state.matcher.is_stopped() and state.matcher.try_consume_tokens([token]) == 1:
            state.num_speculative += 1

    def forced_tokens(self, row: Row, k: int) -> list[int]:
        """Up to k tokens the grammar forces next (a single continuation), at the committed state."""
        state = self.rows.get(row.request_id)
        if state is None or k <= 0 or state.matcher.is_stopped():
            return []
        return list(state.matcher.compute_ff_tokens()[:k])

    def cut(self, rows: list[Row], proposals: Proposals) -> None:
        """Cut each constrained row's drafts at the first one the grammar rejects (or after a stop)."""
        for index, row in enumerate(rows):
            state = self.rows.get(row.request_id)
            drafts = proposals.tokens[index]
            if state is None or not drafts:
                continue
            self._rollback(state)
            num_valid = state.matcher.validate_tokens(drafts)
            if num_valid < len(drafts):
                proposals.tokens[index] = drafts[:num_valid]
                probs = proposals.draft_probs[index]
                proposals.draft_probs[index] = probs[:num_valid] if probs is not None and num_valid else None

    # verify masks ------------------------------------------------------------------------------
    def start_masks(self, rows: list[Row], drafts: list[list[int]]) -> _MaskJob | None:
        """Masks for every verify position of the constrained rows, computed on a worker thread
        (llguidance's pool, the GIL released) while the verify pass runs; None if no row is constrained.
        Row r's window in the verify logits is its pending token and its drafts: 1 + len(drafts[r])."""
        offsets = [0]
        for tokens in drafts:
            offsets.append(offsets[-1] + 1 + len(tokens))
        indices = [index for index, row in enumerate(rows) if row.request_id in self.rows]
        if not indices:
            return None
        work: list[tuple[Any, list[int]]] = []
        positions: list[int] = []
        for index in indices:
            state = self.rows[rows[index].request_id]
            self._rollback(state)
            work.append((state.matcher, drafts[index]))
            positions.extend(range(offsets[index], offsets[index + 1]))
        return _MaskJob(self.thread.submit(self._fill, work), positions)

    def _fill(self, work: list[tuple[Any, list[int]]]) -> tuple[torch.Tensor, float]:
        """bitmask [Σ (1 + len(drafts)), words]: each row's positions in turn, position j masking the
        token after its j-th draft; and the fill's ms."""
        started = time.perf_counter()
        firsts = [0]
        for _, tokens in work:
            firsts.append(firsts[-1] + 1 + len(tokens))
        bitmask = self._bitmask(firsts[-1])
        rows = list(zip(work, firsts[:-1], strict=True))
        with_drafts = [(matcher, first, tokens) for (matcher, tokens), first in rows if tokens]
        plain = [(matcher, first) for (matcher, tokens), first in rows if not tokens]
        if with_drafts:
            llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(self.executor, with_drafts, bitmask)
        if plain:
            llguidance.torch.fill_next_token_bitmask_par(self.executor, plain, bitmask)
        self._refuse_unconsumable_specials(work, firsts, bitmask)
        self._allow_eos_after_stop(bitmask)
        return bitmask, ms_since(started)

    def _refuse_unconsumable_specials(self, work: list[tuple[Any, list[int]]], firsts: list[int],
                                      bitmask: torch.Tensor) -> None:
        """llguidance reads forced text with the tokenizer, which takes a special token's literal
        (`<|endoftext|>` in a regex, a schema's key) for that token: its mask there admits that token
        alone, which its matcher then refuses (EOS ended the answer, invalid, as `eos`; another special
        token failed the row). A special token the matcher refuses at a position leaves its mask; a
        position left with none gets the forced text's first token read without special tokens.
        bitmask: [positions, words]; row r's positions start at firsts[r]."""
        words, shifts = self._special_bits
        hits = ((bitmask[:, words] >> shifts) & 1).nonzero().tolist()  # [[position, index of the id]]
        for position, index in hits:
            row = bisect.bisect_right(firsts, position) - 1
            matcher, drafts = work[row]
            prefix, token = drafts[: position - firsts[row]], self.special_ids[index]
            if matcher.validate_tokens([*prefix, token]) == len(prefix) + 1:
                continue
            bitmask[position, token // 32] &= ~_bit(token)
            if not bool(bitmask[position].any()):
                self._allow_forced_text(matcher, prefix, bitmask[position])

    def _allow_forced_text(self, matcher: Any, prefix: list[int], mask: torch.Tensor) -> None:
        """Into mask [words]: the first token of the text the grammar forces after `prefix`, tokenized
        with special tokens' literals read as text, if the matcher takes it."""
        num_consumed = matcher.try_consume_tokens(prefix)
        forced = matcher.compute_ff_bytes() if num_consumed == len(prefix) else b""
        if num_consumed:
            matcher.rollback(num_consumed)
        text = forced.decode("utf-8", errors="ignore")
        tokens = self.hf_tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)[:1] if text else []
        if tokens and tokens[0] < self.vocab_size and matcher.validate_tokens([*prefix, *tokens]) == len(prefix) + 1:
            mask[tokens[0] // 32] |= _bit(tokens[0])

    @cached_property
    def _special_bits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each special id's bitmask word and bit, built once rather than at every mask fill."""
        ids = torch.tensor(self.special_ids, dtype=torch.int32)
        return ids // 32, ids % 32

    @cached_property
    def special_ids(self) -> list[int]:
        """The tokenizer's special token ids (EOS among them) inside the vocabulary."""
        ids = {*getattr(self.hf_tokenizer, "all_special_ids", []), self.eos_token_id}
        return sorted(int(token) for token in ids if 0 <= token < self.vocab_size)

    def _allow_eos_after_stop(self, bitmask: torch.Tensor) -> None:
        """A position after the grammar stopped (past an accepted EOS) has no allowed token; its
        token is discarded by the stop rule, so it gets EOS rather than an empty (NaN) law.
        bitmask: [positions, words]."""
        empty = (bitmask == 0).all(dim=-1)  # [positions]
        if bool(empty.any()):
            bitmask[empty, self.eos_token_id // 32] = _bit(self.eos_token_id)

    def apply_masks(self, job: _MaskJob | None, logits: torch.Tensor, outcome: RoundOutcome) -> None:
        """Wait for the masks and apply them in place on the verify logits [Σ windows, vocab] (every
        constrained row's positions at once: one gather, one fill, one scatter). Into the outcome:
        `mask_ms`, the fill's time (beside the pass), and `mask_wait_ms`, the wait and the applying."""
        if job is None:
            return
        started = time.perf_counter()
        bitmask, outcome.mask_ms = job.future.result()
        positions = torch.tensor(job.positions, device=logits.device)
        logits[positions] = apply_bitmask(logits[positions], bitmask.to(logits.device, non_blocking=True))
        outcome.mask_wait_ms = ms_since(started)

    @staticmethod
    def count_forced(outcome: RoundOutcome, proposals: Proposals) -> None:
        """Forced drafts proposed and accepted this round, into the outcome (for the ledger)."""
        for row_outcome, num_forced in zip(outcome.rows, proposals.num_forced, strict=False):
            num_forced = min(num_forced, len(row_outcome.proposed))  # a probe's drafts are withdrawn
            outcome.num_forced_proposed += num_forced
            outcome.num_forced_accepted += min(num_forced, row_outcome.num_accepted)

    # internals ---------------------------------------------------------------------------------
    def _bitmask(self, num_positions: int) -> torch.Tensor:
        """An all-allowed bitmask [num_positions, words] (int32; llguidance's layout). Not its
        allocate_token_bitmask, which pins the memory wherever CUDA exists: a page-locked allocation
        per draft step for a mask the CPU fills and reads."""
        return torch.full((num_positions, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    def _rollback(self, state: _RowGrammar) -> None:
        if state.num_speculative:
            state.matcher.rollback(state.num_speculative)
            state.num_speculative = 0

    def _fresh_matcher(self, constraint_json: str) -> Any:
        template = self.compiled.get(constraint_json)
        if template is None:
            template = llguidance.LLMatcher(self.tokenizer, Constraint.from_json(constraint_json).grammar(),
                                            log_level=0)
            if template.is_error():
                raise ConstraintFault(f"invalid_constraint: {template.get_error()}")
            self.num_compiled += 1
            self.compiled[constraint_json] = template
            if len(self.compiled) > self.max_cached:
                self.compiled.popitem(last=False)
        else:
            self.compiled.move_to_end(constraint_json)
        return template.deep_copy()

    def close(self) -> None:
        self.thread.shutdown(wait=True)


def _bit(token: int) -> int:
    """Token's bit in its int32 bitmask word (bit 31 is the sign)."""
    bit = token % 32
    return 1 << bit if bit < 31 else -(1 << 31)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [n, vocab] with -inf where bitmask [n, words] (int32, bit b of word w = token 32w + b)
    disallows; the vocabulary past the bitmask's words is disallowed too."""
    vocab = logits.shape[-1]
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask[..., None] >> shifts) & 1).bool().flatten(-2)  # [n, words * 32]
    if allowed.shape[-1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]))
    return logits.masked_fill(~allowed[..., :vocab], float("-inf"))


class MaskedCoupling:
    """A drafter's view of the coupling under constraints: a constrained row's draft logits are
    masked at its speculative grammar state before the draw (greedy: the masked argmax), so q is
    the drafter's masked law; the drawn token advances the state. Other rows pass through."""

    def __init__(self, base: Coupling, grammar: GrammarRuntime) -> None:
        self.base, self.grammar = base, grammar

    def constrains(self, row: Row) -> bool:
        return row.request_id in self.grammar.rows

    def admit(self, row: Row) -> None:
        self.base.admit(row)

    def release(self, row: Row) -> None:
        self.base.release(row)

    def draft(self, row: Row, position: int, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        if not self.constrains(row):
            return self.base.draft(row, position, logits)
        masked = self.grammar.draft_mask(row, logits)
        if row.params.is_greedy:
            token, q = int(masked.argmax()), None
        else:
            token, q = self.base.draft(row, position, masked)
        self.grammar.consume_draft(row, token)
        return token, q

    def verify(self, row: Row, drafts: list[int], draft_probs: torch.Tensor | None,
               logits: torch.Tensor) -> tuple[int, int]:
        return self.base.verify(row, drafts, draft_probs, logits)
