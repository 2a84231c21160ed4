"""The ledger: schemas follow the record contract column by column; parts commit atomically."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from specbatch import ledger, storage
from specbatch.records import RequestRecord, ResultRecord, RoundRecord, StepRecord

RECORDS = {"rounds": RoundRecord, "steps": StepRecord, "requests": RequestRecord, "results": ResultRecord}
ARROW_OF_ANNOTATION = {  # records.py annotation -> (Arrow type, nullable)
    "int": (pa.int64(), False),
    "float": (pa.float64(), False),
    "str": (pa.string(), False),
    "str | None": (pa.string(), True),
    "float | None": (pa.float64(), True),
    "list[int]": (pa.list_(pa.int32()), False),
}


def _round(index: int = 0, worker_id: int = 0) -> RoundRecord:
    counters = {f.name: 1 for f in dataclasses.fields(RoundRecord) if f.type == "int"}
    timings = {f.name: 2.5 for f in dataclasses.fields(RoundRecord) if f.type == "float"}
    return RoundRecord(**{**counters, **timings, "round_index": index, "worker_id": worker_id})


def _step(request_id: str = "a") -> StepRecord:
    return StepRecord(request_id, 0, 0, 1.5, 2, 2, 1, 2, 2)


def _request(request_id: str = "a") -> RequestRecord:
    return RequestRecord(
        request_id, 0, "chat", "completed", "eos", None, 5, 2, 8, 0.0, 1.0, 1.1, None, 2.0, 1, 4, 2, 2, 1, 0, 0
    )


def _result(request_id: str = "a", status: str = "completed") -> ResultRecord:
    return ResultRecord(request_id, status, "hi", [7, 8], "eos", num_output_tokens=2, domain="chat")


def _writer(job_dir: Path, **kwargs: object) -> ledger.PartWriter:
    return ledger.PartWriter(
        job_dir, **{"worker_id": 3, "run_id": "r1", "every_requests": 2, "every_s": 10.0, **kwargs}
    )


@pytest.mark.parametrize("table", ledger.TABLES)
def test_schema_matches_the_record_contract_column_by_column(table: str) -> None:
    schema = ledger.SCHEMAS[table]
    fields = dataclasses.fields(RECORDS[table])
    assert schema.names == [f.name for f in fields]
    for f in fields:
        kind, nullable = ARROW_OF_ANNOTATION[f.type]
        assert schema.field(f.name).type == kind, f.name
        assert schema.field(f.name).nullable is nullable, f.name


def test_named_schemas_are_the_table_schemas() -> None:
    assert ledger.ROUNDS_SCHEMA is ledger.SCHEMAS["rounds"]
    assert ledger.STEPS_SCHEMA is ledger.SCHEMAS["steps"]
    assert ledger.REQUESTS_SCHEMA is ledger.SCHEMAS["requests"]
    assert ledger.RESULTS_SCHEMA is ledger.SCHEMAS["results"]


@pytest.mark.parametrize("durable", [True, False])
def test_flush_writes_all_four_tables_and_round_trips(tmp_path: Path, durable: bool) -> None:
    writer = _writer(tmp_path, durable=durable)
    records = {
        "rounds": [_round(0), _round(1)],
        "steps": [_step()],
        "requests": [_request()],
        "results": [_result()],
    }
    for record in records["rounds"]:
        writer.add_round(record)
    writer.add_step(records["steps"][0])
    writer.add_request(records["requests"][0])
    writer.add_result(records["results"][0])
    assert writer.flush() == "part-w03-r1-00000"
    assert writer.flush() is None
    for table in ledger.TABLES:
        assert sorted(p.name for p in (tmp_path / table).iterdir()) == ["part-w03-r1-00000.parquet"]
        read = ledger.read_table(tmp_path, table)
        assert read.schema == ledger.SCHEMAS[table]
        assert read.to_pylist() == [dataclasses.asdict(r) for r in records[table]]


def test_results_file_is_renamed_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(
        storage.os, "replace", lambda src, dst: (renamed.append(Path(dst).parent.name), real_replace(src, dst))
    )
    writer = _writer(tmp_path)
    writer.add_result(_result())
    writer.flush()
    assert renamed == ["rounds", "steps", "requests", "results"]


def test_flush_is_due_by_finished_requests_or_time(tmp_path: Path) -> None:
    now = [0.0]
    writer = _writer(tmp_path, clock=lambda: now[0])
    assert writer.maybe_flush() is None
    writer.add_round(_round())
    writer.add_result(_result("a"))
    assert writer.maybe_flush() is None
    writer.add_result(_result("b"))
    assert writer.maybe_flush() == "part-w03-r1-00000"
    writer.add_step(_step())
    now[0] = 9.9
    assert writer.maybe_flush() is None
    now[0] = 10.0
    assert writer.maybe_flush() == "part-w03-r1-00001"
    now[0] = 100.0
    assert writer.maybe_flush() is None  # nothing buffered: no empty parts
    assert ledger.read_table(tmp_path, "results").num_rows == 2
    assert ledger.read_table(tmp_path, "steps").num_rows == 1


def test_a_new_writer_of_the_same_run_continues_the_sequence(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "shard-00000-part-000.parquet").write_bytes(b"")  # a foreign name is ignored
    writer = _writer(tmp_path)
    writer.add_result(_result())
    writer.flush()
    again = _writer(tmp_path)
    again.add_result(_result("b"))
    assert again.flush() == "part-w03-r1-00001"
    other = _writer(tmp_path, run_id="r1-x")
    other.add_result(_result("c"))
    assert other.flush() == "part-w03-r1-x-00000"


def test_null_in_a_required_column_is_refused(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.add_result(dataclasses.replace(_result(), domain=None))
    with pytest.raises(ValueError, match="domain"):
        writer.flush()


def test_kill_mid_flush_leaves_an_orphan_that_is_ignored_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(tmp_path)
    writer.add_round(_round())
    writer.add_result(_result("done"))
    writer.flush()
    real_replace = os.replace

    def killed_at_results(src: str, dst: str) -> None:
        if Path(dst).parent.name == "results":
            raise KeyboardInterrupt  # stands for kill -9 between the renames
        real_replace(src, dst)

    monkeypatch.setattr(storage.os, "replace", killed_at_results)
    writer.add_round(_round(1))
    writer.add_step(_step("lost"))
    writer.add_request(_request("lost"))
    writer.add_result(_result("lost"))
    with pytest.raises(KeyboardInterrupt):
        writer.flush()
    monkeypatch.setattr(storage.os, "replace", real_replace)

    assert ledger.committed_request_ids(tmp_path) == {"done"}
    assert ledger.read_table(tmp_path, "rounds").num_rows == 1
    assert ledger.remove_orphan_parts(tmp_path, worker_id=4) == []  # another worker's files stay
    removed = ledger.remove_orphan_parts(tmp_path, worker_id=3)
    assert sorted(removed) == sorted(
        [
            "rounds/part-w03-r1-00001.parquet",
            "steps/part-w03-r1-00001.parquet",
            "requests/part-w03-r1-00001.parquet",
            "results/part-w03-r1-00001.parquet.tmp",
        ]
    )
    assert ledger.remove_orphan_parts(tmp_path) == []
    assert ledger.committed_parts(tmp_path) == ["part-w03-r1-00000"]


def test_committed_request_ids_by_status(tmp_path: Path) -> None:
    writer = _writer(tmp_path, every_requests=100)
    for request_id, status in (("a", "completed"), ("b", "dropped"), ("c", "cancelled")):
        writer.add_result(_result(request_id, status))
    writer.flush()
    assert ledger.committed_request_ids(tmp_path) == {"a", "b", "c"}
    assert ledger.committed_request_ids(tmp_path, statuses=["completed", "dropped"]) == {"a", "b"}
    assert ledger.committed_request_ids(tmp_path / "missing") == set()


def test_read_table_of_an_empty_job_has_the_schema(tmp_path: Path) -> None:
    for table in ledger.TABLES:
        read = ledger.read_table(tmp_path, table)
        assert read.num_rows == 0 and read.schema == ledger.SCHEMAS[table]


def test_duckdb_reads_every_table_directly(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.add_round(_round())
    writer.add_step(_step())
    writer.add_request(_request())
    writer.add_result(_result())
    writer.flush()
    writer.add_result(_result("dropped-only", "dropped"))  # a part with no rounds still has a rounds file
    writer.flush()
    con = duckdb.connect()
    for table in ledger.TABLES:
        relation = con.sql(f"SELECT * FROM read_parquet('{tmp_path}/{table}/*.parquet')")
        assert relation.columns == ledger.SCHEMAS[table].names
    described = con.execute(f"DESCRIBE SELECT * FROM '{tmp_path}/results/*.parquet'").fetchall()
    types = {row[0]: row[1] for row in described}
    assert types["output_token_ids"] == "INTEGER[]" and types["num_output_tokens"] == "BIGINT"
    assert con.execute(f"SELECT count(*) FROM '{tmp_path}/results/*.parquet'").fetchall() == [(2,)]
    assert con.execute(f"SELECT sum(round_ms) FROM '{tmp_path}/rounds/*.parquet'").fetchall() == [(2.5,)]


def test_part_names_parse_back() -> None:
    assert ledger.parse_part_name(ledger.part_name(12, "2024-01-01T00", 7)) == (12, "2024-01-01T00", 7)
    with pytest.raises(ValueError):
        ledger.parse_part_name("shard-00000")
