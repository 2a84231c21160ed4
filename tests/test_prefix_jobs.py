"""Whole jobs over prompts that share prefixes (cache.prefix on, the default): kill -9 and resume
still give every record once with the uninterrupted run's outputs, results.jsonl in dataset order
(ingest groups records by prefix), and two worker processes compute each distinct prefix at most
twice (ingest keeps rows that share one in the same shards)."""

from __future__ import annotations

import json

import duckdb
import pytest
from job_helpers import assert_completed_as, kill_then_resume, reference_run, results, submit, write_config

INSTRUCTIONS = [
    "Label each text as code or prose. The quick brown fox jumps over the lazy dog. "
    "for i in range(10): print(i * i). Speculative decoding proposes tokens that the target verifies. ",
    "Answer in one word. def add(a, b): return a + b. The lazy dog sleeps while the quick brown fox jumps. "
    "Speculative decoding verifies in one pass what the draft proposes. ",
]
ENDINGS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "import os", "The lazy dog",
           "print(i * i)", "class Foo:", "Speculative decoding"]


def shared_prefix_records(n: int = 24) -> list[dict]:
    """Two long instructions, interleaved, each record ending in its own short text."""
    return [{"id": f"p{i:03d}", "prompt": INSTRUCTIONS[i % 2] * 2 + ENDINGS[i % len(ENDINGS)] + f" {i}",
             "max_new_tokens": 3 + i % 5} for i in range(n)]


def reused_and_prefilled(job_dir) -> tuple[int, int]:
    con = duckdb.connect()
    sums = [con.execute(f"SELECT sum({column}) FROM read_parquet('{job_dir}/{table}/*.parquet')").fetchone()[0]
            for table, column in (("requests", "num_reused_tokens"), ("rounds", "num_prefill_tokens"))]
    return int(sums[0] or 0), int(sums[1] or 0)


def rounds_reused(job_dir) -> int:
    return int(duckdb.connect().execute(
        f"SELECT sum(num_reused_tokens) FROM read_parquet('{job_dir}/rounds/*.parquet')").fetchone()[0] or 0)


@pytest.fixture(scope="module")
def reference_job(tmp_path_factory, tiny_pair):
    return reference_run(tmp_path_factory.mktemp("prefix-reference"), tiny_pair, shared_prefix_records())


def test_kill_9_then_resume_with_prefix_reuse_gives_each_record_once(tmp_path, reference_job):
    dataset, config, reference_dir = reference_job
    reference = {r["request_id"]: r for r in results(reference_dir)}
    assert reused_and_prefilled(reference_dir)[0] > 0
    assert rounds_reused(reference_dir) == reused_and_prefilled(reference_dir)[0]  # the rounds count what rows took
    assert_completed_as(kill_then_resume(dataset, config, "job", tmp_path, "part_committed:2"), reference)
    lines = (tmp_path / "job" / "results.jsonl").read_text().splitlines()
    exported = [json.loads(line)["request_id"] for line in lines]
    assert exported == [record["id"] for record in shared_prefix_records()]  # dataset order, not shard order


@pytest.mark.slow
def test_two_workers_compute_each_prefix_at_most_twice(tmp_path, tiny_pair, reference_job):
    dataset, _, reference_dir = reference_job
    config = write_config(tmp_path, tiny_pair, workers={"num_processes": 2})
    run = submit(dataset, config, "two", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    reference = {r["request_id"]: r["output_token_ids"] for r in results(reference_dir)}
    assert {r["request_id"]: r["output_token_ids"] for r in results(tmp_path / "out" / "two")} == reference
    con = duckdb.connect()
    computed_own = con.execute(
        f"SELECT request_id FROM read_parquet('{tmp_path}/out/two/requests/*.parquet') WHERE num_reused_tokens = 0"
    ).fetchall()
    by_prefix = [sum(int(request_id[1:]) % 2 == group for (request_id,) in computed_own) for group in (0, 1)]
    assert max(by_prefix) <= 2, by_prefix  # each worker computed each prefix at most once
    assert reused_and_prefilled(tmp_path / "out" / "two")[0] > 0
