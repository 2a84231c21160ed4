"""OpenAI batch body parameters that specbatch does not honour, and the values that ask for nothing.

A request that asks for something specbatch does not return (log probabilities, tool calls, a stream,
penalties it does not apply) must not come back `200` without it: its record is dropped with
`unsupported_parameter` and a message naming the parameter, as `n > 1` is. A parameter at its
default (`logprobs: false`, `presence_penalty: 0`, `tools: []`, ...) asks for nothing and is kept
in the record's metadata like `model` or `user`, which change nothing either. Parameters that
specbatch honours (`max_tokens`, `temperature`, `top_p`, `seed`, `stop`, `response_format`, `n: 1`)
are read by `specbatch.data.validate`. A JSON Lines record is held to the same rule for the sampling
knobs among them (`RECORD_UNHONOURED`: `top_k`, `repetition_penalty`, ...), which a dataset never
carries as data: kept as metadata, `top_k: 40` would run without top-k, and nobody would know.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def _given(value: Any) -> bool:
    return value is not None


def _true(value: Any) -> bool:
    return value is not None and value is not False


def _nonempty(value: Any) -> bool:
    return value is not None and value != [] and value != {}


def _nonzero(value: Any) -> bool:
    return value is not None and not (type(value) in (int, float) and value == 0)


def _not_one(value: Any) -> bool:
    return value is not None and not (type(value) in (int, float) and value == 1)


def _chooses(value: Any) -> bool:
    """A tool or function choice other than none or auto (which, without tools, choose nothing)."""
    return value is not None and value not in ("none", "auto")


# parameter -> (does this value ask for something, what it asks for)
UNHONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "logprobs": (_true, "log probabilities"),
    "top_logprobs": (_nonzero, "log probabilities"),
    "echo": (_true, "the prompt echoed back"),
    "best_of": (_not_one, "several candidates per request"),
    "suffix": (lambda value: value is not None and value != "", "text after the completion"),
    "stream": (_true, "a streamed response"),
    "stream_options": (_given, "a streamed response"),
    "tools": (_nonempty, "tool calls"),
    "tool_choice": (_chooses, "tool calls"),
    "functions": (_nonempty, "function calls"),
    "function_call": (_chooses, "function calls"),
    "presence_penalty": (_nonzero, "a presence penalty"),
    "frequency_penalty": (_nonzero, "a frequency penalty"),
    "repetition_penalty": (_not_one, "a repetition penalty"),
    "logit_bias": (_nonempty, "a logit bias"),
    "top_k": (lambda value: value is not None and value not in (0, -1), "top-k sampling"),
    "min_p": (_nonzero, "min-p sampling"),
    "min_tokens": (_nonzero, "a minimum output length"),  # vLLM's, as the three below
    "ignore_eos": (_true, "generation past the end-of-sequence token"),
    "stop_token_ids": (_nonempty, "stop token ids"),
    "bad_words": (_nonempty, "banned words"),
    "modalities": (lambda value: value is not None and value != ["text"], "output other than text"),
    "audio": (_given, "audio output"),
    "web_search_options": (_given, "a web search"),
}


# Of those, the ones a JSON Lines record's own fields may ask with (vLLM's offline SamplingParams take
# them by these names): sampling knobs, which no dataset carries as data. A record's `tools`, `logprobs`,
# `n` or `audio` may well be its data (a tool-use chat, a scored answer), so they stay metadata there.
RECORD_UNHONOURED = ("best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "top_k",
                     "min_p", "min_tokens", "ignore_eos", "stop_token_ids", "bad_words")


def unhonoured(body: dict[str, Any], names: Iterable[str] = UNHONOURED) -> tuple[str, str] | None:
    """(parameter, what it asks for) of the first of `names` in `body` that asks for something
    specbatch does not do, or None."""
    for name in names:
        asks, what = UNHONOURED[name]
        if name in body and asks(body[name]):
            return name, what
    return None
