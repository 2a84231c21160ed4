"""Results as OpenAI batch output lines (`/v1/completions` and `/v1/chat/completions` bodies)."""

from __future__ import annotations

from typing import Any

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
# drops whose request id is the positional `rec-...` the ingest gave a line without a usable custom_id
_NO_CUSTOM_ID = frozenset({"missing_custom_id", "invalid_id", "duplicate_id", "invalid_json", "invalid_utf8",
                           "record_too_large", "not_an_object"})


def output_line(result: dict[str, Any], endpoint: str | None, index: int) -> dict[str, Any]:
    """One output line; `custom_id` is null for an input line that had none of its own (a missing,
    invalid or duplicated custom_id, or a line that is not an object): never an id the input lacks."""
    request_id = result["request_id"]
    own_id = not (result["status"] == "dropped" and result["drop_reason"] in _NO_CUSTOM_ID)
    line: dict[str, Any] = {"id": f"batch_req_{index:09d}", "custom_id": request_id if own_id else None,
                            "response": None, "error": None}
    if result["status"] == "dropped":
        line["error"] = {"code": result["drop_reason"], "message": result["drop_message"] or result["drop_reason"]}
        return line
    finish = FINISH_REASONS.get(result["finish_reason"] or "", "cancelled")
    usage = {"prompt_tokens": result["num_prompt_tokens"], "completion_tokens": result["num_output_tokens"],
             "total_tokens": result["num_prompt_tokens"] + result["num_output_tokens"]}
    if endpoint == "/v1/chat/completions":
        choice = {"index": 0, "message": {"role": "assistant", "content": result["text"]}, "finish_reason": finish}
        body = {"object": "chat.completion", "choices": [choice], "usage": usage}
    else:
        body = {"object": "text_completion", "choices": [{"index": 0, "text": result["text"], "finish_reason": finish}],
                "usage": usage}
    body["id"] = f"specbatch-{request_id}"
    line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    return line
