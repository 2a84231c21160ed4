"""Shards: fixed schema, grouping, sizes, tokenization and chat rendering with a tiny tokenizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from job_helpers import write_jsonl
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specbatch.config import JobConfig
from specbatch.data.shards import (
    SHARD_SCHEMA,
    PromptEncoder,
    read_shard,
    read_shard_requests,
    shard_dataset,
    window_size,
)

DATA = Path(__file__).parent / "data"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WORDS = ["hello", "world", "the", "river", "bends", "def", "add", "return", "a", "b", "for", "i", "in",
         "range", "once", "upon", "time"]


def build_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: one token per whitespace-separated word, `<unk>` for unknown words."""
    vocab = {word: index for index, word in enumerate(["<unk>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def config(shard_size: int = 256, group_window: int = 4096) -> JobConfig:
    return JobConfig.model_validate({"io": {"shard_size": shard_size, "group_window": group_window}})


def all_rows(job_dir: Path) -> list[dict]:
    shards = sorted((job_dir / "shards").glob("*.parquet"))
    return [row for shard in shards for row in read_shard(shard).to_pylist()]


EXPECTED_COLUMNS = [
    ("request_id", pa.string(), False),
    ("position", pa.int64(), False),
    ("prompt", pa.string(), True),
    ("prompt_token_ids", pa.list_(pa.int32()), True),
    ("num_prompt_tokens", pa.int32(), True),
    ("max_new_tokens", pa.int32(), True),
    ("temperature", pa.float64(), True),
    ("top_p", pa.float64(), True),
    ("seed", pa.int64(), True),
    ("stop", pa.list_(pa.string()), True),
    ("domain", pa.string(), False),
    ("endpoint", pa.string(), True),
    ("metadata", pa.string(), True),
    ("drop_reason", pa.string(), True),
    ("drop_message", pa.string(), True),
    ("constraint", pa.string(), True),
]


def test_shard_schema_column_by_column(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    shards = shard_dataset(DATA / "records.jsonl", tmp_path / "job", config(), tokenizer=tokenizer)
    schema = read_shard(tmp_path / "job" / "shards" / shards[0].name).schema
    assert [(f.name, f.type, f.nullable) for f in schema] == EXPECTED_COLUMNS
    assert [(f.name, f.type, f.nullable) for f in SHARD_SCHEMA] == EXPECTED_COLUMNS


def test_grouping_sizes_and_counts(tmp_path: Path) -> None:
    domains = ["prose", "code", "math"]
    records = [{"id": f"r{i}", "prompt": "x" * (1 + i * 7 % 11), "domain": domains[i % 3]} for i in range(22)]
    records[5]["temperature"] = -1  # dropped rows go last within their window
    shards = shard_dataset(write_jsonl(tmp_path / "d.jsonl", records), tmp_path / "job", config(4, 8))
    assert [shard.num_records for shard in shards] == [4, 4, 4, 4, 4, 2]
    assert sum(shard.num_dropped for shard in shards) == 1
    rows = all_rows(tmp_path / "job")
    assert sorted(row["position"] for row in rows) == list(range(22))
    for start in range(0, 22, 8):  # each window holds its own records, sorted by the group key
        window = rows[start : start + 8]
        assert {row["position"] for row in window} == set(range(start, min(start + 8, 22)))
        keys = [(row["drop_reason"] is not None, row["domain"], len(row["prompt"] or ""), row["position"])
                for row in window]
        assert keys == sorted(keys)
    assert rows[7]["request_id"] == "r5" and rows[7]["drop_reason"] == "invalid_temperature"


def test_window_rounds_up_to_whole_shards() -> None:
    assert window_size(config(4, 6).io) == 8
    assert window_size(config(256, 100).io) == 256
    assert window_size(config(4, 8).io) == 8


def test_tokenization_and_prompt_too_long(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    records = [
        {"id": "short", "prompt": "hello world"},
        {"id": "long", "prompt": "the river bends once upon a time"},
        {"id": "exact", "prompt": "def add a b"},
        {"id": "unknown", "prompt": "zebra"},
    ]
    dataset = write_jsonl(tmp_path / "d.jsonl", records)
    shard_dataset(dataset, tmp_path / "job", config(), tokenizer=tokenizer, max_prompt_tokens=4)
    rows = {row["request_id"]: row for row in all_rows(tmp_path / "job")}
    expected = tokenizer("hello world", add_special_tokens=False)["input_ids"]
    assert rows["short"]["prompt_token_ids"] == expected and rows["short"]["num_prompt_tokens"] == 2
    assert rows["exact"]["num_prompt_tokens"] == 4 and rows["exact"]["drop_reason"] is None
    assert rows["unknown"]["prompt_token_ids"] == [0]
    long = rows["long"]
    assert long["drop_reason"] == "prompt_too_long" and long["num_prompt_tokens"] == 7
    assert long["prompt_token_ids"] is None and long["prompt"] == records[1]["prompt"]
    assert long["max_new_tokens"] is None


def test_chat_rendering_and_template_problems(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    text_parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    records = [
        {"id": "chat", "messages": messages},
        {"id": "parts", "messages": [{"role": "user", "content": text_parts}]},
    ]
    dataset = write_jsonl(tmp_path / "d.jsonl", records)
    shard_dataset(dataset, tmp_path / "job", config(), tokenizer=tokenizer)
    rows = {row["request_id"]: row for row in all_rows(tmp_path / "job")}
    assert rows["chat"]["prompt"] == "system: be brief\nuser: hello\nassistant: "
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rows["chat"]["prompt"] == rendered
    assert rows["chat"]["num_prompt_tokens"] == len(rows["chat"]["prompt_token_ids"]) > 0
    assert rows["parts"]["prompt"] == "user: hello world\nassistant: "

    raising = "{{ raise_exception('roles must alternate') }}"
    for template, reason in [(None, "no_chat_template"), (raising, "chat_template_error")]:
        broken = copy.deepcopy(tokenizer)
        broken.chat_template = template
        job_dir = tmp_path / f"job-{reason}"
        shard_dataset(dataset, job_dir, config(), tokenizer=broken)
        assert [row["drop_reason"] for row in all_rows(job_dir)] == [reason, reason]


def test_a_messages_name_reaches_the_chat_template(tmp_path: Path) -> None:
    """OpenAI's `name` on a message was dropped before the template: one that writes it rendered every
    speaker as unnamed. Records without a name (or with an empty one) render as before."""
    named = build_tokenizer(
        "{% for message in messages %}{{ message['role'] }}{% if message.name is defined %} "
        "[{{ message.name }}]{% endif %}: {{ message['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    records = [
        {"id": "named", "messages": [{"role": "user", "content": "hello", "name": "ada"},
                                     {"role": "assistant", "content": "hi", "name": "bot"}]},
        {"id": "plain", "messages": [{"role": "user", "content": "hello"}]},
        {"id": "empty", "messages": [{"role": "user", "content": "hello", "name": ""}]},
        {"id": "bad", "messages": [{"role": "user", "content": "hello", "name": 5}]},
    ]
    shard_dataset(write_jsonl(tmp_path / "d.jsonl", records), tmp_path / "job", config(), tokenizer=named)
    rows = {row["request_id"]: row for row in all_rows(tmp_path / "job")}
    assert rows["named"]["prompt"] == "user [ada]: hello\nassistant [bot]: hi\nassistant: "
    assert rows["plain"]["prompt"] == rows["empty"]["prompt"] == "user: hello\nassistant: "
    assert rows["bad"]["drop_reason"] == "invalid_messages" and "name must be a string" in rows["bad"]["drop_message"]


TOOL_TEMPLATE = (
    "{% for message in messages %}{{ message.role }}:{% if message.content %} {{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %} <call {{ call.id }}>{{ call.function.name }}"
    "({{ call.function.arguments | tojson }})</call>{% endfor %}"
    "{% if message.tool_call_id %} [for {{ message.tool_call_id }}]{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER_CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_CHAT = [{"role": "user", "content": "weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": "18C"}]


def test_tool_calls_reach_the_chat_template_or_drop_their_record(tmp_path: Path) -> None:
    """An assistant's tool_calls and a tool message's tool_call_id were dropped before the template (a
    null content with them made the record invalid_messages); now the template gets them, arguments as
    the JSON object, and a template that writes no tool calls drops the record instead of running the
    conversation without them. A Parquet messages column (every key in every message) renders alike."""
    as_object = {**WEATHER_CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    records = [
        {"id": "call", "messages": TOOL_CHAT},
        {"id": "object", "messages": [TOOL_CHAT[0], {"role": "assistant", "tool_calls": [as_object]}, TOOL_CHAT[2]]},
        {"id": "not-json", "messages": [{"role": "assistant", "tool_calls": [
            {**WEATHER_CALL, "function": {"name": "get_weather", "arguments": "{city"}}]}]},
        {"id": "user-calls", "messages": [{"role": "user", "content": "hi", "tool_calls": [WEATHER_CALL]}]},
    ]
    dataset = write_jsonl(tmp_path / "d.jsonl", records)
    tools = build_tokenizer(TOOL_TEMPLATE)
    shard_dataset(dataset, tmp_path / "job", config(), tokenizer=tools)
    rows = {row["request_id"]: row for row in all_rows(tmp_path / "job")}
    expected = ('user: weather in Paris?\nassistant: <call c1>get_weather({"city": "Paris"})</call>\n'
                "tool: 18C [for c1]\nassistant: ")
    assert rows["call"]["prompt"] == rows["object"]["prompt"] == expected
    assert rows["not-json"]["drop_reason"] == "invalid_messages"
    assert "messages[0].tool_calls[0].function.arguments is not JSON" in rows["not-json"]["drop_message"]
    assert rows["user-calls"]["drop_reason"] == "invalid_messages"

    shard_dataset(dataset, tmp_path / "plain", config(), tokenizer=build_tokenizer())  # writes role and content only
    plain = {row["request_id"]: row for row in all_rows(tmp_path / "plain")}
    assert plain["call"]["drop_reason"] == plain["object"]["drop_reason"] == "unrendered_tool_calls"

    table = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "call", "messages": TOOL_CHAT}]), table)
    shard_dataset(table, tmp_path / "table", config(), tokenizer=tools)
    assert [row["prompt"] for row in all_rows(tmp_path / "table")] == [expected]


def test_openai_batch_chat_round_trip(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    shard_dataset(DATA / "openai_batch.jsonl", tmp_path / "job", config(), tokenizer=tokenizer)
    rows = {row["request_id"]: row for row in all_rows(tmp_path / "job")}
    completion, chat = rows["request-1"], rows["request-2"]
    assert (completion["endpoint"], completion["prompt"], completion["max_new_tokens"]) == (
        "/v1/completions", "def fib(n):", 64
    )
    assert chat["endpoint"] == "/v1/chat/completions" and chat["max_new_tokens"] == 16
    assert chat["prompt"] == "system: You are terse.\nuser: Name a prime.\nassistant: "
    assert json.loads(chat["metadata"]) == {"body": {"model": "demo"}}


def test_read_shard_requests_round_trip(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    shards = shard_dataset(DATA / "records.jsonl", tmp_path / "job", config(), tokenizer=tokenizer)
    requests = read_shard_requests(tmp_path / "job" / "shards" / shards[0].name)
    by_id = {request.request_id: request for request in requests}
    assert by_id["r-2"].seed == 1234 and by_id["r-2"].top_p == 0.95 and by_id["r-3"].stop == ["\n\n"]
    assert all(not request.is_dropped for request in requests)


def test_rerun_replaces_stale_shards(tmp_path: Path) -> None:
    shards_dir = tmp_path / "job" / "shards"
    shards_dir.mkdir(parents=True)
    (shards_dir / "shard-00099.parquet").write_bytes(b"stale")
    (shards_dir / "shard-00000.parquet.tmp").write_bytes(b"half written")
    shards = shard_dataset(DATA / "records.jsonl", tmp_path / "job", config())
    assert sorted(path.name for path in shards_dir.iterdir()) == [shard.name for shard in shards]


class _PlainTokenizer:
    """A tokenizer without a Rust backend: the encoder must use its own call."""

    def __call__(self, texts: list[str], **kwargs: object) -> dict[str, list[list[int]]]:
        return {"input_ids": [[len(word) for word in text.split()] for text in texts]}


def test_prompt_encoder_paths(tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["hello world", "once upon a time", "zebra"]
    fast = PromptEncoder(tokenizer)
    assert fast.encode(texts) == tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert fast.backend is not None
    plain = PromptEncoder(_PlainTokenizer())
    assert plain.encode(texts) == [[5, 5], [4, 4, 1, 4], [5]] and plain.backend is None
    assert plain.encode([]) == []


def test_records_sharing_a_prefix_sort_together_and_others_keep_their_length_order():
    from specbatch.data.prefix_groups import shared_prefix_keys

    first, second = list(range(100, 164)), list(range(200, 264))
    prompts = [first + [1], list(range(40)), second + [2, 3], first + [4, 5], second + [6], [7] * 3, None]
    keys = shared_prefix_keys(prompts)
    assert keys[0] == keys[3] == tuple(first) and keys[2] == keys[4] == tuple(second)
    assert keys[1] == keys[5] == keys[6] == ()  # nothing shared: no key, grouped by length as before
    assert shared_prefix_keys([first[:40] + [1], first[:40] + [2]]) == [tuple(first[:32])] * 2  # whole blocks


def test_shared_prefixes_count_once_as_one_tree():
    from specbatch.data.prefix_groups import key_tree_positions

    first = tuple(range(100, 164))
    assert key_tree_positions([first, first, first[:32], (), tuple(range(64))]) == 64 + 64
    assert key_tree_positions([]) == 0
