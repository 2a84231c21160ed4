"""OpenAI tool calls in chat messages, as chat templates read them.

An assistant message may carry `tool_calls` (`[{"id", "type": "function", "function": {"name",
"arguments"}}]`, its content then null or absent), and a `tool` message answers one by its
`tool_call_id`. They reach the chat template as transformers documents them: `arguments` the JSON
object that OpenAI's JSON text encodes (vLLM passes them so too), since templates write it with `tojson`,
which would quote the text once more. A tool call that is not of this shape is a `ToolCallError`
(`validate` drops its record as `invalid_messages`); one that the template does not write into the
prompt drops it as `unrendered_tool_calls` there.
"""

from __future__ import annotations

import json
from typing import Any


class ToolCallError(ValueError):
    """A message's tool calls are not OpenAI's shape; the message says where."""


def tool_calls(where: str, value: Any) -> list[dict[str, Any]]:
    """`value` (a message's `tool_calls`, named `where`) checked and made the template's; [] for none
    (null, or an empty list as a table's column holds for a message without calls)."""
    if value is None or (isinstance(value, list) and not value):
        return []
    if not isinstance(value, list):
        raise ToolCallError(f"{where} must be a list of tool calls, got {_shown(value)}")
    return [_tool_call(f"{where}[{number}]", call) for number, call in enumerate(value)]


def without_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in message.items() if key != "tool_calls"} for message in messages]


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type") not in (None, "function"):
        raise ToolCallError(f"{where} must be an object of type function with a function, got {_shown(call)}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError(f"{where}.function.name must be a non-empty string, got {_shown(name)}")
    checked: dict[str, Any] = {"type": "function",
                               "function": {"name": name, "arguments": _arguments(where, function.get("arguments"))}}
    if (call_id := call.get("id")) is not None:
        if not isinstance(call_id, str):
            raise ToolCallError(f"{where}.id must be a string, got {_shown(call_id)}")
        checked["id"] = call_id
    return checked


def _arguments(where: str, arguments: Any) -> dict[str, Any]:
    """A JSON object, given as OpenAI's text of one or as the object."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError) as error:
            raise ToolCallError(f"{where}.function.arguments is not JSON: {str(error)[:100]}") from error
    if not isinstance(value, dict):
        raise ToolCallError(f"{where}.function.arguments must be a JSON object, got {_shown(arguments)}")
    return value


def _shown(value: Any) -> str:
    shown = repr(value)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"
