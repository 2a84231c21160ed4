"""The records are the one list of columns: the schemas derived from them must equal the schemas
jobs were written with. If this fails after a record change, the change is a schema change: update
the oracle below on purpose, and make sure existing job directories still read."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pytest

from specbatch import ledger
from specbatch.records import arrow_schema

# The literal schemas from before they were derived (specbatch/ledger.py), kept as the oracle.
_I64, _F64, _STR = pa.int64(), pa.float64(), pa.string()


def _schema(*fields: tuple[str, pa.DataType, bool]) -> pa.Schema:
    return pa.schema([pa.field(name, kind, nullable=nullable) for name, kind, nullable in fields])


def _required(kind: pa.DataType, *names: str) -> list[tuple[str, pa.DataType, bool]]:
    return [(name, kind, False) for name in names]


EXPECTED_ROUNDS = _schema(
    *_required(_I64, "worker_id", "round_index"),
    ("started_s", _F64, False),
    *_required(
        _I64,
        "num_batch_rows",
        "num_bucket_rows",
        "num_decode_rows",
        "num_prefill_rows",
        "num_prefill_tokens",
        "num_reused_tokens",
        "num_target_rows",
        "num_padded_target_rows",
        "num_padded_prefill_rows",
        "num_draft_rows",
        "num_padded_draft_rows",
        "num_target_passes",
        "num_draft_passes",
        "num_proposed",
        "num_accepted",
        "num_committed",
        "num_speculating_rows",
        "max_k",
        "query_len",
        "kv_len",
        "num_kv_tokens_read",
        "kv_tokens_in_use",
        "kv_tokens_capacity",
    ),
    *_required(_F64, "plan_ms", "reuse_ms", "prefill_ms", "draft_ms", "verify_ms", "commit_ms", "warmup_ms",
               "round_ms", "plain_ms", "predicted_ms", "limit_speedup", "mask_ms", "mask_wait_ms"),
    *_required(_I64, "num_forced_proposed", "num_forced_accepted"),
    *_required(_I64, "kv_blocks_in_use", "kv_blocks_shared", "kv_blocks_cached", "kv_blocks_evicted",
               "kv_blocks_referenced"),
    *_required(_I64, "num_lookup_rows", "num_indexed_tokens", "num_wide_kv_tokens_read"),
)

EXPECTED_STEPS = _schema(
    ("request_id", _STR, False),
    *_required(_I64, "worker_id", "round_index"),
    ("emitted_s", _F64, False),
    *_required(_I64, "k", "num_proposed", "num_accepted", "num_committed", "num_output_tokens"),
    ("drafter", _STR, False),
)

EXPECTED_REQUESTS = _schema(
    ("request_id", _STR, False),
    ("worker_id", _I64, False),
    ("domain", _STR, False),
    ("status", _STR, False),
    ("finish_reason", _STR, True),
    ("drop_reason", _STR, True),
    *_required(_I64, "num_prompt_tokens", "num_output_tokens", "max_new_tokens"),
    ("temperature", _F64, False),
    ("arrival_s", _F64, False),
    ("admitted_s", _F64, True),
    ("first_token_s", _F64, True),
    ("finished_s", _F64, False),
    *_required(
        _I64,
        "num_rounds",
        "num_target_rows",
        "num_draft_rows",
        "num_proposed",
        "num_accepted",
        "num_preemptions",
        "num_reused_tokens",
    ),
)

EXPECTED_RESULTS = _schema(
    ("request_id", _STR, False),
    ("status", _STR, False),
    ("text", _STR, True),
    ("output_token_ids", pa.list_(pa.int32()), False),
    ("finish_reason", _STR, True),
    ("drop_reason", _STR, True),
    ("drop_message", _STR, True),
    *_required(_I64, "num_prompt_tokens", "num_output_tokens"),
    ("domain", _STR, False),
    ("metadata", _STR, True),
)

EXPECTED = {
    "rounds": EXPECTED_ROUNDS,
    "steps": EXPECTED_STEPS,
    "requests": EXPECTED_REQUESTS,
    "results": EXPECTED_RESULTS,
}


@pytest.mark.parametrize("table", ledger.TABLES)
def test_derived_schema_equals_the_written_schema(table: str) -> None:
    derived = ledger.SCHEMAS[table]
    assert [(f.name, f.type, f.nullable) for f in derived] == [(f.name, f.type, f.nullable) for f in EXPECTED[table]]
    assert derived.equals(EXPECTED[table], check_metadata=True)


def test_only_x_or_none_is_nullable() -> None:
    @dataclass
    class Record:
        count: int
        when_s: float | None
        token_ids: list[int]

    assert arrow_schema(Record) == pa.schema(
        [
            pa.field("count", pa.int64(), nullable=False),
            pa.field("when_s", pa.float64(), nullable=True),
            pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        ]
    )


@pytest.mark.parametrize("annotation", [bool, "int | str", "list[str]", "dict[str, int]"])
def test_an_annotation_without_an_arrow_type_is_refused(annotation: object) -> None:
    record = dataclass(type("Record", (), {"__annotations__": {"value": annotation}}))
    with pytest.raises(TypeError, match="'value'"):
        arrow_schema(record)
