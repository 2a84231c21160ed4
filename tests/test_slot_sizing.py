"""KV slots sized to the job: ingest records each shard's longest request (prompt + max_new_tokens),
a worker's slots hold that instead of the model's whole context, and every output stays the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from job_helpers import write_jsonl

from specbatch.config import load_config
from specbatch.data.prefix_groups import key_tree_positions, shared_prefix_keys
from specbatch.data.shards import shard_dataset
from specbatch.engine.build import build_hf_engine, load_models, num_slot_positions
from specbatch.job import worker
from specbatch.job.manifest import MANIFEST_NAME, ShardEntry, load_manifest
from specbatch.job.prepare import prepare
from specbatch.ledger import read_table

PROMPTS = ["def add(a, b):", "The quick brown fox", "for i in range(10):", "Speculative decoding"]
CONTEXT = 256  # the tiny pair's positions
NOT_COMPARED = {"started_s", "kv_tokens_capacity"}  # besides times (*_ms)


def _records() -> list[dict]:
    records = [{"id": f"q{i}", "prompt": PROMPTS[i % 4], "max_new_tokens": 4 + 3 * i} for i in range(7)]
    records.append({"id": "default", "prompt": PROMPTS[1]})  # sampling.max_new_tokens
    records.append({"id": "bad", "prompt": PROMPTS[0], "max_new_tokens": 0})  # dropped: needs nothing
    return records


def _overrides(tiny_pair) -> list[str]:
    target, draft, _ = tiny_pair
    return [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft", "scheduler.lookahead=fixed:3",
            "scheduler.max_lookahead=3", "scheduler.max_batch_rows=3", "sampling.max_new_tokens=10", "io.shard_size=4"]


def _longest_request(tiny_pair) -> int:
    tokenizer = tiny_pair[2]
    lengths = {r["id"]: len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in _records()}
    return max(lengths[r["id"]] + r.get("max_new_tokens", 10) for r in _records() if r["id"] != "bad")


def test_ingest_records_each_shards_longest_request_in_the_manifest(tmp_path, tiny_pair):
    config = load_config(None, _overrides(tiny_pair))
    manifest = prepare(write_jsonl(tmp_path / "data.jsonl", _records()), tmp_path / "job", config)
    needs = [shard.max_request_tokens for shard in load_manifest(tmp_path / "job").shards]
    assert needs == [shard.max_request_tokens for shard in manifest.shards]
    assert None not in needs and max(needs) == _longest_request(tiny_pair)
    assert worker.max_request_tokens(load_manifest(tmp_path / "job").shards) == _longest_request(tiny_pair)


def test_shards_without_token_ids_record_no_need(tmp_path, tiny_pair):
    shards = shard_dataset(write_jsonl(tmp_path / "data.jsonl", _records()), tmp_path / "job",
                           load_config(None, _overrides(tiny_pair)))  # no tokenizer
    assert [shard.max_request_tokens for shard in shards] == [None, None, 0]  # the last: only the dropped one


def test_a_worker_needs_its_longest_shard_or_the_whole_context_when_one_is_unknown():
    def entry(need: int | None) -> ShardEntry:
        return ShardEntry(name="s", num_records=1, num_dropped=0, max_request_tokens=need)

    assert worker.max_request_tokens([entry(30), entry(70), entry(0)]) == 70
    assert worker.max_request_tokens([entry(30), entry(None)]) is None
    assert worker.max_request_tokens([]) == 0  # a worker with no shards runs nothing


@pytest.mark.parametrize(("need", "graphs", "expected"), [
    (None, "eager", CONTEXT + 4),  # unknown: the whole context
    (40, "eager", 64),  # 40 + pending token + k = 3, up to the KV-length multiple (32)
    (60, "eager", 64),
    (61, "eager", 96),
    (300, "eager", CONTEXT + 4),  # longer than the context: the context
    (60, "compile", 64),
])
def test_slot_positions(tiny_pair, need, graphs, expected):
    config = load_config(None, [*_overrides(tiny_pair), f"models.graphs={graphs}"])
    assert num_slot_positions(config, CONTEXT, need) == expected


def test_slots_wider_than_the_lookahead_where_query_buckets_are(tiny_pair):
    config = load_config(None, [*_overrides(tiny_pair), "buckets.query_len=[8,64]"])
    assert num_slot_positions(config, CONTEXT, 40) == 128  # a 1-token last chunk pads to 64 positions


def _run(job_dir: Path, config, models, monkeypatch) -> int:
    """Run the job's worker; returns the positions per batch row of its KV pool (whole blocks)."""
    built = []

    def spy(*args, **kwargs):
        engine = build_hf_engine(*args, **kwargs)
        built.append(engine.backend)
        return engine

    monkeypatch.setattr(worker, "build_hf_engine", spy)
    worker.run_worker(job_dir, config, models=models)
    (backend,) = built
    assert backend.drafter.draft.max_len == backend.target.max_len  # the draft model's blocks mirror the target's
    return backend.target.max_len // config.scheduler.max_batch_rows


def _per_row(config, slot_positions: int) -> int:
    """A pool of max_batch_rows x `slot_positions`, in whole blocks, per row."""
    rows, block = config.scheduler.max_batch_rows, config.cache.block_tokens
    return rows * slot_positions // block * block // rows


def _forget_needs(job_dir: Path) -> None:
    """Make the manifest one written before ingest recorded the need."""
    path = job_dir / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    for shard in manifest["shards"]:
        del shard["max_request_tokens"]
    path.write_text(json.dumps(manifest))


def _rounds(job_dir: Path) -> list[dict]:
    rows = read_table(job_dir, "rounds").to_pylist()
    return [{k: v for k, v in row.items() if k not in NOT_COMPARED and not k.endswith("_ms")} for row in rows]


def test_short_requests_get_short_slots_and_the_same_outputs_as_whole_context_slots(tmp_path, tiny_pair,
                                                                                      monkeypatch):
    config = load_config(None, _overrides(tiny_pair))
    models = load_models(config)
    dataset = write_jsonl(tmp_path / "data.jsonl", _records())
    sized, whole = tmp_path / "sized", tmp_path / "whole"
    prepare(dataset, sized, config)
    prepare(dataset, whole, config)
    _forget_needs(whole)
    assert {shard.max_request_tokens for shard in load_manifest(whole).shards} == {None}

    assert _run(sized, config, models, monkeypatch) == _per_row(config, num_slot_positions(
        config, CONTEXT, _longest_request(tiny_pair)))
    assert _run(whole, config, models, monkeypatch) == _per_row(config, CONTEXT + 4)

    results = read_table(sized, "results").sort_by("request_id").to_pylist()
    assert results == read_table(whole, "results").sort_by("request_id").to_pylist()
    assert {row["status"] for row in results} == {"completed", "dropped"}
    assert _rounds(sized) == _rounds(whole)  # the same passes, shapes and KV buckets
    capacity = {row["kv_tokens_capacity"] for row in read_table(sized, "rounds").to_pylist()}
    assert capacity == {3 * num_slot_positions(config, CONTEXT, _longest_request(tiny_pair))}


def test_a_pool_keeps_room_for_the_prefixes_its_shards_share(tmp_path, tiny_pair, monkeypatch):
    """Ingest counts the positions of the prefixes each shard's prompts share; the worker's pool holds
    them beside its rows' slots (rows that take turns between prefixes: `test_prefix_reuse.py`)."""
    instructions = ["Answer in one word, and think about the question carefully before you answer it. " * 3,
                    "Translate the text that follows into French, keeping its punctuation and names. " * 3]
    records = [{"id": f"q{i}", "prompt": instructions[i % 2] + PROMPTS[i % 4], "max_new_tokens": 6}
               for i in range(6)]
    config = load_config(None, [*_overrides(tiny_pair), "scheduler.max_batch_rows=1", "io.shard_size=8"])
    prepare(write_jsonl(tmp_path / "data.jsonl", records), tmp_path / "job", config)
    (shard,) = load_manifest(tmp_path / "job").shards
    tokenizer = tiny_pair[2]
    ids = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in records]
    assert shard.shared_prefix_tokens == key_tree_positions(shared_prefix_keys(ids)) > 0
    assert worker.shared_prefix_tokens([shard, shard.model_copy(update={"shared_prefix_tokens": 0})]) == \
        shard.shared_prefix_tokens

    _run(tmp_path / "job", config, load_models(config), monkeypatch)
    rounds = read_table(tmp_path / "job", "rounds").to_pylist()
    slot = num_slot_positions(config, CONTEXT, shard.max_request_tokens)
    assert {r["kv_tokens_capacity"] for r in rounds} == {(slot + shard.shared_prefix_tokens) // 16 * 16}
