"""Plain accounting records the round loop emits; `specbatch.ledger` writes them to Parquet.

Words follow DESIGN §2. Every field is a raw counter or a timestamp (seconds since the epoch);
rates are derived later in SQL, never stored. The records are the one list of columns: each Parquet
schema is derived from its record (`arrow_schema`), so changing a field changes the schema.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, get_args, get_type_hints

import pyarrow as pa

from specbatch.core import KVUse

if TYPE_CHECKING:
    from specbatch.core import RoundOutcome, RoundPlan, Row, RowOutcome


def ms_since(started: float) -> float:
    """Milliseconds since `started`, a `time.perf_counter()` reading: the one timer of plans, commits
    and passes."""
    return (time.perf_counter() - started) * 1000


@dataclass
class RoundRecord:
    worker_id: int
    round_index: int
    started_s: float
    num_batch_rows: int  # distinct requests with work this round (prefill or decode)
    num_bucket_rows: int  # rows after padding the verify batch up to its shape bucket
    num_decode_rows: int
    num_prefill_rows: int
    num_prefill_tokens: int  # prompt positions the target computed (prefill chunks)
    num_reused_tokens: int  # prompt positions taken from shared KV blocks instead (sched/kv_blocks.py)
    num_target_rows: int  # Σ(1 + k) over decode rows + prefill chunk tokens
    num_padded_target_rows: int  # positions computed only because of shape buckets / ragged k
    num_padded_prefill_rows: int  # of those, in the prefill passes
    num_draft_rows: int  # positions the draft model computed (0 for n-gram drafting)
    num_padded_draft_rows: int
    num_target_passes: int  # sequential target forward passes this round
    num_draft_passes: int
    num_proposed: int
    num_accepted: int
    num_committed: int
    num_speculating_rows: int  # decode rows with k > 0
    max_k: int
    query_len: int  # verify query length after bucketing
    kv_len: int  # KV length the verify pass attended over (bucketed)
    num_kv_tokens_read: int  # Σ over verify + prefill rows of attended KV positions
    kv_tokens_in_use: int
    kv_tokens_capacity: int
    plan_ms: float
    reuse_ms: float  # copying shared prefixes' KV into rows
    prefill_ms: float
    draft_ms: float
    verify_ms: float
    commit_ms: float
    warmup_ms: float  # graph capture before the round's passes (engine/graphs.py); part of round_ms
    round_ms: float
    # the round-time model's view of the decode rows (sched/pass_profile.py): their time at k = 0 and as
    # planned, and the speedup over plain decoding their measured α allowed at the best largest k
    plain_ms: float
    predicted_ms: float
    limit_speedup: float
    # structured output (engine/constraints.py): filling the verify positions' grammar masks (CPU threads,
    # beside the pass), the round's wait for them and applying them (the part not hidden), and drafts the
    # grammar forced (a single continuation), proposed / accepted
    mask_ms: float = 0.0
    mask_wait_ms: float = 0.0
    num_forced_proposed: int = 0
    num_forced_accepted: int = 0
    # KV blocks after the round (sched/kv_blocks.py): held (a shared block once), shared by several rows,
    # cached for later rows, evicted during the round, and the rows' block-table entries (with copies)
    kv_blocks_in_use: int = 0
    kv_blocks_shared: int = 0
    kv_blocks_cached: int = 0
    kv_blocks_evicted: int = 0
    kv_blocks_referenced: int = 0
    # drafting by lookup (n-gram, suffix; host time inside draft_ms): rows drafted for, tokens indexed
    num_lookup_rows: int = 0
    num_indexed_tokens: int = 0
    # of num_kv_tokens_read, read by rows of more than one position (`PassShape.num_wide_kv_tokens_read`)
    num_wide_kv_tokens_read: int = 0

    @classmethod
    def of(cls, plan: RoundPlan, outcome: RoundOutcome, num_committed: int, *, worker_id: int, round_index: int,
           started_s: float, kv_tokens_in_use: int, kv_tokens_capacity: int, commit_ms: float,
           round_ms: float, kv_use: KVUse | None = None) -> RoundRecord:
        """The record of a round that ran `plan` to `outcome` and committed `num_committed` tokens."""
        verify, prefills, proposals = outcome.verify_shape, outcome.prefill_shapes, outcome.proposals
        kv_use = kv_use or KVUse()
        num_prefill_tokens = sum(size for _, size in plan.prefill)
        num_real_verify = verify.num_real_positions if verify else 0
        prefill_padded = sum(shape.num_padded_positions for shape in prefills)
        padded = (verify.num_padded_positions if verify else 0) + prefill_padded
        num_draft_positions = (proposals.num_draft_positions if proposals else 0) + outcome.num_draft_prefill_positions
        shapes = [*prefills, verify] if verify else prefills
        kv_read = sum(shape.num_kv_tokens_read for shape in shapes)
        rows = {id(row) for row, _ in plan.decode} | {id(row) for row, _ in plan.prefill}
        return cls(
            worker_id=worker_id, round_index=round_index, started_s=started_s,
            num_batch_rows=len(rows), num_bucket_rows=verify.num_bucket_rows if verify else 0,
            num_decode_rows=len(outcome.rows), num_prefill_rows=len(plan.prefill),
            num_prefill_tokens=num_prefill_tokens, num_reused_tokens=plan.num_reused_tokens,
            num_target_rows=num_real_verify + num_prefill_tokens, num_padded_target_rows=padded,
            num_padded_prefill_rows=prefill_padded, num_draft_rows=num_draft_positions,
            num_padded_draft_rows=proposals.num_padded_draft_positions if proposals else 0,
            num_target_passes=outcome.num_target_passes,
            num_draft_passes=(proposals.num_passes if proposals else 0) + int(outcome.num_draft_prefill_positions > 0),
            num_proposed=sum(len(r.proposed) for r in outcome.rows),
            num_accepted=sum(r.num_accepted for r in outcome.rows),
            num_committed=num_committed, num_speculating_rows=sum(1 for r in outcome.rows if r.proposed),
            max_k=max((r.k for r in outcome.rows), default=0), query_len=verify.query_len if verify else 0,
            kv_len=verify.kv_len if verify else 0, num_kv_tokens_read=kv_read,
            kv_tokens_in_use=kv_tokens_in_use, kv_tokens_capacity=kv_tokens_capacity,
            plan_ms=plan.plan_ms, reuse_ms=outcome.reuse_ms, prefill_ms=outcome.prefill_ms, draft_ms=outcome.draft_ms,
            verify_ms=outcome.verify_ms, commit_ms=commit_ms, warmup_ms=outcome.warmup_ms, round_ms=round_ms,
            plain_ms=plan.plain_ms, predicted_ms=plan.predicted_ms, limit_speedup=plan.limit_speedup,
            mask_ms=outcome.mask_ms, mask_wait_ms=outcome.mask_wait_ms, num_forced_proposed=outcome.num_forced_proposed,
            num_forced_accepted=outcome.num_forced_accepted,
            kv_blocks_in_use=kv_use.num_in_use, kv_blocks_shared=kv_use.num_shared, kv_blocks_cached=kv_use.num_cached,
            kv_blocks_evicted=kv_use.num_evicted, kv_blocks_referenced=kv_use.num_referenced,
            num_lookup_rows=proposals.num_lookup_rows if proposals else 0,
            num_indexed_tokens=proposals.num_indexed_tokens if proposals else 0,
            num_wide_kv_tokens_read=sum(shape.num_wide_kv_tokens_read for shape in shapes),
        )


@dataclass
class StepRecord:
    """One decode row's emission in one round: the unit of time-to-first-token and token gaps."""

    request_id: str
    worker_id: int
    round_index: int
    emitted_s: float
    k: int
    num_proposed: int
    num_accepted: int
    num_committed: int
    num_output_tokens: int  # output length after this step
    # the drafter this step drafted with (k > 0: a lookup may still propose nothing) where the job has several
    # (drafter.kind); "" otherwise
    drafter: str = ""

    @classmethod
    def of(cls, outcome: RowOutcome, num_committed: int, worker_id: int, round_index: int,
           emitted_s: float) -> StepRecord:
        row = outcome.row
        return cls(request_id=row.request_id, worker_id=worker_id, round_index=round_index, emitted_s=emitted_s,
                   k=outcome.k, num_proposed=len(outcome.proposed), num_accepted=outcome.num_accepted,
                   num_committed=num_committed, num_output_tokens=row.num_output_tokens,
                   drafter=row.drafter if outcome.k > 0 else "")


@dataclass
class RequestRecord:
    request_id: str
    worker_id: int
    domain: str
    status: str  # completed | dropped | cancelled
    finish_reason: str | None  # eos | length | stop | None
    drop_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    max_new_tokens: int
    temperature: float
    arrival_s: float
    admitted_s: float | None
    first_token_s: float | None
    finished_s: float
    num_rounds: int
    num_target_rows: int
    num_draft_rows: int
    num_proposed: int
    num_accepted: int
    num_preemptions: int
    num_reused_tokens: int  # prompt positions copied from a shared prefix, not computed

    @classmethod
    def of(cls, row: Row, worker_id: int, finished_s: float) -> RequestRecord:
        """The accounting of a row that is done (completed, dropped or cancelled)."""
        return cls(
            request_id=row.request_id, worker_id=worker_id, domain=row.domain, status=row.status.value,
            finish_reason=row.finish_reason, drop_reason=row.drop_reason,
            num_prompt_tokens=row.num_prompt_tokens, num_output_tokens=row.num_output_tokens,
            max_new_tokens=row.params.max_new_tokens, temperature=row.params.temperature,
            arrival_s=row.arrival_s, admitted_s=row.admitted_s, first_token_s=row.first_token_s,
            finished_s=finished_s, num_rounds=row.num_rounds, num_target_rows=row.num_target_positions,
            num_draft_rows=row.num_draft_positions, num_proposed=row.num_proposed, num_accepted=row.num_accepted,
            num_preemptions=row.num_preemptions, num_reused_tokens=row.num_reused_tokens,
        )


@dataclass
class ResultRecord:
    request_id: str
    status: str
    text: str | None
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    drop_reason: str | None = None
    drop_message: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    domain: str = ""
    metadata: str | None = None  # JSON of the input record's unknown fields

    @classmethod
    def of(cls, row: Row, text: str | None) -> ResultRecord:
        """The result of a row that is done; `text` its decoded output (None for a dropped row)."""
        return cls(
            request_id=row.request_id, status=row.status.value, text=text, output_token_ids=row.output_ids,
            finish_reason=row.finish_reason, drop_reason=row.drop_reason, drop_message=row.drop_message,
            num_prompt_tokens=row.num_prompt_tokens, num_output_tokens=row.num_output_tokens, domain=row.domain,
            metadata=row.metadata,
        )


_ARROW_TYPES: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    list[int]: pa.list_(pa.int32()),  # token ids
}


def arrow_schema(record: type) -> pa.Schema:
    """One column per field, in field order; `X | None` is the only nullable annotation."""
    hints = get_type_hints(record)
    return pa.schema([_arrow_field(f.name, hints[f.name]) for f in fields(record)])


def _arrow_field(name: str, annotation: Any) -> pa.Field:
    args = get_args(annotation)
    nullable = isinstance(annotation, types.UnionType) and len(args) == 2 and type(None) in args
    kind = next(arg for arg in args if arg is not type(None)) if nullable else annotation
    if kind not in _ARROW_TYPES:
        raise TypeError(f"field {name!r}: no Arrow type for {annotation!r}")
    return pa.field(name, _ARROW_TYPES[kind], nullable=nullable)
