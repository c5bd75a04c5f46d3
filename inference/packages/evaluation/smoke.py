"""The smoke test of a package on its node: a streamed tool call, then an answer to its result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from inference.packages.evaluation.stream import stream_chat

SMOKE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
SMOKE_USER = "What is the weather in Lisbon today, in celsius? ☀️🌧️"
SMOKE_RESULT = '{"temperature": 21, "unit": "celsius", "conditions": "sunny ☀️"}'


@dataclass
class SmokeResult:
    """``passed``: every step passed; ``error``: the first failure (the node's message);
    ``steps``: ``{"name", "ok", "detail"}`` for each step run."""

    passed: bool
    error: str
    steps: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "error": self.error, "steps": self.steps}


def smoke_test(client: httpx.Client) -> SmokeResult:
    """Two streamed turns through the node's chat template: 1) ``tool_call``: a user message
    with emoji, a tool and ``tool_choice: "required"``, which must stream chunks and end with a
    tool call whose arguments parse as a JSON object; 2) ``tool_result``: that call and a
    tool result appended (``tool_choice: "none"``), which must finish with some content. An
    HTTP error (a template that fails to render is a 400 ``template_error``), an error event
    or a broken stream fails the test with the node's message in ``error``."""
    steps: list[dict[str, Any]] = []

    def fail(name: str, error: str) -> SmokeResult:
        steps.append({"name": name, "ok": False, "detail": error})
        return SmokeResult(False, f"{name}: {error}", steps)

    messages: list[dict[str, Any]] = [{"role": "user", "content": SMOKE_USER}]
    base = {"tools": [SMOKE_TOOL], "temperature": 0, "max_tokens": 96}
    first = stream_chat(client, {**base, "messages": messages, "tool_choice": "required"})
    if first.error:
        return fail("tool_call", first.error)
    if first.chunks < 2 or not first.tool_calls or first.finish_reason != "tool_calls":
        return fail(
            "tool_call",
            f"expected a streamed tool call, got {first.chunks} chunks, finish_reason "
            f"{first.finish_reason!r}, content {first.content[:200]!r}",
        )
    call = first.tool_calls[0]
    try:
        arguments = json.loads(call["function"]["arguments"])
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        return fail("tool_call", f"arguments do not parse: {call['function']['arguments'][:200]!r}")
    steps.append(
        {
            "name": "tool_call",
            "ok": True,
            "detail": f"{call['function']['name']}({json.dumps(arguments, ensure_ascii=False)})",
        }
    )
    call_id = call["id"] or "call_smoke"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": call_id}]},
        {"role": "tool", "tool_call_id": call_id, "content": SMOKE_RESULT},
    ]
    second = stream_chat(client, {**base, "messages": messages, "tool_choice": "none"})
    if second.error:
        return fail("tool_result", second.error)
    if not second.content.strip() or second.finish_reason not in ("stop", "length"):
        return fail(
            "tool_result",
            f"expected an answer, got finish_reason {second.finish_reason!r}, content "
            f"{second.content[:200]!r}",
        )
    steps.append({"name": "tool_result", "ok": True, "detail": second.content[:200]})
    return SmokeResult(True, "", steps)
