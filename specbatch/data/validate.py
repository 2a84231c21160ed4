"""Normalization and validation: one `RawRecord` in, one `Request` out, dropped or not.

A bad record never stops a job: it becomes a `Request` with a stable `drop_reason` code (the keys
of `DROP_REASONS`) and a human `drop_message`, and workers turn it into a `dropped` result without
model work. Request ids are unique across a job: a record without a readable id, and every later
occurrence of an id already used (`duplicate_id`), gets the positional id `rec-{position:09d}`.

Types are strict, because silent coercion hides broken producers: a boolean is not an integer, a
string "5" is not an integer, 5.0 is not an integer, NaN and infinity are not numbers. JSON `null`
means "not given" (the `SamplingDefaults` value applies), which also covers Parquet nulls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from specbatch.config import MAX_NEW_TOKENS, MAX_TEMPERATURE, SamplingDefaults
from specbatch.data.constraints import CONSTRAINT_FIELDS, ConstraintChecker, ConstraintError, parse_constraint
from specbatch.data.ingest import FIELDS, MAX_RECORD_BYTES, RawRecord
from specbatch.data.openai_params import RECORD_UNHONOURED, unhonoured
from specbatch.data.tool_calls import ToolCallError, tool_calls, without_tool_calls

_Split = tuple[dict[str, Any], dict[str, Any]]  # (known fields by our names, unknown fields)
COMPLETIONS_ENDPOINT = "/v1/completions"
CHAT_ENDPOINT = "/v1/chat/completions"
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_OPENAI_KEYS = frozenset({"custom_id", "method", "url", "body"})
_OPENAI_BODY_KEYS = frozenset(
    {"prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n",
     "response_format"}
)

DROP_REASONS: dict[str, str] = {
    "invalid_utf8": "the line's bytes are not UTF-8",
    "invalid_json": "the line is not one JSON value",
    "record_too_large": "the line is longer than the record size limit",
    "unreadable_row_group": "the Parquet row group holding the row cannot be read (a damaged page)",
    "invalid_csv_row": "the CSV row has more or fewer cells than the header",
    "not_an_object": "the record is valid JSON but not an object",
    "invalid_id": "id / custom_id is not a non-empty string or an integer",
    "duplicate_id": "an earlier record already used this id",
    "missing_prompt": "neither prompt nor messages is given",
    "prompt_and_messages": "both prompt and messages are given",
    "invalid_prompt": "prompt is not a string (nor, in an OpenAI batch body, a list of one string)",
    "empty_prompt": "prompt is empty or whitespace, or has no tokens",
    "invalid_messages": "messages is not a non-empty list of {role, content} objects (an assistant's with tool_calls)",
    "no_chat_template": "chat messages, but the tokenizer has no chat template (or there is no tokenizer)",
    "chat_template_error": "the chat template raised an error for these messages",
    "unrendered_tool_calls": "the messages' tool_calls, which the chat template does not write into the prompt",
    "invalid_unicode": "a text field holds a lone surrogate (e.g. an unpaired \\ud800 escape)",
    "invalid_max_new_tokens": "max_new_tokens is not an integer in [1, limit]",
    "invalid_temperature": "temperature is not a finite number in [0, 100]",
    "invalid_top_p": "top_p is not a finite number in (0, 1]",
    "invalid_seed": "seed is not an integer in [0, 2**63 - 1]",
    "invalid_stop": "stop is not a non-empty string or a short list of them",
    "invalid_domain": "domain is not a string",
    "invalid_metadata": "the unknown fields cannot be stored as JSON",
    "missing_custom_id": "an OpenAI batch line without custom_id",
    "unsupported_method": "an OpenAI batch line whose method is not POST",
    "unsupported_endpoint": "an OpenAI batch url other than /v1/completions or /v1/chat/completions",
    "invalid_body": "an OpenAI batch body that is not an object, or holds the other endpoint's input",
    "unsupported_parameter": "a parameter value specbatch cannot honour (n > 1, logprobs, tools, stream, ...)",
    "prompt_too_long": "the prompt has more tokens than the model context / KV capacity allows",
    "invalid_constraint": "response_format / json_schema / regex / choice / grammar is malformed or does not compile",
    "misnamed_field": "a field other engines read (max_tokens, guided_json, structured_outputs, ...) named apart",
}

# Fields other engines read (vLLM, SGLang, OpenAI) for what specbatch reads under another name. Kept as
# metadata, such a field would be ignored: a record asking for a schema would run unconstrained, one
# asking for 20 tokens would get the default. Where the record gives none of the fields it stands for
# (a length, or any constraint), it is dropped naming the field to use (as the OpenAI body's
# unhonoured parameters are).
_LENGTH_FIELDS = ("max_new_tokens",)
# field: (specbatch's name, or None for any constraint field; the fields it stands for)
MISNAMED_FIELDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "max_tokens": ("max_new_tokens", _LENGTH_FIELDS),
    "max_completion_tokens": ("max_new_tokens", _LENGTH_FIELDS),
    "guided_choice": ("choice", CONSTRAINT_FIELDS),
    "guided_json": ("json_schema", CONSTRAINT_FIELDS),
    "guided_regex": ("regex", CONSTRAINT_FIELDS),
    "guided_grammar": ("grammar", CONSTRAINT_FIELDS),
    "structured_outputs": (None, CONSTRAINT_FIELDS),
    "guided_decoding": (None, CONSTRAINT_FIELDS),
}
# Fields other engines read for one of ours that datasets also carry as data (a multiple-choice
# benchmark's `choices`, its answer options): kept as metadata, and the job warns once that they are
# not read (`Validator.kept_lookalikes`).
LOOKALIKE_FIELDS: dict[str, str] = {"choices": "choice"}


@dataclass(frozen=True)
class ValidationLimits:
    max_new_tokens_limit: int = MAX_NEW_TOKENS
    max_temperature: float = MAX_TEMPERATURE
    max_seed: int = 2**63 - 1
    max_stops: int = 16
    max_id_chars: int = 512
    max_record_bytes: int = MAX_RECORD_BYTES


@dataclass(slots=True)
class Request:
    """One normalized request: a shard row. Dropped requests keep only id, position and domain."""

    request_id: str
    position: int
    prompt: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    domain: str = ""
    endpoint: str | None = None
    metadata: str | None = None  # JSON object of the fields specbatch does not know
    drop_reason: str | None = None
    drop_message: str | None = None
    prompt_token_ids: list[int] | None = None
    num_prompt_tokens: int | None = None
    constraint: str | None = None  # structured output: a `data.constraints.Constraint` as JSON

    @property
    def is_dropped(self) -> bool:
        return self.drop_reason is not None


class Drop(Exception):
    """Raised inside validation; the record becomes a dropped `Request`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def positional_id(position: int) -> str:
    return f"rec-{position:09d}"


class Validator:
    """Turns raw records into requests, remembering ids already used (the only state that grows)."""

    def __init__(
        self,
        defaults: SamplingDefaults,
        *,
        openai_batch: bool = False,
        column_map: dict[str, str] | None = None,
        tokenizer: Any = None,
        limits: ValidationLimits | None = None,
    ) -> None:
        self.defaults = defaults
        self.openai_batch = openai_batch
        self.tokenizer = tokenizer
        self.limits = limits or ValidationLimits()
        self.sources = {name: (column_map or {}).get(name, name) for name in FIELDS}
        self.known_sources = frozenset(self.sources.values())
        self.is_identity_map = all(name == source for name, source in self.sources.items())
        self.seen_ids: set[str] = set()
        self.kept_lookalikes: set[str] = set()  # LOOKALIKE_FIELDS seen, kept as metadata
        self.constraints = ConstraintChecker(tokenizer)  # each distinct constraint compiled once

    def __call__(self, raw: RawRecord) -> Request:
        request = Request(request_id="", position=raw.position)
        try:
            if raw.drop_reason is not None:
                raise Drop(raw.drop_reason, raw.drop_message or raw.drop_reason)
            if not isinstance(raw.value, dict):
                raise Drop("not_an_object", f"record is {_describe(raw.value)}, not an object")
            fields, extra = self._split(raw.value, request)
            self._fill(request, fields)
            request.metadata = _metadata_json(extra)
        except Drop as drop:
            request = Request(
                request_id=request.request_id,
                position=raw.position,
                domain=request.domain,
                endpoint=request.endpoint,
                drop_reason=drop.reason,
                drop_message=drop.message[:500],
            )
        if not request.request_id:
            request.request_id = self._fallback_id(raw.position)
        self.seen_ids.add(request.request_id)
        return request

    def _split(self, record: dict[str, Any], request: Request) -> _Split:
        """(known fields by our names, unknown fields); sets the request's id and endpoint first."""
        if self.openai_batch:
            return self._split_openai(record, request)
        # fast paths (most records): no renaming, no unknown fields
        fields = record if self.is_identity_map else {name: record.get(s) for name, s in self.sources.items()}
        request.request_id = self._claim_id(fields.get("id"), "id", request.position)
        if record.keys() <= self.known_sources:
            return fields, {}
        extra = {key: value for key, value in record.items() if key not in self.known_sources}
        self._check_other_engines_fields(extra, fields)
        return fields, extra

    def _check_other_engines_fields(self, extra: dict[str, Any], fields: dict[str, Any]) -> None:
        """Drop a record that asks, under another engine's name, for what specbatch would not do;
        note a field that may be such a request or the record's data (`LOOKALIKE_FIELDS`)."""
        self.kept_lookalikes.update(extra.keys() & LOOKALIKE_FIELDS.keys())
        for key in sorted(extra.keys() & MISNAMED_FIELDS.keys()):
            ours, stands_for = MISNAMED_FIELDS[key]
            if extra[key] is not None and all(fields.get(name) is None for name in stands_for):
                hint = f"give it as one of {', '.join(stands_for)}" if ours is None else \
                    f"name it {ours} (or map it: --column {ours}={key})"
                raise Drop("misnamed_field", f"field {key!r} is not read by specbatch, which would ignore it: {hint}")
        if (refused := unhonoured(extra, RECORD_UNHONOURED)) is not None:  # as in an OpenAI body
            name, what = refused
            raise Drop("unsupported_parameter", f"field {name!r} ({_describe(extra[name])}) asks for {what}, which "
                                                "specbatch does not do; remove it or give its default")

    def _split_openai(self, record: dict[str, Any], request: Request) -> _Split:
        if record.get("custom_id") is None:
            raise Drop("missing_custom_id", "OpenAI batch line has no custom_id")
        request.request_id = self._claim_id(record["custom_id"], "custom_id", request.position)
        method, url, body = record.get("method"), record.get("url"), record.get("body")
        if method != "POST":
            raise Drop("unsupported_method", f"method must be POST, got {_describe(method)}")
        if url not in (COMPLETIONS_ENDPOINT, CHAT_ENDPOINT):
            raise Drop("unsupported_endpoint", f"url {_describe(url)} is not supported; use "
                       f"{COMPLETIONS_ENDPOINT} or {CHAT_ENDPOINT}")
        request.endpoint = url
        if not isinstance(body, dict):
            raise Drop("invalid_body", f"body must be an object, got {_describe(body)}")
        return _openai_fields(url, body), _openai_extra(record, body)

    def _fill(self, request: Request, fields: dict[str, Any]) -> None:
        """Check every known field; the chat template (the slowest step) runs last."""
        limits, defaults = self.limits, self.defaults
        request.domain = _domain(fields.get("domain"))
        request.max_new_tokens = _integer(
            fields.get("max_new_tokens"), "max_new_tokens", 1, limits.max_new_tokens_limit,
            defaults.max_new_tokens,
        )
        request.temperature = _number(
            fields.get("temperature"), "temperature", 0.0, limits.max_temperature, defaults.temperature
        )
        request.top_p = _top_p(fields.get("top_p"), defaults.top_p)
        request.seed = _integer(fields.get("seed"), "seed", 0, limits.max_seed, None)
        request.stop = _stops(fields.get("stop"), limits.max_stops)
        request.constraint = self._constraint(fields)
        request.prompt = self._prompt(fields.get("prompt"), fields.get("messages"))

    def _constraint(self, fields: dict[str, Any]) -> str | None:
        try:
            constraint = parse_constraint(fields)
            if constraint is not None:
                self.constraints.check(constraint)
        except ConstraintError as error:
            raise Drop("invalid_constraint", str(error)) from error
        return None if constraint is None else constraint.to_json()

    def _prompt(self, prompt: Any, messages: Any) -> str:
        if prompt is not None and messages is not None:
            raise Drop("prompt_and_messages", "give either prompt or messages, not both")
        if prompt is None and messages is None:
            raise Drop("missing_prompt", f"record has neither {self._named('prompt')} nor {self._named('messages')}")
        if messages is not None:
            return _checked_text(self._render_chat(_messages(messages)), "rendered chat prompt")
        if not isinstance(prompt, str):
            raise Drop("invalid_prompt", f"prompt must be a string, got {_describe(prompt)}")
        if not prompt.strip():
            raise Drop("empty_prompt", "prompt is empty or only whitespace")
        return _checked_text(prompt, "prompt")

    def _named(self, name: str) -> str:
        """A field as the record names it: a mapped field by its source column, which the user sees."""
        source = self.sources[name]
        return name if source == name else f"{name} (column {source!r})"

    def _render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The template's prompt. Messages with tool calls are rendered a second time without them: a
        template that writes none (most plain ones) gives the same text, which would run the
        conversation without its calls, so the record is dropped instead."""
        if self.tokenizer is None:
            raise Drop("no_chat_template", "chat messages need a tokenizer with a chat template; none given")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise Drop("no_chat_template", "chat messages, but the tokenizer has no chat template")
        try:
            text = self._apply_template(messages)
        except Exception as error:  # a template is user code: any error it raises is this record's problem
            message = f"chat template failed: {type(error).__name__}: {error}"
            raise Drop("chat_template_error", message) from error
        if not isinstance(text, str) or not text.strip():
            raise Drop("empty_prompt", "the chat template rendered an empty prompt")
        if any("tool_calls" in message for message in messages) and text == self._render_or_none(messages):
            raise Drop("unrendered_tool_calls", "the chat template does not write the messages' tool_calls into the "
                                                "prompt, which would run the conversation without them")
        return text

    def _apply_template(self, messages: list[dict[str, Any]]) -> Any:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _render_or_none(self, messages: list[dict[str, Any]]) -> str | None:
        """`messages` rendered without their tool calls; None if the template refuses them so."""
        try:
            return self._apply_template(without_tool_calls(messages))
        except Exception:  # a template may need content or calls in an assistant message: it renders the calls
            return None

    def _claim_id(self, value: Any, name: str, position: int) -> str:
        """The record's id (positional when absent); refuses ids that an earlier record used. A whole
        number stored as a float is the integer (pandas writes an integer id column with a missing
        value as float64: every id 1.0, 2.0, ... was `invalid_id`)."""
        if value is None:
            request_id = positional_id(position)
        elif type(value) is int or (type(value) is float and value.is_integer()):
            request_id = str(int(value))
        elif isinstance(value, str) and value.strip() and len(value) <= self.limits.max_id_chars:
            request_id = _checked_text(value, name)
        else:
            raise Drop("invalid_id", f"{name} must be a non-empty string (at most {self.limits.max_id_chars} "
                       f"characters) or an integer, got {_describe(value)}")
        if request_id in self.seen_ids:
            raise Drop("duplicate_id", f"{name} {request_id!r} was already used by an earlier record")
        return request_id

    def _fallback_id(self, position: int) -> str:
        """`rec-{position:09d}`, suffixed only if a record's own id already took that name."""
        base = request_id = positional_id(position)
        suffix = 0
        while request_id in self.seen_ids:
            suffix += 1
            request_id = f"{base}-{suffix}"
        return request_id


def _openai_fields(url: str, body: dict[str, Any]) -> dict[str, Any]:
    wanted, other = ("prompt", "messages") if url == COMPLETIONS_ENDPOINT else ("messages", "prompt")
    if other in body:
        raise Drop("invalid_body", f"{url} takes body.{wanted}, not body.{other}")
    n = body.get("n")
    if n is not None and (type(n) not in (int, float) or n != 1):  # 1.0 too, as a whole number is elsewhere
        raise Drop("unsupported_parameter", f"n must be 1 (one completion per request), got {_describe(n)}")
    if (refused := unhonoured(body)) is not None:
        name, what = refused
        raise Drop("unsupported_parameter", f"body.{name} ({_describe(body[name])}) asks for {what}, which specbatch "
                                            "does not do; remove it or give its default")
    _check_body_constraint_names(body)
    max_tokens = body.get("max_completion_tokens")
    return {
        wanted: _openai_prompt(body.get(wanted)) if wanted == "prompt" else body.get(wanted),
        "max_new_tokens": body.get("max_tokens") if max_tokens is None else max_tokens,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "seed": body.get("seed"),
        "stop": body.get("stop"),
        "response_format": body.get("response_format"),
    }


# A constraint in a batch body under another name than response_format: a JSON Lines record's own field
# (regex, choice, ...) or another engine's (vLLM's guided_json, structured_outputs, ...). Kept as the
# body's metadata, it would be ignored and the request would run unconstrained.
_BODY_CONSTRAINT_NAMES = tuple(name for name in CONSTRAINT_FIELDS if name != "response_format") + tuple(
    name for name, (_, stands_for) in MISNAMED_FIELDS.items() if stands_for == CONSTRAINT_FIELDS)


def _check_body_constraint_names(body: dict[str, Any]) -> None:
    if body.get("response_format") is not None:
        return  # the constraint is given where specbatch reads it (as a record beside guided_json is)
    named = next((name for name in _BODY_CONSTRAINT_NAMES if body.get(name) is not None), None)
    if named is not None:
        raise Drop("misnamed_field", f"body.{named} is not read by specbatch, which would ignore it and run the "
                                     "request unconstrained: a batch body's constraint is its response_format "
                                     "(json_schema or json_object); a regex, choice or grammar needs a JSON Lines "
                                     "record")


def _openai_prompt(prompt: Any) -> Any:
    """A completions body's prompt: OpenAI's list form of one string is that string. A list of several
    is as many prompts, each its own choice in OpenAI's answer; specbatch answers one prompt per request,
    so that is dropped saying so, as is a prompt of token ids (specbatch reads text)."""
    if not isinstance(prompt, list) or not prompt:
        return prompt  # a string, or what `_prompt` refuses
    if all(isinstance(item, str) for item in prompt):
        if len(prompt) == 1:
            return prompt[0]
        raise Drop("invalid_prompt", f"body.prompt is a list of {len(prompt)} prompts, which OpenAI answers as "
                                     f"{len(prompt)} choices; specbatch answers one prompt per request: give "
                                     "each prompt its own line and custom_id")
    if _token_ids(prompt) or all(isinstance(item, list) and _token_ids(item) for item in prompt):
        raise Drop("invalid_prompt", "body.prompt holds token ids; specbatch reads text prompts only, give it "
                                     "as a string")
    return prompt


def _token_ids(value: list[Any]) -> bool:
    return bool(value) and all(type(item) is int for item in value)


def _openai_extra(record: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """Unknown top-level keys, plus unknown body keys (model, user, ...) under "body"."""
    extra = {key: value for key, value in record.items() if key not in _OPENAI_KEYS}
    body_extra = {key: value for key, value in body.items() if key not in _OPENAI_BODY_KEYS}
    if body_extra:
        extra["body"] = body_extra
    return extra


def _integer(value: Any, name: str, low: int, high: int, default: int | None) -> int | None:
    """A whole number, 5.0 too: JSON writers and tables make floats of integers (pandas stores an
    integer column with a missing value as float64), and OpenAI-style servers accept them."""
    if value is None:
        return default
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise Drop(f"invalid_{name}", f"{name} must be an integer, got {_describe(value)}")
    if not low <= value <= high:
        raise Drop(f"invalid_{name}", f"{name} must be in [{low}, {high}], got {value}")
    return value


def _number(value: Any, name: str, low: float, high: float, default: float) -> float:
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(value):
        raise Drop(f"invalid_{name}", f"{name} must be a finite number, got {_describe(value)}")
    if not low <= value <= high:
        raise Drop(f"invalid_{name}", f"{name} must be in [{low:g}, {high:g}], got {value}")
    return float(value)


def _top_p(value: Any, default: float) -> float:
    top_p = _number(value, "top_p", 0.0, 1.0, default)
    if top_p == 0.0:
        raise Drop("invalid_top_p", "top_p must be in (0, 1], got 0")
    return top_p


def _stops(value: Any, max_stops: int) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
        message = f"stop must be a non-empty string or a list of them, got {_describe(value)}"
        raise Drop("invalid_stop", message)
    if len(stops) > max_stops:
        raise Drop("invalid_stop", f"at most {max_stops} stop strings, got {len(stops)}")
    return [_checked_text(stop, "stop") for stop in stops]


def _domain(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Drop("invalid_domain", f"domain must be a string, got {_describe(value)}")
    return _checked_text(value, "domain")


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise Drop("invalid_messages", f"messages must be a non-empty list, got {_describe(value)}")
    return [_message(index, message) for index, message in enumerate(value)]


def _message(index: int, message: Any) -> dict[str, Any]:
    """The keys a chat template reads: role, content, name, an assistant's tool calls (its content
    then may be null: the key is left out, as transformers' examples do) and a tool's `tool_call_id`.
    Each was dropped but role and content, so a template that writes one rendered another conversation
    than the record's; an empty name or id (as tables and some exports write for none) is none."""
    if not isinstance(message, dict):
        raise Drop("invalid_messages", f"messages[{index}] must be an object, got {_describe(message)}")
    role = message.get("role")
    if role not in ROLES:
        raise Drop("invalid_messages", f"messages[{index}].role must be one of {sorted(ROLES)}, "
                   f"got {_describe(role)}")
    calls = _tool_calls(index, role, message)
    checked: dict[str, Any] = {"role": role}
    if message.get("content") is not None or not calls:
        checked["content"] = _content(index, message.get("content"))
    if calls:
        checked["tool_calls"] = calls
    for key in ("name", "tool_call_id") if role == "tool" else ("name",):
        if (value := message.get(key)) not in (None, ""):
            checked[key] = _message_text(index, key, value)
    return checked


def _tool_calls(index: int, role: str, message: dict[str, Any]) -> list[dict[str, Any]]:
    if message.get("function_call") is not None:
        raise Drop("invalid_messages", f"messages[{index}].function_call is OpenAI's retired form of a tool call; "
                                       "give it as tool_calls")
    try:
        calls = tool_calls(f"messages[{index}].tool_calls", message.get("tool_calls"))
    except ToolCallError as error:
        raise Drop("invalid_messages", str(error)) from error
    if calls and role != "assistant":
        raise Drop("invalid_messages", f"messages[{index}] is a {role} message with tool_calls; only an "
                                       "assistant makes tool calls")
    return calls


def _message_text(index: int, key: str, value: Any) -> str:
    """A message's `name` (OpenAI's participant name) or `tool_call_id`, passed on as given."""
    if not isinstance(value, str):
        raise Drop("invalid_messages", f"messages[{index}].{key} must be a string, got {_describe(value)}")
    return _checked_text(value, f"messages[{index}].{key}")


def _content(index: int, content: Any) -> str:
    """A string, or OpenAI text parts [{"type": "text", "text": ...}] joined into one."""
    if isinstance(content, str):
        return content
    is_parts = isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )
    if not is_parts:
        raise Drop("invalid_messages", f"messages[{index}].content must be a string or a list of text "
                   f"parts, got {_describe(content)}")
    return "".join(part["text"] for part in content)


def _checked_text(text: str, name: str) -> str:
    """Lone surrogates (JSON "\\ud800") cannot be written as UTF-8; refuse them here."""
    if text.isascii():  # O(1) in CPython
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise Drop("invalid_unicode", f"{name} holds an unpaired surrogate at index {error.start}") from error
    return text


def _metadata_json(extra: dict[str, Any]) -> str | None:
    """Unknown fields as one JSON object; non-JSON values (NaN, bytes, dates) are made writable."""
    if not extra:
        return None
    try:
        text = json.dumps(extra, ensure_ascii=False, allow_nan=False, default=str)
        text.encode("utf-8")
        return text
    except (ValueError, UnicodeEncodeError, RecursionError):
        pass
    try:
        return json.dumps(_finite(extra), ensure_ascii=True, allow_nan=False, default=str)
    except (ValueError, RecursionError) as error:
        raise Drop("invalid_metadata", f"unknown fields cannot be stored as JSON: {error}") from error


def _finite(value: Any) -> Any:
    """NaN / infinity (valid in Python's JSON, not in JSON) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", str: "string", list: "a list", dict: "an object"}
    kind = names.get(type(value), type(value).__name__)
    shown = repr(value)
    return f"{kind} {shown[:60]}{'...' if len(shown) > 60 else ''}"
