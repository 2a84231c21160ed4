"""A speed-only field never changes a record for good (issue 36): a request a run's KV capacity
dropped (`exceeds_kv_capacity`) runs again when the job is resumed, e.g. with more capacity."""

from __future__ import annotations

import json

from specbatch.config import load_config
from specbatch.job.flow import run_workers
from specbatch.job.prepare import prepare
from specbatch.ledger import read_table


def test_requests_dropped_for_kv_capacity_run_again_on_resume(tmp_path, tiny_pair):
    target, draft, tokenizer = tiny_pair
    short, long = "def add(a, b):", " ".join(f"w{i} q{i * 7} z" for i in range(12))
    num_long_tokens = len(tokenizer(long)["input_ids"])
    assert len(tokenizer(short)["input_ids"]) + 2 + 4 <= num_long_tokens + 2 < num_long_tokens + 2 + 4
    records = [{"id": f"s{i}", "prompt": short, "max_new_tokens": 2} for i in range(3)]
    records += [{"id": "long", "prompt": long, "max_new_tokens": 2}]  # fits the context, not the small KV
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps(record) + "\n" for record in records))
    base = [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft",
            "scheduler.lookahead=fixed:3"]
    job_dir = tmp_path / "job"
    prepare(dataset, job_dir, load_config(None, [*base, f"capacity.kv_tokens={num_long_tokens + 2}"]))
    run_workers.fn(str(job_dir))
    rows = read_table(job_dir, "results").to_pylist()
    first = {row["request_id"]: (row["status"], row["drop_reason"]) for row in rows}
    assert first["long"] == ("dropped", "exceeds_kv_capacity")  # by this run's capacity, not at ingest
    assert {first[f"s{i}"][0] for i in range(3)} == {"completed"}

    prepare(dataset, job_dir, load_config(None, base))  # resumed with the default capacity: speed-only
    run_workers.fn(str(job_dir))
    rows = read_table(job_dir, "results").select(["request_id", "status"]).to_pylist()
    assert sorted((row["request_id"], row["status"]) for row in rows) == [
        ("long", "completed"), ("s0", "completed"), ("s1", "completed"), ("s2", "completed")]
