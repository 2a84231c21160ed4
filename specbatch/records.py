"""Plain accounting records the round loop emits; `specbatch.ledger` writes them to Parquet.

Words follow DESIGN §2. Every field is a raw counter or a timestamp (seconds since the epoch);
rates are derived later in SQL, never stored. The records are the one list of columns: each Parquet
schema is derived from its record (`arrow_schema`), so changing a field changes the schema.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_type_hints

import pyarrow as pa


@dataclass
class RoundRecord:
    worker_id: int
    round_index: int
    started_s: float
    num_batch_rows: int  # distinct requests with work this round (prefill or decode)
    num_bucket_rows: int  # rows after padding the verify batch up to its shape bucket
    num_decode_rows: int
    num_prefill_rows: int
    num_prefill_tokens: int
    num_target_rows: int  # Σ(1 + k) over decode rows + prefill chunk tokens
    num_padded_target_rows: int  # positions computed only because of shape buckets / ragged k
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
    prefill_ms: float
    draft_ms: float
    verify_ms: float
    commit_ms: float
    warmup_ms: float  # graph capture before the round's passes (engine/graphs.py); part of round_ms
    round_ms: float


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
