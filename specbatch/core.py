"""The plain types every part shares, and no torch: a request's state in the engine (`Row`), its
sampling parameters, a round's plan and outcome, the shape of a pass, and the `Backend` protocol
that both the Hugging Face backend and the simulator implement.

Scheduling model (as in vLLM v1): a request has `num_tokens` (prompt + output) and
`num_computed` (tokens whose target KV exists). Prefill is simply `num_computed < num_tokens - 1`;
the last committed token is the *pending token*, which every verify row starts with.

Only the scheduler's commit step (`sched/commit.py`) and its admission/preemption write a `Row`;
a backend reads rows and returns what it computed as a `RoundOutcome`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from functools import cached_property
from typing import Any, Protocol


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    COMPLETED = "completed"
    DROPPED = "dropped"
    CANCELLED = "cancelled"


# Temperatures below this are greedy (vLLM's _SAMPLING_EPS too). Dividing logits by T overflowed
# (1e-308 gives inf, then NaN probabilities); at T >= 1e-5 a logit / T stays finite even in float32
# for any logit below 3e33. Below it sampling differs from argmax only between logits closer than
# 745 * T ~ 7e-3 (exp underflows in float64), finer than bfloat16 resolves a logit of magnitude >= 1.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # below GREEDY_TEMPERATURE (0 included) means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # structured output: a `data.constraints.Constraint` as JSON (engine/constraints.py masks the law)
    constraint: str | None = None

    @property
    def is_greedy(self) -> bool:
        """Below `GREEDY_TEMPERATURE` sampling is greedy: every path (drafting, verify, `warp`'s
        callers) asks here, so no path divides logits by a temperature that overflows them."""
        return self.temperature < GREEDY_TEMPERATURE


@dataclass
class Row:
    """One request in the engine: its tokens, how far its KV is computed, status and raw counters.
    `token_ids` is one list, the prompt then the output as it is committed; `prompt_ids` and
    `output_ids` are copies cut from it, for readers off the per-round paths."""

    request_id: str
    prompt: InitVar[Sequence[int]]  # the prompt's token ids
    params: SamplingParams
    domain: str = ""
    arrival_s: float = 0.0
    status: Status = Status.WAITING
    output: InitVar[Sequence[int]] = ()  # output token ids it already has (tests, benchmarks)
    # prompt then output tokens, one list that the commit step appends to (`sched/stops.py`)
    token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_computed: int = 0  # target KV positions that hold valid entries
    num_draft_computed: int = 0  # draft-model KV positions that hold valid entries
    num_indexed: int = 0  # of its tokens, those its suffix drafter's own index holds (a lookup's catch-up)
    finish_reason: str | None = None
    drop_reason: str | None = None
    drop_message: str | None = None
    metadata: str | None = None  # the input record's unknown fields (JSON), passed through to results
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    # counters, summed over rounds
    num_rounds: int = 0
    num_target_positions: int = 0
    num_draft_positions: int = 0
    num_proposed: int = 0
    num_accepted: int = 0
    num_preemptions: int = 0
    num_reused_tokens: int = 0  # prompt positions whose KV was copied from a shared prefix, not computed
    # acceptance history: accepted prefix length and planned k of each speculative round (drafts planned but
    # not proposed, a lookup's match running out, end the run as a rejection does)
    accept_history: list[tuple[int, int]] = field(default_factory=list)
    last_k: int = 0
    # the drafter of the row's drafts this round, where a job has several (`drafter.kind`: the scheduler
    # picks per row, `sched/drafter_choice.py`); "" : the job's only drafter
    drafter: str = ""

    def __post_init__(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        self.token_ids = [*prompt, *output]
        self.num_prompt_tokens = len(prompt)

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_prefill_remaining(self) -> int:
        """Tokens before the pending token whose target KV is still missing."""
        return max(0, self.num_tokens - 1 - self.num_computed)

    @property
    def is_decoding(self) -> bool:
        """No prefill remains (`num_prefill_remaining` == 0), read without it: a plan asks every
        running row, ~250 times a plan at batch 128."""
        return self.num_computed >= len(self.token_ids) - 1

    @property
    def draft_is_current(self) -> bool:
        """Its draft cache reaches as far as its target cache, so a prefill can fill both alongside. A
        row whose shared blocks came without draft KV, or that prefilled while nothing drafted, lags
        instead: it catches up only if it drafts with the model, a choice the policies price by its lag."""
        return self.num_draft_computed >= self.num_computed

    @property
    def num_new_tokens_left(self) -> int:
        return self.params.max_new_tokens - len(self.token_ids) + self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status in (Status.COMPLETED, Status.DROPPED, Status.CANCELLED)


@dataclass
class RoundPlan:
    """The scheduler's output for one round: what the backend executes."""

    prefill: list[tuple[Row, int]] = field(default_factory=list)  # (row, chunk tokens)
    decode: list[tuple[Row, int]] = field(default_factory=list)  # (row, lookahead k)
    plan_ms: float = 0.0  # the scheduler's own time for this plan (policies included)
    # fill the draft cache alongside the prefill chunks of the rows whose draft cache is current
    # (`Row.draft_is_current`); off while no row drafts, so a drafter that does not pay costs no prefill
    # (a row that drafts later catches up: its lag, which policies count)
    draft_prefill: bool = True
    # a decode row (k = 0) for which the draft model drafts one token that is not verified: it times a
    # draft pass while nothing drafts (the round-time model must learn what drafting costs) without
    # padding every row's verify to 2 positions, as a verified k = 1 would
    probe: Row | None = None
    # prompt positions rows took from shared blocks this round (admitted onto them or caught up to them)
    num_reused_tokens: int = 0
    # what the round-time model says of the decode rows (`sched/pass_profile.py`, issue 43): their time
    # at k = 0, at the planned ks, and the speedup the rows' measured α allowed at the best largest k
    plain_ms: float = 0.0
    predicted_ms: float = 0.0
    limit_speedup: float = 1.0

    def drafted_k(self, row: Row, k: int) -> int:
        """Tokens the drafter drafts for a decode row planned at k: 1 for the probe, else k."""
        return 1 if row is self.probe else k

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def num_target_positions(self) -> int:
        return sum(size for _, size in self.prefill) + sum(1 + k for _, k in self.decode)

    @staticmethod
    def draft_start(row: Row, start: int, alongside: bool) -> int:
        """Where a decode row's draft cache ends before this round's drafting (its tokens from there are
        fed to the drafter): at `start` (`computed_after_prefill`) for a row prefilled this round whose
        draft cache the prefill filled `alongside` (it was current), else where the row's draft cache
        ended. The one rule both backends and the commit step read."""
        filled = alongside and row.num_computed < start and row.draft_is_current
        return start if filled else row.num_draft_computed

    def computed_after_prefill(self, row: Row) -> int:
        """Target KV positions `row` holds once this round's prefill pass ran: where its verify
        positions start (a row whose prefill completes verifies in the same round). Read by the
        backends once the plan is final."""
        return row.num_computed + self._prefill_sizes.get(id(row), 0)

    @cached_property
    def _prefill_sizes(self) -> dict[int, int]:
        return {id(row): size for row, size in self.prefill}


@dataclass(frozen=True)
class KVUse:
    """The KV blocks after one round, for the ledger (`sched/kv_blocks.py`): in use (a shared one
    once), shared by several rows, cached for later rows, evicted since the last round, and the
    block-table entries pointing at them (what the rows would hold, each with its own copy)."""

    num_in_use: int = 0
    num_shared: int = 0
    num_cached: int = 0
    num_evicted: int = 0
    num_referenced: int = 0


@dataclass(frozen=True)
class PassShape:
    """One forward pass as computed: real rows and positions, and the bucket it was padded to."""

    num_rows: int  # real rows
    num_bucket_rows: int  # rows after batch padding
    query_len: int
    kv_len: int
    num_real_positions: int  # Σ len(chunk)
    # a flat ragged pass (`engine/forward.py`) pads no row: what it computed, given as counted
    flat_padded_positions: int | None = None
    flat_kv_tokens_read: int | None = None  # Σ over rows of the positions each row attends to
    # of those, read by rows of more than one position: the paged kernel lays them across lanes,
    # whose price per KV position differs from a one-position row's (`sched/costmodel.py`)
    flat_wide_kv_tokens_read: int | None = None

    @classmethod
    def flat(cls, starts: list[int], lengths: list[int]) -> PassShape:
        """Rows fed `lengths` tokens at `starts` in a flat pass (`engine/forward.py`), or the prefill or
        verify share of one: nothing padded, each row reading its own KV."""
        ends = [start + length for start, length in zip(starts, lengths, strict=True)]
        wide = sum(end for end, length in zip(ends, lengths, strict=True) if length > 1)
        return cls(len(lengths), len(lengths), max(lengths), max(ends), sum(lengths), flat_padded_positions=0,
                   flat_kv_tokens_read=sum(ends), flat_wide_kv_tokens_read=wide)

    @property
    def num_padded_positions(self) -> int:
        if self.flat_padded_positions is not None:
            return self.flat_padded_positions
        return self.num_bucket_rows * self.query_len - self.num_real_positions

    @property
    def num_kv_tokens_read(self) -> int:
        if self.flat_kv_tokens_read is not None:
            return self.flat_kv_tokens_read
        return self.num_bucket_rows * self.kv_len

    @property
    def num_wide_kv_tokens_read(self) -> int:
        if self.flat_wide_kv_tokens_read is not None:
            return self.flat_wide_kv_tokens_read
        return self.num_kv_tokens_read if self.query_len > 1 else 0


@dataclass
class Proposals:
    """A round's drafts: tokens per row and what the drafter computed for them."""

    tokens: list[list[int]]  # per row, at most its k
    draft_probs: list[Any]  # per row: the warped q it sampled from, a [len(tokens), vocab] tensor; None = point mass
    num_fed: list[int] = field(default_factory=list)  # per row: positions fed to the draft model (its draft rows)
    # per row: how many of the fed positions the draft cache keeps once accepted; empty: all of them. An
    # EAGLE head keeps only positions fed with the target's features, not those drafted from its own
    num_kept: list[int] = field(default_factory=list)
    num_draft_positions: int = 0
    num_padded_draft_positions: int = 0
    num_passes: int = 0
    num_forced: list[int] = field(default_factory=list)  # per row: leading drafts the grammar forced; empty: none
    # drafting by lookup (n-gram, suffix) is host time, no pass: the rows it drafted for, the tokens it
    # added to its indexes, and per row how many of its tokens the row's own index holds (empty: none)
    num_lookup_rows: int = 0
    num_indexed_tokens: int = 0
    indexed_to: list[int] = field(default_factory=list)

    def withdraw(self, index: int) -> None:
        """Verify none of row `index`'s drafts (a probe's): what the draft cache computed for it stays,
        as after a round that rejected them all."""
        self.tokens[index], self.draft_probs[index] = [], None


@dataclass
class RowOutcome:
    row: Row
    k: int  # planned lookahead
    proposed: list[int]  # drafts actually offered
    num_accepted: int
    emitted: list[int]  # accepted drafts + correction-or-bonus token, before stops
    num_draft_fed: int = 0  # positions the draft model computed for this row while drafting
    num_draft_kept: int | None = None  # of those, the draft cache may keep (None: all)
    num_indexed: int = 0  # of the row's tokens, those its lookup drafter's own index holds after drafting


@dataclass
class RoundOutcome:
    rows: list[RowOutcome] = field(default_factory=list)
    prefill_shapes: list[PassShape] = field(default_factory=list)  # the prefill chunks' share of passes
    num_target_passes: int = 0  # target forward passes (a flat pass computes prefill chunks and verify windows)
    verify_shape: PassShape | None = None
    proposals: Proposals | None = None
    num_draft_prefill_positions: int = 0  # > 0: the draft cache was filled alongside the prefill chunks
    reuse_ms: float = 0.0  # copying shared prefixes' KV into rows: 0 since blocks are shared, not copied
    prefill_ms: float = 0.0
    draft_prefill_ms: float = 0.0  # of prefill_ms: filling the draft cache alongside
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    warmup_ms: float = 0.0  # capturing graphs before this round's passes (a worker's first round)
    mask_ms: float = 0.0  # filling the verify positions' grammar masks, on CPU threads beside the pass
    mask_wait_ms: float = 0.0  # of the round: waiting for those masks and applying them (what was not hidden)
    num_forced_proposed: int = 0  # drafts the grammar forced (a single continuation)
    num_forced_accepted: int = 0


class Backend(Protocol):
    """Runs a round plan: prefill chunks, drafting, one target verify pass, the acceptance rule.

    It holds device state (KV slots, random generators) keyed by request, reads rows, and never
    writes them: what it computed comes back as a `RoundOutcome` for the commit step."""

    def admit(self, row: Row) -> None:
        """Give a newly admitted (or re-admitted after preemption) row its device state."""

    def release(self, row: Row, finished: bool) -> None:
        """Free the row's KV slot; a finished row also drops its random stream."""

    def use_kv_blocks(self, kv: Any) -> None:
        """Read the rows' block tables from `kv` (the scheduler's `sched.kv_blocks.KVBlocks`)."""

    def execute(self, plan: RoundPlan) -> RoundOutcome:
        """Run the plan's passes and return what was proposed, accepted and emitted per row."""
