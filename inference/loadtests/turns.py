"""One turn of a load-test session as the client sees it: the streamed answer folded from its
chunks (``Reply``), the turn record it becomes (``TurnRecord``, fields documented in
``inference.loadtests.analysis``), the kind of a failed request, the check of a tool call
against its tool's schema, and the ``tool`` message a session sends back for a call.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import openai
from jsonschema import Draft202012Validator

from inference.loadtests.plan import tool_result_text, tool_schemas

VALIDATORS = {name: Draft202012Validator(schema) for name, schema in tool_schemas().items()}


@dataclass
class TurnRecord:
    """One request (fields documented in ``inference.loadtests.analysis``)."""

    step: int
    c: int
    sid: str
    turn: int
    kind: str
    t: float
    ttft: float | None = None
    lat: float = 0.0
    ok: bool = False
    error: str = ""
    message: str = ""
    node: str = ""
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    queue_ms: float | None = None
    prefill_ms: float | None = None
    node_ttft_ms: float | None = None
    decode_tps: float | None = None
    finish: str = ""
    hit: bool = False
    tool_req: bool = False
    tool_called: bool = False
    tool_valid: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("t", "ttft", "lat"):
            if out[key] is not None:
                out[key] = round(out[key], 4)
        return out


@dataclass
class Reply:
    """What one streamed answer delivered."""

    content: str = ""
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish: str | None = None
    usage: Any = None
    timings: dict[str, Any] = field(default_factory=dict)

    def assistant_message(self) -> dict[str, Any]:
        """The answer as the history's next ``assistant`` message."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if calls:
            message["tool_calls"] = calls
        elif not self.content:
            message["content"] = ""
        return message


def tool_call_valid(call: dict[str, Any]) -> bool:
    """A call names one of the scenario's tools and its arguments are JSON that the tool's
    schema accepts (JSON nested past what Python parses or validates is not valid)."""
    validator = VALIDATORS.get(call["function"]["name"])
    if validator is None:
        return False
    try:
        return bool(validator.is_valid(json.loads(call["function"]["arguments"] or "{}")))
    except (ValueError, RecursionError):
        return False


def error_kind(exc: BaseException) -> tuple[str, str]:
    """``(kind, message)`` of a failed request: ``http_<status> <code>``, ``timeout``,
    ``connection``, ``stream_error <code>``, or the exception's type."""
    if isinstance(exc, openai.APIStatusError):
        code = str(exc.code or "")[:64]  # the target's own word: one kind each, cut short
        return f"http_{exc.status_code}" + (f" {code}" if code else ""), exc.message[:300]
    if isinstance(exc, openai.APITimeoutError):
        return "timeout", str(exc)[:300]
    if isinstance(exc, openai.APIConnectionError):
        return "connection", str(exc)[:300]
    if isinstance(exc, openai.APIError):
        code = str(getattr(exc, "code", None) or "")[:64]
        return "stream_error" + (f" {code}" if code else ""), exc.message[:300]
    return type(exc).__name__, str(exc)[:300]


def _figure(timings: dict[str, Any], key: str) -> float | None:
    """A finite number the target sent in its ``timings``, or None (anything else is not
    kept: a NaN would not even be valid JSON in the row)."""
    value = timings.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _take_chunk(reply: Reply, chunk: Any) -> bool:
    """Fold one ``ChatCompletionChunk`` into ``reply``; True when it carried output (text or
    a tool call), the first of which is the time to first token."""
    if chunk.usage is not None:
        reply.usage = chunk.usage
    extra = chunk.model_extra or {}
    if isinstance(extra.get("timings"), dict):
        reply.timings = extra["timings"]
    carried = False
    for choice in chunk.choices or []:
        delta = choice.delta
        if delta is not None and delta.content:
            reply.content += delta.content
            carried = True
        for part in (delta.tool_calls if delta is not None else None) or []:
            call = reply.calls.setdefault(
                part.index,
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
            carried = True
        if choice.finish_reason:
            reply.finish = choice.finish_reason
    return carried


def _tool_message(call: dict[str, Any]) -> dict[str, Any]:
    """The tool's result for ``call``, as the next ``tool`` message."""
    n = sum(map(ord, call["id"])) % 9000 + 1000
    return {
        "role": "tool",
        "tool_call_id": call["id"] or "call_0",
        "content": tool_result_text(call["function"]["name"], n),
    }
