"""Ingest and validation: every input record becomes exactly one shard row, bad ones with a reason.

These tests run without a tokenizer (chat records are dropped as `no_chat_template`); tokenization,
chat rendering and `prompt_too_long` are in test_shards.py.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specbatch.config import JobConfig, SamplingDefaults
from specbatch.data import ingest
from specbatch.data.ingest import DatasetError, RawRecord, detect_format, resolve_dataset
from specbatch.data.shards import read_shard, shard_dataset
from specbatch.data.validate import DROP_REASONS, Request, ValidationLimits, Validator, positional_id

DATA = Path(__file__).parent / "data"
CONFIG = JobConfig()
USER_HI = [{"role": "user", "content": "hi"}]


def jl(**fields: object) -> bytes:
    return json.dumps(fields).encode()


# (line, expected drop_reason or None for a good record). Blank lines make no record.
JSONL_CORPUS: list[tuple[bytes, str | None]] = [
    (jl(id="good-1", prompt="hello world"), None),
    (jl(prompt="no id: positional id", domain="code"), None),
    (jl(id=42, prompt="all fields", max_new_tokens=16, temperature=0.7, top_p=0.9, seed=7,
        stop=["\n\n", "END"], extra={"a": 1}), None),
    (jl(id="good-4", prompt="stop as a string", stop="###"), None),
    (jl(id="good-5", prompt="nulls take defaults", max_new_tokens=None, temperature=None, seed=None,
        stop=None, domain=None, top_p=None), None),
    ('{"id": "good-6", "prompt": "unicode \u2713 \u6f22\u5b57 \U0001f600"}'.encode(), None),
    (jl(id="good-7", prompt="integer temperature and top_p", temperature=1, top_p=1), None),
    (b'{"id": "good-8", "prompt": "NaN in unknown fields", "score": NaN}', None),
    (b"", None),  # blank: skipped
    (b"   \t ", None),  # whitespace only: skipped
    (b"{not json", "invalid_json"),
    (b'{"prompt": "trailing comma",}', "invalid_json"),
    (b"[" * 5000, "invalid_json"),  # nesting deeper than the parser allows
    (b'{"prompt": "a", "seed": ' + b"1" * 5000 + b"}", "invalid_json"),  # over the int digit limit
    (b'{"prompt": "bad bytes \xc3\x28"}', "invalid_utf8"),
    (b"[1, 2, 3]", "not_an_object"),
    (b'"just a string"', "not_an_object"),
    (b"null", "not_an_object"),
    (jl(id="bad-prompt-missing"), "missing_prompt"),
    (jl(prompt=None), "missing_prompt"),
    (jl(prompt=""), "empty_prompt"),
    (jl(prompt="  \n "), "empty_prompt"),
    (jl(prompt=5), "invalid_prompt"),
    (jl(prompt=["a", "b"]), "invalid_prompt"),
    (jl(prompt="a", messages=USER_HI), "prompt_and_messages"),
    (jl(messages="hi"), "invalid_messages"),
    (jl(messages=[]), "invalid_messages"),
    (jl(messages=[{"role": "wizard", "content": "x"}]), "invalid_messages"),
    (jl(messages=[{"role": "user", "content": 5}]), "invalid_messages"),
    (jl(messages=["user: hi"]), "invalid_messages"),
    (jl(messages=[{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]), "invalid_messages"),
    (jl(messages=USER_HI), "no_chat_template"),
    (jl(prompt="a", max_new_tokens=True), "invalid_max_new_tokens"),
    (jl(prompt="a", max_new_tokens="5"), "invalid_max_new_tokens"),
    (jl(prompt="a", max_new_tokens=5.5), "invalid_max_new_tokens"),
    (jl(prompt="a", max_new_tokens=5.0), None),  # a whole number written as a float
    (jl(prompt="a", seed=7.25), "invalid_seed"),
    (jl(prompt="a", max_new_tokens=0), "invalid_max_new_tokens"),
    (jl(prompt="a", max_new_tokens=10**7), "invalid_max_new_tokens"),
    (b'{"prompt": "a", "temperature": NaN}', "invalid_temperature"),
    (b'{"prompt": "a", "temperature": Infinity}', "invalid_temperature"),
    (b'{"prompt": "a", "temperature": 1e999}', "invalid_temperature"),
    (jl(prompt="a", temperature=-0.5), "invalid_temperature"),
    (jl(prompt="a", temperature=101), "invalid_temperature"),
    (jl(prompt="a", temperature="0.7"), "invalid_temperature"),
    (jl(prompt="a", temperature=False), "invalid_temperature"),
    (jl(prompt="a", top_p=0), "invalid_top_p"),
    (jl(prompt="a", top_p=1.5), "invalid_top_p"),
    (jl(prompt="a", seed=-1), "invalid_seed"),
    (jl(prompt="a", seed=2**64), "invalid_seed"),
    (jl(prompt="a", seed=False), "invalid_seed"),
    (jl(prompt="a", stop=5), "invalid_stop"),
    (jl(prompt="a", stop=["ok", 3]), "invalid_stop"),
    (jl(prompt="a", stop=""), "invalid_stop"),
    (jl(prompt="a", stop=[f"s{i}" for i in range(17)]), "invalid_stop"),
    (jl(prompt="a", domain=3), "invalid_domain"),
    (jl(id=True, prompt="a"), "invalid_id"),
    (jl(id=1.5, prompt="a"), "invalid_id"),
    (jl(id="", prompt="a"), "invalid_id"),
    (jl(id=["x"], prompt="a"), "invalid_id"),
    (jl(id="x" * 600, prompt="a"), "invalid_id"),
    (jl(id="good-1", prompt="the same id again"), "duplicate_id"),
    (jl(id=42, prompt="int id 42 is string '42'"), "duplicate_id"),
    (b'{"prompt": "lone surrogate \\ud800 here"}', "invalid_unicode"),
    (b'{"prompt": "ok", "stop": ["\\udfff"]}', "invalid_unicode"),
    (b'{"id": "big", "prompt": "' + b"x" * 12_000 + b'"}', "record_too_large"),
    (jl(id="after-big", prompt="read fine after a skipped line"), None),
]
LIMITS = ValidationLimits(max_record_bytes=10_000)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def shard_rows(job_dir: Path) -> list[dict]:
    shards = sorted((job_dir / "shards").glob("*.parquet"))
    rows = [row for shard in shards for row in read_shard(shard).to_pylist()]
    return sorted(rows, key=lambda row: row["position"])


def run(dataset: Path, tmp_path: Path, **kwargs: object) -> list[dict]:
    job_dir = tmp_path / "job"
    shard_dataset(dataset, job_dir, CONFIG, **kwargs)
    return shard_rows(job_dir)


def expect_rows(rows: list[dict], corpus: list[tuple[bytes, str | None]]) -> None:
    """One row per non-blank line, at that line's position, dropped exactly when expected."""
    records = [(pos, reason) for pos, (line, reason) in enumerate(corpus) if line.strip()]
    assert [row["position"] for row in rows] == [pos for pos, _ in records]
    for row, (position, reason) in zip(rows, records, strict=True):
        assert row["drop_reason"] == reason, (position, corpus[position][0][:80], row["drop_message"])
        assert (row["drop_message"] is None) == (reason is None)
        assert (row["prompt"] is None) == (reason is not None)
    assert len({row["request_id"] for row in rows}) == len(rows), "request ids must be unique"


def test_jsonl_corpus_of_bad_records(tmp_path: Path) -> None:
    rows = run(write_lines(tmp_path / "d.jsonl", [line for line, _ in JSONL_CORPUS]), tmp_path, limits=LIMITS)
    expect_rows(rows, JSONL_CORPUS)
    assert len({reason for _, reason in JSONL_CORPUS if reason}) >= 19
    assert {row["drop_reason"] for row in rows if row["drop_reason"]} <= DROP_REASONS.keys()
    by_id = {row["request_id"]: row for row in rows}
    assert by_id["rec-000000001"]["domain"] == "code"
    assert by_id["42"]["stop"] == ["\n\n", "END"] and by_id["42"]["seed"] == 7
    assert json.loads(by_id["42"]["metadata"]) == {"extra": {"a": 1}}
    assert json.loads(by_id["good-8"]["metadata"]) == {"score": None}
    assert by_id["good-4"]["stop"] == ["###"]
    defaults = by_id["good-5"]
    assert (defaults["max_new_tokens"], defaults["temperature"], defaults["top_p"]) == (128, 0.0, 1.0)
    assert defaults["seed"] is None and defaults["stop"] == [] and defaults["domain"] == ""
    assert by_id["good-6"]["prompt"].endswith("\U0001f600")
    assert by_id["bad-prompt-missing"]["drop_reason"] == "missing_prompt"  # readable id is kept
    for reason in ("invalid_json", "record_too_large", "invalid_id"):  # ids that could not be read
        row = next(row for row in rows if row["drop_reason"] == reason)
        assert row["request_id"] == positional_id(row["position"])


def test_duplicate_rows_get_positional_ids(tmp_path: Path) -> None:
    lines = [jl(id="a", prompt="x"), jl(id="a", prompt="y"), jl(id="rec-000000003", prompt="z"),
             jl(prompt="w")]
    rows = run(write_lines(tmp_path / "d.jsonl", lines), tmp_path)
    assert [(r["request_id"], r["drop_reason"]) for r in rows] == [
        ("a", None),
        ("rec-000000001", "duplicate_id"),
        ("rec-000000003", None),
        ("rec-000000003-1", "duplicate_id"),  # its positional id was taken by an explicit id
    ]


def test_ids_are_stable_across_runs(tmp_path: Path) -> None:
    dataset = write_lines(tmp_path / "d.jsonl", [line for line, _ in JSONL_CORPUS])
    first = [(r["position"], r["request_id"]) for r in run(dataset, tmp_path, limits=LIMITS)]
    shutil.rmtree(tmp_path / "job")
    assert [(r["position"], r["request_id"]) for r in run(dataset, tmp_path, limits=LIMITS)] == first


def test_utf8_bom_and_crlf(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"\xef\xbb\xbf" + jl(prompt="first") + b"\r\n" + jl(prompt="second") + b"\r\n")
    rows = run(dataset, tmp_path)
    assert [(r["prompt"], r["drop_reason"]) for r in rows] == [("first", None), ("second", None)]


def test_cr_only_line_endings_give_one_record_per_line(tmp_path: Path) -> None:
    """Classic Mac OS ends lines with CR alone: read up to each newline the whole file was one line, one
    `invalid_json` row for every record in it. Each CR ends a line, as LF does; blank lines stay none."""
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"\xef\xbb\xbf" + jl(id="a", prompt="first") + b"\r" + b"{not json\r\r"
                        + jl(id="c", prompt="third", stop=["\r\n"]) + b"\r" + b'{"id": "big", "prompt": "'
                        + b"x" * 12_000 + b'"}\r' + jl(id="e", prompt="after big"))
    rows = run(dataset, tmp_path, limits=LIMITS)
    assert [(r["position"], r["request_id"], r["prompt"], r["drop_reason"]) for r in rows] == [
        (0, "a", "first", None), (1, positional_id(1), None, "invalid_json"), (3, "c", "third", None),
        (4, positional_id(4), None, "record_too_large"), (5, "e", "after big", None)]


def test_cr_only_openai_batch_file_is_detected_as_one(tmp_path: Path) -> None:
    dataset = tmp_path / "batch.jsonl"
    bodies = [jl(custom_id=f"c-{i}", method="POST", url="/v1/completions", body={"prompt": f"p{i}"})
              for i in range(2)]
    dataset.write_bytes(b"\r".join(bodies) + b"\r")
    assert detect_format(dataset) == "openai_batch"
    assert [(r["request_id"], r["prompt"]) for r in run(dataset, tmp_path)] == [("c-0", "p0"), ("c-1", "p1")]


@pytest.mark.parametrize(("content", "cr_only"), [
    (b"x" * 10 + b"\r\n", False),  # the size limit cuts the CRLF after its CR
    (b"x" * 10 + b"\ry", True), (b"x" * 25 + b"\ry", True),  # a first line past the limit decides at its end
    (b"x" * 25 + b"\n\r", False), (b"x\r", True), (b"x", False), (b"", False),
])
def test_which_files_end_their_lines_with_cr(content: bytes, cr_only: bool) -> None:
    assert ingest._ends_lines_with_cr(io.BytesIO(content), 10) is cr_only


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_a_stray_cr_inside_a_line_of_an_lf_or_crlf_file_splits_nothing(tmp_path: Path, ending: bytes) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b'{"id": "a",\r"prompt": "first"}' + ending + jl(id="b", prompt="second") + ending)
    rows = run(dataset, tmp_path)
    assert [(r["position"], r["request_id"], r["drop_reason"]) for r in rows] == [(0, "a", None), (1, "b", None)]


def test_files_joined_with_cat_keep_each_ones_bom_out_of_its_first_record(tmp_path: Path) -> None:
    """`cat a.jsonl b.jsonl` of files an editor saved with a BOM puts one at the start of a later line:
    read as JSON it made that record `invalid_json` ("Unexpected UTF-8 BOM"), a good request lost."""
    bom = b"\xef\xbb\xbf"
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(bom + jl(id="a", prompt="first") + b"\n" + bom + jl(id="b", prompt="second") + b"\n"
                        + bom + b"\n")
    rows = run(dataset, tmp_path)
    assert [(r["request_id"], r["prompt"], r["drop_reason"]) for r in rows] == [("a", "first", None),
                                                                               ("b", "second", None)]


@pytest.mark.parametrize("content", [b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n\n  \n"])
def test_a_bom_and_blank_lines_hold_no_record(tmp_path: Path, content: bytes) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(content)
    assert run(dataset, tmp_path) == []


def test_a_bom_before_a_blank_first_line_is_not_a_record(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"\xef\xbb\xbf\n" + jl(id="x", prompt="hi") + b"\n")
    rows = run(dataset, tmp_path)
    assert [(r["request_id"], r["position"], r["drop_reason"]) for r in rows] == [("x", 1, None)]


def test_a_bracket_alone_past_the_first_record_is_one_invalid_line(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b'{"id": "a", "prompt": "x"}\n{\n' + jl(id="b", prompt="y") + b"\n")
    assert [r["drop_reason"] for r in run(dataset, tmp_path)] == [None, "invalid_json", None]


def test_line_without_newline_over_the_limit(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(jl(prompt="ok") + b"\n" + b"y" * 25_000)
    rows = run(dataset, tmp_path, limits=LIMITS)
    assert [r["drop_reason"] for r in rows] == [None, "record_too_large"]


OPENAI_CORPUS: list[tuple[bytes, str | None]] = [
    (jl(custom_id="c-1", method="POST", url="/v1/completions",
        body={"model": "m", "prompt": "Once", "max_tokens": 5, "temperature": 0.5, "stop": ["\n"]}), None),
    (jl(custom_id="c-2", method="POST", url="/v1/completions",
        body={"prompt": "Twice", "max_completion_tokens": 9, "max_tokens": 3, "n": 1}), None),
    (jl(custom_id="c-3", method="POST", url="/v1/chat/completions", body={"messages": USER_HI}),
     "no_chat_template"),
    (jl(method="POST", url="/v1/completions", body={"prompt": "x"}), "missing_custom_id"),
    (jl(custom_id="c-5", method="GET", url="/v1/completions", body={"prompt": "x"}), "unsupported_method"),
    (jl(custom_id="c-6", method="POST", url="/v1/embeddings", body={"input": "x"}), "unsupported_endpoint"),
    (jl(custom_id="c-7", method="POST", url="/v1/completions", body="prompt"), "invalid_body"),
    (jl(custom_id="c-8", method="POST", url="/v1/completions", body={"messages": USER_HI}), "invalid_body"),
    (jl(custom_id="c-9", method="POST", url="/v1/chat/completions", body={"prompt": "x"}), "invalid_body"),
    (jl(custom_id="c-10", method="POST", url="/v1/completions", body={"prompt": "x", "n": 2}),
     "unsupported_parameter"),
    (jl(custom_id="c-1", method="POST", url="/v1/completions", body={"prompt": "again"}), "duplicate_id"),
    (jl(custom_id={"a": 1}, method="POST", url="/v1/completions", body={"prompt": "x"}), "invalid_id"),
    (jl(custom_id="c-13", method="POST", url="/v1/completions", body={"prompt": [1, 2]}), "invalid_prompt"),
    (jl(custom_id="c-14", method="POST", url="/v1/completions", body={"prompt": "x", "max_tokens": 0}),
     "invalid_max_new_tokens"),
    (b"not json", "invalid_json"),
    # what specbatch does not return is refused by name, not answered without it (issue 44)
    (jl(custom_id="c-16", method="POST", url="/v1/chat/completions",
        body={"messages": USER_HI, "logprobs": True, "top_logprobs": 3}), "unsupported_parameter"),
    (jl(custom_id="c-17", method="POST", url="/v1/completions", body={"prompt": "x", "logprobs": 0}),
     "unsupported_parameter"),
    (jl(custom_id="c-18", method="POST", url="/v1/chat/completions",
        body={"messages": USER_HI, "tools": [{"type": "function", "function": {"name": "f"}}]}),
     "unsupported_parameter"),
    (jl(custom_id="c-19", method="POST", url="/v1/completions", body={"prompt": "x", "stream": True}),
     "unsupported_parameter"),
    (jl(custom_id="c-20", method="POST", url="/v1/completions", body={"prompt": "x", "presence_penalty": 0.5}),
     "unsupported_parameter"),
    (jl(custom_id="c-21", method="POST", url="/v1/completions",  # defaults ask for nothing: kept as metadata
        body={"prompt": "x", "logprobs": False, "stream": False, "tools": [], "presence_penalty": 0,
              "tool_choice": "none", "user": "u"}), None),
]


@pytest.mark.parametrize(("body", "named"), [
    ({"logprobs": True}, "body.logprobs (boolean True) asks for log probabilities"),
    ({"top_logprobs": 5}, "body.top_logprobs"), ({"echo": True}, "body.echo"), ({"best_of": 3}, "body.best_of"),
    ({"stream": True, "stream_options": {"include_usage": True}},
     "body.stream (boolean True) asks for a streamed response"),
    ({"tool_choice": "required"}, "body.tool_choice"), ({"functions": [{"name": "f"}]}, "body.functions"),
    ({"frequency_penalty": -1.0}, "body.frequency_penalty"), ({"logit_bias": {"50256": -100}}, "body.logit_bias"),
    ({"top_k": 40}, "body.top_k"), ({"modalities": ["text", "audio"]}, "body.modalities"),
])
def test_an_openai_parameter_specbatch_does_not_honour_drops_its_record_by_name(body, named) -> None:
    from specbatch.config import SamplingDefaults

    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", **body}}
    request = Validator(SamplingDefaults(), openai_batch=True)(RawRecord(0, line))
    assert request.drop_reason == "unsupported_parameter" and named in (request.drop_message or ""), request


@pytest.mark.parametrize("named", ["guided_json", "structured_outputs", "json_schema", "regex", "choice"])
def test_an_openai_body_constraint_named_other_than_response_format_drops_its_record(named) -> None:
    value = {"type": "integer"} if named in ("guided_json", "json_schema", "structured_outputs") else ["a"]
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", named: value}}
    request = Validator(SamplingDefaults(), openai_batch=True)(RawRecord(0, line))
    assert request.drop_reason == "misnamed_field" and f"body.{named} is not read" in (request.drop_message or "")
    line["body"]["response_format"] = {"type": "json_object"}  # given where specbatch reads it: the other is metadata
    request = Validator(SamplingDefaults(), openai_batch=True)(RawRecord(0, line))
    assert request.drop_reason is None and request.constraint is not None and named in (request.metadata or "")


@pytest.mark.parametrize(("n", "reason"), [(1, None), (1.0, None), (2, "unsupported_parameter"),
                                           (1.5, "unsupported_parameter"), (True, "unsupported_parameter")])
def test_an_openai_body_asks_for_one_completion_with_n_one_written_either_way(n, reason) -> None:
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "n": n}}
    assert Validator(SamplingDefaults(), openai_batch=True)(RawRecord(0, line)).drop_reason == reason


def completions(prompt: object) -> Request:
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt}}
    return Validator(SamplingDefaults(), openai_batch=True)(RawRecord(0, line))


def test_an_openai_prompt_given_as_a_list_of_one_string_is_that_prompt() -> None:
    """OpenAI accepts `prompt: ["..."]`; it was dropped as `invalid_prompt` (prompt must be a string)."""
    request = completions(["Once upon"])
    assert (request.drop_reason, request.prompt) == (None, "Once upon"), request.drop_message


@pytest.mark.parametrize(("prompt", "named"), [
    (["one", "two"], "a list of 2 prompts, which OpenAI answers as 2 choices; specbatch answers one prompt"),
    ([1, 2], "token ids"), ([[1, 2]], "token ids"),
    ([], "prompt must be a string"), ([""], "empty"), (["a", 5], "prompt must be a string"),
])
def test_an_openai_prompt_list_that_is_not_one_text_prompt_is_dropped_saying_why(prompt, named) -> None:
    request = completions(prompt)
    assert request.drop_reason in ("invalid_prompt", "empty_prompt") and named in (request.drop_message or ""), request


@pytest.mark.parametrize(("record", "named"), [
    ({"max_tokens": 20}, "name it max_new_tokens (or map it: --column max_new_tokens=max_tokens)"),
    ({"guided_choice": ["a"]}, "name it choice"),
    ({"guided_json": {"type": "object"}}, "name it json_schema"), ({"guided_regex": "[0-9]+"}, "name it regex"),
    ({"structured_outputs": {"choice": ["a"]}}, "one of response_format, json_schema, regex, choice, grammar"),
])
def test_another_engines_field_for_what_specbatch_names_otherwise_drops_its_record(record, named) -> None:
    """Kept as metadata it would be ignored: a constraint run unconstrained, a length at the default."""
    from specbatch.config import SamplingDefaults

    validate = Validator(SamplingDefaults())
    request = validate(RawRecord(0, {"id": "r", "prompt": "x", **record}))
    assert request.drop_reason == "misnamed_field" and named in (request.drop_message or ""), request
    assert request.request_id == "r"


@pytest.mark.parametrize("record", [
    {"max_tokens": 20, "max_new_tokens": 8},  # our field given: the other is metadata, as any unknown field
    {"guided_json": None}, {"guided_choice": ["a", "b"], "choice": ["a", "b"]}, {"guided_json": {}, "regex": "a+"},
])
def test_another_engines_field_beside_ours_or_null_is_metadata(record) -> None:
    from specbatch.config import SamplingDefaults

    request = Validator(SamplingDefaults())(RawRecord(0, {"id": "r", "prompt": "x", **record}))
    assert request.drop_reason is None, request.drop_message
    extra = {key: value for key, value in record.items() if key not in ("max_new_tokens", "choice", "regex")}
    assert json.loads(request.metadata or "{}") == extra


@pytest.mark.parametrize(("record", "named"), [
    ({"top_k": 40}, "field 'top_k' (int 40) asks for top-k sampling"),
    ({"repetition_penalty": 1.2}, "field 'repetition_penalty'"),
    ({"presence_penalty": 0.5}, "field 'presence_penalty'"),
    ({"min_p": 0.05}, "field 'min_p'"), ({"ignore_eos": True}, "field 'ignore_eos'"),
    ({"min_tokens": 16}, "field 'min_tokens'"), ({"stop_token_ids": [2]}, "field 'stop_token_ids'"),
])
def test_a_records_sampling_knob_specbatch_does_not_apply_drops_it_by_name(record, named) -> None:
    """vLLM's offline records carry these as fields: kept as metadata, `top_k: 40` ran without top-k and
    nobody knew. As in an OpenAI body, the record is dropped naming the field."""
    request = Validator(SamplingDefaults())(RawRecord(0, {"id": "r", "prompt": "x", "temperature": 0.8, **record}))
    assert request.drop_reason == "unsupported_parameter" and named in (request.drop_message or ""), request
    assert request.request_id == "r"


@pytest.mark.parametrize("record", [
    {"top_k": -1, "repetition_penalty": 1.0, "presence_penalty": 0, "ignore_eos": False, "min_tokens": 0,
     "stop_token_ids": []},  # their defaults ask for nothing
    {"logprobs": [-0.1, -2.3], "n": 3, "tools": [{"type": "function"}]},  # as often a dataset's data as a request
])
def test_a_records_knob_at_its_default_or_a_field_that_may_be_data_is_metadata(record) -> None:
    request = Validator(SamplingDefaults())(RawRecord(0, {"id": "r", "prompt": "x", **record}))
    assert request.drop_reason is None, request.drop_message
    assert json.loads(request.metadata or "{}") == record


def test_a_choices_field_is_data_as_often_as_a_request_so_it_is_kept_and_the_job_warns(tmp_path: Path, caplog) -> None:
    """A multiple-choice benchmark carries its answer options as `choices`; vLLM reads the field as a
    choice constraint. Kept as metadata, with one warning naming specbatch's field."""
    lines = [jl(id=f"q{i}", prompt="2 + 2 =", choices=["3", "4"]) for i in range(3)]
    with caplog.at_level("WARNING", logger="specbatch.data.shards"):
        rows = run(write_lines(tmp_path / "d.jsonl", lines), tmp_path)
    assert [row["drop_reason"] for row in rows] == [None] * 3
    assert json.loads(rows[0]["metadata"]) == {"choices": ["3", "4"]}
    warnings = [record.getMessage() for record in caplog.records if "'choices'" in record.getMessage()]
    assert len(warnings) == 1 and "'choice'" in warnings[0], warnings
    unread: dict[str, str] = {}
    shard_dataset(write_lines(tmp_path / "d.jsonl", lines), tmp_path / "again", CONFIG, unread_fields=unread)
    assert unread == {"choices": "choice"}  # what the job's summary names (`DatasetInfo.unread_fields`)


def test_a_column_map_reads_another_engines_field() -> None:
    from specbatch.config import SamplingDefaults

    request = Validator(SamplingDefaults(), column_map={"max_new_tokens": "max_tokens"})(
        RawRecord(0, {"id": "r", "prompt": "x", "max_tokens": 20}))
    assert request.drop_reason is None and request.max_new_tokens == 20


def test_a_missing_prompt_names_the_column_it_was_mapped_from() -> None:
    request = Validator(SamplingDefaults(), column_map={"prompt": "text"})(RawRecord(0, {"prompt": "unread"}))
    assert request.drop_reason == "missing_prompt"
    assert request.drop_message == "record has neither prompt (column 'text') nor messages"


def test_openai_batch_corpus(tmp_path: Path) -> None:
    dataset = write_lines(tmp_path / "batch.jsonl", [line for line, _ in OPENAI_CORPUS])
    assert detect_format(dataset) == "openai_batch"
    rows = run(dataset, tmp_path)
    expect_rows(rows, OPENAI_CORPUS)
    by_id = {row["request_id"]: row for row in rows}
    first = by_id["c-1"]
    assert (first["prompt"], first["max_new_tokens"], first["temperature"]) == ("Once", 5, 0.5)
    assert first["endpoint"] == "/v1/completions" and first["stop"] == ["\n"]
    assert json.loads(first["metadata"]) == {"body": {"model": "m"}}
    assert by_id["c-2"]["max_new_tokens"] == 9  # max_completion_tokens wins over max_tokens
    assert by_id["c-3"]["endpoint"] == "/v1/chat/completions"
    assert by_id["rec-000000003"]["drop_reason"] == "missing_custom_id"


def test_openai_batch_fixture_file() -> None:
    assert detect_format(DATA / "openai_batch.jsonl") == "openai_batch"
    assert detect_format(DATA / "records.jsonl") == "jsonl"


def parquet_table() -> pa.Table:
    return pa.table({
        "id": ["p-0", None, "p-2", "p-3", "p-0", "p-5", "p-6"],
        "prompt": ["alpha", "beta", None, "", "dup", "gamma", "delta"],
        "max_new_tokens": [4, None, 4, 4, 4, 0, 8],
        "temperature": [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, float("nan")],
        "domain": ["prose", "code", None, "code", "code", "code", "code"],
        "source": ["s0", "s1", "s2", "s3", "s4", "s5", "s6"],
    })


def test_parquet_corpus_across_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "BATCH_ROWS", 3)
    dataset = tmp_path / "d.parquet"
    pq.write_table(parquet_table(), dataset, row_group_size=2)
    rows = run(dataset, tmp_path)
    expected = [None, None, "missing_prompt", "empty_prompt", "duplicate_id", "invalid_max_new_tokens", None]
    assert [row["drop_reason"] for row in rows] == expected
    assert rows[6]["temperature"] == CONFIG.sampling.temperature  # a table's NaN is a missing value
    assert [row["position"] for row in rows] == list(range(7))
    assert rows[1]["request_id"] == "rec-000000001" and rows[1]["temperature"] == 0.5
    assert rows[4]["request_id"] == "rec-000000004"
    assert json.loads(rows[0]["metadata"]) == {"source": "s0"}


def test_a_tables_schema_column_holds_each_rows_schema_as_its_json_text(tmp_path: Path) -> None:
    """A table cannot hold schemas of different shapes as objects (a struct column gives each row every
    row's keys, null where it had none); as JSON text they are each their own."""
    schemas = [{"type": "integer", "minimum": 3}, {"type": "object", "properties": {"a": {"type": "string"}}}]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "json_schema": [*map(json.dumps, schemas), "{not json"]}), path)
    rows = run(path, tmp_path)
    assert [json.loads(json.loads(row["constraint"])["text"]) for row in rows[:2]] == schemas
    assert rows[2]["drop_reason"] == "invalid_constraint" and "not JSON" in rows[2]["drop_message"]


def test_parquet_written_by_pandas_has_no_index_metadata(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    dataset = tmp_path / "d.parquet"
    pandas.DataFrame({"prompt": ["a", "b"]}, index=[5, 9]).to_parquet(dataset)
    assert [row["metadata"] for row in run(dataset, tmp_path)] == [None, None]


def test_parquet_written_by_pandas_with_missing_numbers(tmp_path: Path) -> None:
    """pandas stores an integer column with a missing value as float64, the missing one as NaN: the
    whole numbers are read as integers and NaN as missing (the default), not as a bad value."""
    pandas = pytest.importorskip("pandas")
    dataset = tmp_path / "d.parquet"
    pandas.DataFrame({"prompt": ["a", "b", "c"], "max_new_tokens": [4, None, 7],
                      "temperature": [None, 0.5, None]}).to_parquet(dataset)
    rows = run(dataset, tmp_path)
    assert [row["drop_reason"] for row in rows] == [None, None, None]
    assert [row["max_new_tokens"] for row in rows] == [4, CONFIG.sampling.max_new_tokens, 7]
    assert [row["temperature"] for row in rows] == [CONFIG.sampling.temperature, 0.5, CONFIG.sampling.temperature]


def test_parquet_written_by_pandas_with_a_missing_id(tmp_path: Path) -> None:
    """An integer id column with a missing value is float64 in pandas: its ids are the integers (every
    record was dropped as `invalid_id` for 1.0, 2.0), the missing one positional; 1.5 stays invalid."""
    pandas = pytest.importorskip("pandas")
    dataset = tmp_path / "d.parquet"
    pandas.DataFrame({"id": [7, None, 9, 2.5], "prompt": ["a", "b", "c", "d"]}).to_parquet(dataset)
    rows = run(dataset, tmp_path)
    assert [(row["request_id"], row["drop_reason"]) for row in rows] == [
        ("7", None), ("rec-000000001", None), ("9", None), ("rec-000000003", "invalid_id")]


def test_parquet_chat_messages_column(tmp_path: Path) -> None:
    dataset = tmp_path / "chat.parquet"
    pq.write_table(pa.table({"id": ["m"], "messages": [USER_HI]}), dataset)
    assert [row["drop_reason"] for row in run(dataset, tmp_path)] == ["no_chat_template"]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    rows = run(DATA / "records.jsonl", tmp_path)
    source = [json.loads(line) for line in (DATA / "records.jsonl").read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [record["prompt"] for record in source]
    assert all(row["drop_reason"] is None for row in rows)


def test_hf_saved_dataset_with_column_map(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    data = {"idx": [10, 11, 12], "text": ["one", "two", ""], "prompt": ["x", "y", "z"]}
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "saved"))
    assert detect_format(tmp_path / "saved") == "hf_saved"
    rows = run(tmp_path / "saved", tmp_path, column_map={"prompt": "text", "id": "idx"})
    assert [(r["request_id"], r["prompt"], r["drop_reason"]) for r in rows] == [
        ("10", "one", None), ("11", "two", None), ("12", None, "empty_prompt")
    ]
    assert json.loads(rows[0]["metadata"]) == {"prompt": "x"}  # the unmapped column is kept as metadata


def test_hf_saved_dataset_dict_uses_train_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    splits = {"train": datasets.Dataset.from_dict({"prompt": ["a", "b"]}),
              "test": datasets.Dataset.from_dict({"prompt": ["c"]})}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    assert [row["prompt"] for row in run(tmp_path / "dd", tmp_path)] == ["a", "b"]
    assert ingest.unread_splits(resolve_dataset(tmp_path / "dd")) == ["test"]  # prepare says so (test_config_drift)
    assert [row["prompt"] for row in run(tmp_path / "dd" / "test", tmp_path / "t")] == ["c"]  # a split's folder


def test_hf_local_csv_with_column_map(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    dataset = tmp_path / "d.csv"
    dataset.write_text("idx,text,max_new_tokens\n7,hello there,3\n8,second,5\n")
    assert detect_format(dataset) == "hf:csv"
    rows = run(dataset, tmp_path, column_map={"prompt": "text", "id": "idx"})
    assert [(r["request_id"], r["prompt"], r["max_new_tokens"]) for r in rows] == [
        ("7", "hello there", 3), ("8", "second", 5)
    ]


def test_csv_cells_are_the_files_text_except_in_the_number_fields(tmp_path: Path) -> None:
    """A guessing reader made id `001` the integer 1 (then `1` a duplicate of it), `1e3` 1000 and a
    prompt `NA` a missing one; the sampling numbers still read as numbers, an empty cell as missing."""
    dataset = tmp_path / "d.csv"
    dataset.write_text("id,prompt,max_new_tokens,temperature,zip\n"
                       "001,NA,3,0.5,02134\n"
                       "1,hello,,,\n"
                       '007,"null",5.0,1e-1,007\n'
                       "1e3,1e3,NA,0,\n"
                       "0x10,True,,nan,x\n"
                       ",no id,2,,\n")
    rows = run(dataset, tmp_path)
    tokens, temperature = CONFIG.sampling.max_new_tokens, CONFIG.sampling.temperature  # the defaults
    assert [(r["request_id"], r["prompt"], r["max_new_tokens"], r["temperature"], r["drop_reason"]) for r in rows] == [
        ("001", "NA", 3, 0.5, None), ("1", "hello", tokens, temperature, None), ("007", "null", 5, 0.1, None),
        ("1e3", "1e3", tokens, 0.0, None), ("0x10", "True", tokens, temperature, None),
        ("rec-000000005", "no id", 2, temperature, None)]
    assert [json.loads(r["metadata"])["zip"] for r in rows] == ["02134", None, "007", None, "x", None]


def test_a_csv_id_column_mapped_by_column_is_its_text(tmp_path: Path) -> None:
    dataset = tmp_path / "d.csv"
    dataset.write_text("key,text,id\n001,first,5\n1,second,6\n")
    rows = run(dataset, tmp_path, column_map={"id": "key", "prompt": "text"})
    assert [(r["request_id"], r["prompt"], json.loads(r["metadata"])) for r in rows] == [
        ("001", "first", {"id": "5"}), ("1", "second", {"id": "6"})]


def test_a_csv_row_of_the_wrong_width_is_dropped_in_its_place_and_the_rest_run(tmp_path: Path) -> None:
    """A row with a cell too many or too few refused the whole file (exit 2, nothing run), where the
    reader before pyarrow filled a short row with blanks; each is now `invalid_csv_row` at its position,
    blank lines and cells quoted across lines not counted as rows, the file's last rows too."""
    dataset = tmp_path / "d.csv"
    dataset.write_text('id,prompt\na,"first\nsecond line"\nb,one,two\n\nc,third\nd\ne,"fifth"\nf,x,y\ng\n')
    rows = run(dataset, tmp_path)
    assert [(r["request_id"], r["prompt"], r["drop_reason"]) for r in rows] == [
        ("a", "first\nsecond line", None), ("rec-000000001", None, "invalid_csv_row"), ("c", "third", None),
        ("rec-000000003", None, "invalid_csv_row"), ("e", "fifth", None), ("rec-000000005", None, "invalid_csv_row"),
        ("rec-000000006", None, "invalid_csv_row")]
    message = rows[1]["drop_message"]
    assert "row 3 of " in message and "has 3 cells where its header has 2: b,one,two" in message


def test_a_bad_number_in_a_csv_drops_its_own_record_only(tmp_path: Path) -> None:
    """Typed by pyarrow, one `abc` in the first block made the whole max_new_tokens column text (every
    record dropped as invalid_max_new_tokens), and a `5.5` past it refused the whole file; each cell of
    a number field is now read on its own."""
    dataset = tmp_path / "d.csv"
    rows_text = ["id,prompt,max_new_tokens,temperature", "a,one,3,0", "b,two,abc,0.5", "c,three,4,NA"]
    rows_text += [f"n{i},filler,2,1" for i in range(60000)] + ["z,last,5.5,1e-1", "y,inf temperature,2,inf"]
    dataset.write_text("\n".join(rows_text) + "\n")
    rows = run(dataset, tmp_path)
    assert len(rows) == 60005
    picked = {r["request_id"]: (r["max_new_tokens"], r["temperature"], r["drop_reason"]) for r in rows}
    temperature = CONFIG.sampling.temperature
    assert picked["a"] == (3, 0.0, None) and picked["c"] == (4, temperature, None)
    assert picked["n59999"] == (2, 1.0, None)
    assert picked["b"][2] == picked["z"][2] == "invalid_max_new_tokens"
    assert picked["y"][2] == "invalid_temperature"


def test_a_csv_of_prompts_spanning_lines_is_read_past_pyarrows_first_block(tmp_path: Path) -> None:
    """Without `newlines_in_values`, a 2 MB file of prompts quoted across lines stopped at pyarrow's first
    block boundary (its parser "got out of sync with chunker"): exit 2 after 14,717 of 30,000 records."""
    dataset = tmp_path / "d.csv"
    prompt = '"line one of {}\nline two, with a comma\n""quoted"" three"'
    lines = ["id,prompt"] + [f"{i:05d},{prompt.format(i)}" for i in range(30000)]
    dataset.write_text("\n".join(lines) + "\n")
    records = list(ingest.iter_records(resolve_dataset(dataset)))
    assert len(records) == 30000 and all(r.drop_reason is None for r in records)
    assert records[-1].value == {"id": "29999", "prompt": 'line one of 29999\nline two, with a comma\n"quoted" three'}


def test_hf_local_json_builder(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    dataset = write_lines(tmp_path / "d.jsonl", [jl(q="first?", n=1), jl(q="second?", n=2)])
    rows = run(dataset, tmp_path, dataset_format="hf:json", column_map={"prompt": "q", "id": "n"})
    assert [(r["request_id"], r["prompt"]) for r in rows] == [("1", "first?"), ("2", "second?")]


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "message"),
    [
        ("missing.jsonl", None, {}, "not found"),
        ("d.txt", b"hello", {}, "cannot tell the format"),
        ("d.jsonl", b"{}", {"dataset_format": "xml"}, "unknown dataset format"),
        ("d.jsonl", b"{}", {"column_map": {"promt": "text"}}, "unknown fields"),
        ("d.parquet", b"not parquet", {}, "not a readable Parquet file"),
        ("d.json", b'[{"prompt": "a"},\n {"prompt": "b"}]', {}, "JSON array"),
        ("d.jsonl", b"\xff\xfe{\x00}\x00", {}, "UTF-16"),
        # without a BOM every line was `invalid_json`, and one more row than records (the last "\n\x00")
        ("d.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n'.encode("utf-16-le"), {}, "NUL bytes: UTF-16"),
        ("d.jsonl", '{"prompt": "a"}\n'.encode("utf-16-be"), {"dataset_format": "jsonl"}, "NUL bytes: UTF-16"),
        ("d.jsonl", '{"prompt": "a"}\n'.encode("utf-32"), {}, "UTF-32 encoded"),  # was named UTF-16
        ("d.jsonl.gz", gzip.compress(b'{"prompt": "a"}\n'), {"dataset_format": "jsonl"}, "gzip-compressed"),
        # a quote left open mid-file takes every record after it into one cell: refused, on one line
        ("d.csv", b'prompt,max_new_tokens\nhello,3\n"unterminated,4\nnext,5\nmore,6\n', {},
         r"d.csv as CSV.*Row #3: Expected 2 columns, got 1: \"unterminated,4\\nnext,5\\nmore,6$"),
        ("batch.jsonl", jl(custom_id="a", body={}), {"column_map": {"prompt": "p"}}, "OpenAI"),
        # pretty-printed JSON: read line by line, every line was an invalid_json row and no record ran
        ("d.jsonl", json.dumps({"prompt": "a"}, indent=2).encode() * 2, {}, "spread over several lines.*'{'"),
        ("d.jsonl", b"\xef\xbb\xbf\n  \r\n" + json.dumps([{"prompt": "a"}], indent=2).encode(),
         {"dataset_format": "jsonl"}, "spread over several lines.*'\\['"),
        ("d.json", json.dumps({"custom_id": "a", "body": {}}, indent=1).encode(), {}, "spread over several lines"),
    ],
)
def test_unusable_datasets_raise(
    tmp_path: Path, name: str, content: bytes | None, kwargs: dict, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DatasetError, match=message):
        shard_dataset(path, tmp_path / "job", CONFIG, **kwargs)
    assert not (tmp_path / "job").exists(), "nothing is written for an unusable dataset"


def damage_row_group(path: Path, group: int) -> None:
    """Overwrite the middle half of row group `group`'s first column chunk (its pages), leaving the
    footer sound."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(0)
    first = chunk.dictionary_page_offset or chunk.data_page_offset
    size = chunk.total_compressed_size
    data = bytearray(path.read_bytes())
    data[first + size // 4 : first + 3 * size // 4] = b"\xab" * (3 * size // 4 - size // 4)
    path.write_bytes(bytes(data))


def test_a_damaged_parquet_row_group_drops_its_rows_and_the_others_run(tmp_path: Path) -> None:
    """One damaged row group stopped the whole job (exit 2, nothing run); now its rows are dropped,
    each by its position, naming the row group, and the other groups' rows run."""
    dataset = tmp_path / "d.parquet"
    prompts = [f"prompt number {i} " * 20 for i in range(3000)]
    pq.write_table(pa.table({"prompt": prompts}), dataset, row_group_size=1000, compression="none")
    damage_row_group(dataset, 1)
    resolve_dataset(dataset)  # the footer is fine
    rows = run(dataset, tmp_path)
    assert [row["position"] for row in rows] == list(range(3000))
    good, damaged = rows[:1000] + rows[2000:], rows[1000:2000]
    assert [row["prompt"] for row in good] == prompts[:1000] + prompts[2000:]
    assert all(row["drop_reason"] is None for row in good)
    assert [row["request_id"] for row in damaged] == [positional_id(position) for position in range(1000, 2000)]
    assert {row["drop_reason"] for row in damaged} == {"unreadable_row_group"}
    assert damaged[7]["drop_message"].startswith(f"row 7 of row group 1 in {dataset} cannot be read: ")
    assert run(dataset, tmp_path / "again") == rows  # a rerun (a resumed ingest) cuts the same rows


class FailingStream(io.RawIOBase):
    """A file's bytes whose reads of `failing` (a range of offsets) raise `error`: a stream that fails."""

    def __init__(self, data: bytes, failing: range, error: Exception) -> None:
        super().__init__()
        self.data, self.failing, self.error = io.BytesIO(data), failing, error

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.data.seek(offset, whence)

    def tell(self) -> int:
        return self.data.tell()

    def readinto(self, buffer: Any) -> int:
        start = self.data.tell()
        if start < self.failing.stop and start + len(buffer) > self.failing.start:
            raise self.error
        return self.data.readinto(buffer)


def test_a_parquet_stream_that_fails_stops_the_read_instead_of_dropping_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout is not damage: dropping the rows would lose them for good; the job stops (exit 2)."""
    dataset = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": [f"prompt number {i} " * 20 for i in range(3000)]}), dataset,
                   row_group_size=1000, compression="none")  # the footer's read (its last 64 KiB) is of group 2
    data = dataset.read_bytes()
    second = pq.ParquetFile(dataset).metadata.row_group(1).column(0)
    middle = (second.dictionary_page_offset or second.data_page_offset) + second.total_compressed_size // 2
    failing = range(middle, middle + 1)
    source = resolve_dataset(dataset)
    monkeypatch.setattr(ingest, "open_input",
                        lambda path: io.BufferedReader(FailingStream(data, failing, TimeoutError("timed out"))))
    with pytest.raises(DatasetError, match="d.parquet as Parquet after record 1000: timed out"):
        list(ingest.iter_records(source))


def test_a_parquet_file_whose_footer_is_damaged_is_refused(tmp_path: Path) -> None:
    dataset = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"]}), dataset)
    data = bytearray(dataset.read_bytes())
    data[-40:-8] = b"\xab" * 32  # the footer's metadata; its length and magic number stay
    dataset.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="d.parquet is not a readable Parquet file"):
        shard_dataset(dataset, tmp_path / "job", CONFIG)
    assert not (tmp_path / "job").exists()


def test_data_files_whose_columns_differ_are_a_dataset_error(tmp_path: Path) -> None:
    """The dataset's problem, not an internal one; refused before anything is read."""
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["a", "b"]}), folder / "part-0.parquet")
    pq.write_table(pa.table({"prompt": ["c"], "id": [5]}), folder / "part-1.parquet")
    with pytest.raises(DatasetError, match=r"columns differ: .*part-0.parquet has \['prompt'\], .*part-1.parquet has"):
        run(folder, tmp_path)
    assert not (tmp_path / "job").exists()


def test_a_damaged_row_group_in_a_folder_of_parquet_files_drops_its_rows(tmp_path: Path) -> None:
    """As in one file: the damaged group's rows are dropped by their position in the dataset, the
    message naming the part file, and every other row runs."""
    folder = tmp_path / "table"
    folder.mkdir()
    prompts = [f"prompt number {i} " * 20 for i in range(2000)]
    pq.write_table(pa.table({"prompt": prompts[:1000]}), folder / "part-0.parquet", compression="none")
    pq.write_table(pa.table({"prompt": prompts[1000:]}), folder / "part-1.parquet", row_group_size=500,
                   compression="none")
    damage_row_group(folder / "part-1.parquet", 0)
    rows = run(folder, tmp_path)
    assert [row["position"] for row in rows] == list(range(2000))
    assert [row["prompt"] for row in rows[:1000] + rows[1500:]] == prompts[:1000] + prompts[1500:]
    damaged = rows[1000:1500]
    assert [row["request_id"] for row in damaged] == [positional_id(position) for position in range(1000, 1500)]
    assert {row["drop_reason"] for row in damaged} == {"unreadable_row_group"}
    assert damaged[0]["drop_message"].startswith(f"row 0 of row group 0 in {folder / 'part-1.parquet'} cannot be read")


def test_a_folder_of_parquet_files_is_one_dataset_in_name_order(tmp_path: Path) -> None:
    """As Spark, pandas or polars write a table: part files, Spark's `_SUCCESS` and hidden `.crc` files
    beside them, which are not data (datasets' builder failed on `_SUCCESS` as a 0-byte Parquet file)."""
    pytest.importorskip("datasets")
    folder = tmp_path / "table"
    folder.mkdir()
    pq.write_table(pa.table({"prompt": ["b1"], "max_new_tokens": [3]}), folder / "part-1.parquet")
    pq.write_table(pa.table({"prompt": ["a1", "a2"], "max_new_tokens": [1, 2]}), folder / "part-0.parquet")
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-0.parquet.crc").write_bytes(b"crc")
    assert detect_format(folder) == "hf:parquet"
    rows = run(folder, tmp_path)
    assert [(r["position"], r["prompt"], r["max_new_tokens"], r["drop_reason"]) for r in rows] == [
        (0, "a1", 1, None), (1, "a2", 2, None), (2, "b1", 3, None)]


def test_table_column_problems_raise(tmp_path: Path) -> None:
    dataset = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a"]}), dataset)
    with pytest.raises(DatasetError, match="no prompt column"):
        resolve_dataset(dataset)
    with pytest.raises(DatasetError, match="not found"):
        resolve_dataset(dataset, column_map={"prompt": "txt"})
    assert resolve_dataset(dataset, column_map={"prompt": "text"}).format == "parquet"
    (tmp_path / "plain_dir").mkdir()
    with pytest.raises(DatasetError, match="not a saved Hugging Face dataset"):
        resolve_dataset(tmp_path / "plain_dir")


def test_validator_defaults_come_from_config() -> None:
    config = JobConfig.model_validate({"sampling": {"max_new_tokens": 7, "temperature": 0.3, "top_p": 0.5}})
    request = Validator(config.sampling)(RawRecord(0, {"prompt": "p"}))
    assert (request.max_new_tokens, request.temperature, request.top_p) == (7, 0.3, 0.5)
    assert request.request_id == "rec-000000000" and not request.is_dropped


def test_the_job_summary_names_each_field_it_kept_unread_beside_the_field_specbatch_reads() -> None:
    from specbatch.job.finalize import JobSummary
    from specbatch.job.flow import summary_markdown, summary_to_dict

    summary = JobSummary("outputs/j", 3, 2, 1, 0, 12, {"malformed_json": 1}, {"choices": "choice"})
    assert summary.rows()[-2:] == [("dropped: malformed_json", 1),
                                   ("not read: choices", "kept as metadata; specbatch reads choice")]
    markdown = summary_markdown(summary_to_dict(summary))  # the run's artifact: the same lines
    assert "| not read: choices | kept as metadata; specbatch reads choice |" in markdown
    assert "| dropped: malformed_json | 1 |" in markdown
