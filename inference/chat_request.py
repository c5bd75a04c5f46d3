"""One validation of an OpenAI chat-completion request, shared by the proxy and the node agent.

``parse_chat_request`` first checks the body against the OpenAI request schema
(``inference.chat_schema``: the ``openai`` package's own types), then what Phalanx itself can
serve (text content only, function tools, one choice, sampling ranges). Every error is a
``BadRequest`` (400) whose message and ``param`` name the field: the proxy answers it before
routing, so a body a node would refuse never reaches one.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from inference.chat_schema import schema_problem
from inference.errors import BadRequest
from inference.schema_limits import check_schema_limits

MAX_STOP_STRINGS = 8
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TEXT_PART_TYPES = frozenset({"text", "refusal"})


def decode_json(raw: bytes | str) -> Any:
    """Decode request JSON strictly; raises ``BadRequest`` (code ``invalid_json``) for text
    that is not UTF-8, not JSON, uses ``NaN`` / ``Infinity`` or a number past a float (``1e309``) (Python's ``json`` reads them, no
    JSON peer does: the body could not be forwarded), nests deeper than Python can follow, or
    holds an unpaired UTF-16 surrogate (``"\ud800"``: valid JSON, not text)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"The body is not UTF-8: {exc}.", code="invalid_json") from exc
    except UnicodeEncodeError as exc:
        raise BadRequest(
            "The JSON holds an unpaired UTF-16 surrogate (e.g. \\ud800); it is not valid text.",
            code="invalid_json",
        ) from exc
    except RecursionError as exc:
        raise BadRequest("The JSON nests too deeply.", code="invalid_json") from exc
    except ValueError as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}.", code="invalid_json") from exc
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal[:40]} is too large for a number")
    return value


@dataclass(frozen=True)
class ToolMode:
    """How tools constrain a turn: ``auto`` (text or one call), ``none`` (text only: the tools
    are still described, so the prompt's prefix, and the session's KV, stay the same as on the
    turns that may call), ``required`` or one named tool."""

    tools: tuple[dict[str, Any], ...]
    choice: str  # "auto" | "none" | "required" | the name of a function

    @property
    def forces_call(self) -> bool:
        return self.choice not in ("auto", "none")

    @property
    def allows_call(self) -> bool:
        return self.choice != "none"


@dataclass(frozen=True)
class ChatRequest:
    """A validated request. ``max_tokens`` None means: the rest of the sequence's context."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int | None
    stop: tuple[str, ...]
    response_format: dict[str, Any] | None
    tool_mode: ToolMode | None
    continue_final: bool = False  # the last (assistant) message is continued, not answered


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body. Raises ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", code="invalid_json")
    problem = schema_problem(body)
    if problem is not None:
        field, phrase = problem
        raise BadRequest(f"{field} {phrase}.", param=field)
    _check_served(body)
    max_tokens = _integer(body, "max_completion_tokens", None, 1, 1 << 20)
    tool_mode = _tool_mode(body)
    response_format = _response_format(body)
    if tool_mode and response_format and response_format["type"] != "text":
        raise BadRequest(
            "'tools' and a JSON 'response_format' cannot be combined.", param="response_format"
        )
    continue_final = _continue_final(body, tool_mode, response_format)
    return ChatRequest(
        model=body["model"],
        messages=body["messages"],
        stream=bool(body.get("stream")),
        max_tokens=_integer(body, "max_tokens", max_tokens, 1, 1 << 20),
        temperature=_number(body, "temperature", 0.8, 0.0, 2.0),
        top_p=_number(body, "top_p", 0.95, 0.0, 1.0),
        top_k=int(_integer(body, "top_k", 40, 0, 1 << 20) or 0),
        min_p=_number(body, "min_p", 0.05, 0.0, 1.0),
        repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.0, 10.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=_integer(body, "seed", None, -(1 << 63), (1 << 63) - 1),
        stop=_stop(body),
        response_format=response_format,
        tool_mode=tool_mode,
        continue_final=continue_final,
    )


def _continue_final(
    body: dict[str, Any], tool_mode: ToolMode | None, response_format: dict[str, Any] | None
) -> bool:
    """``continue_final_message`` (vLLM's name): the answer continues the last message, an
    assistant's text, instead of starting a new one (the proxy's request migration sends it;
    docs/control-plane.md). The continuation is free text, so a JSON ``response_format`` or a
    forced tool call, whose grammar starts at the answer's first token, cannot be continued."""
    value = body.get("continue_final_message")
    if value is None or value is False:
        return False
    if value is not True:
        raise BadRequest(
            "continue_final_message must be a boolean.", param="continue_final_message"
        )
    last = body["messages"][-1]
    if last["role"] != "assistant" or last.get("tool_calls") or last.get("function_call"):
        raise BadRequest(
            "continue_final_message needs an assistant message with text (no tool calls) last.",
            param="messages",
        )
    if (response_format and response_format["type"] != "text") or (
        tool_mode and tool_mode.forces_call
    ):
        raise BadRequest(
            "continue_final_message cannot continue an answer held to a grammar (a JSON "
            "response_format or a required tool call).",
            param="continue_final_message",
        )
    return True


def _check_served(body: dict[str, Any]) -> None:
    """What the schema allows but a node cannot serve: a 400 rather than a silent change."""
    if not body["model"].strip():
        raise BadRequest("model must be a non-empty string.", param="model")
    if not body["messages"]:
        raise BadRequest("messages must not be empty.", param="messages", code="empty_messages")
    for i, message in enumerate(body["messages"]):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if part["type"] not in TEXT_PART_TYPES:
                raise BadRequest(
                    f"messages[{i}].content[{j}] is a {part['type']} part; this array's models "
                    "take text only.",
                    param=f"messages[{i}].content[{j}]",
                    code="unsupported_content",
                )
    if body.get("n") not in (None, 1):
        raise BadRequest("n must be 1: a node returns one choice.", param="n")


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number.", param=key)
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be between {lo:g} and {hi:g}, got {value}.", param=key)
    return float(value)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer.", param=key)
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be between {lo} and {hi}, got {value}.", param=key)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not all(stops):
        raise BadRequest("stop strings must not be empty.", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"stop takes at most {MAX_STOP_STRINGS} strings.", param="stop")
    return tuple(stops)


def _response_format(body: dict) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if fmt["type"] == "json_schema" and not isinstance(fmt["json_schema"].get("schema"), dict):
        raise BadRequest(
            "response_format.json_schema.schema must be an object.",
            param="response_format.json_schema.schema",
        )
    if fmt["type"] == "json_schema":
        check_schema_limits(fmt["json_schema"]["schema"], "response_format.json_schema.schema")
    return fmt


def _tool_mode(body: dict) -> ToolMode | None:
    tools = body.get("tools")
    if not tools:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise BadRequest(
                "tool_choice names or requires a tool, but tools is empty.", param="tool_choice"
            )
        return None
    names = []
    for i, tool in enumerate(tools):
        if tool["type"] != "function":
            raise BadRequest(
                f"tools[{i}] is a {tool['type']} tool; nodes call function tools only.",
                param=f"tools[{i}].type",
            )
        if not TOOL_NAME.fullmatch(tool["function"]["name"]):
            raise BadRequest(
                f"tools[{i}].function.name must be 1 to 64 letters, digits, _ or - (OpenAI's rule).",
                param=f"tools[{i}].function.name",
            )
        check_schema_limits(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
        names.append(tool["function"]["name"])
    choice = body.get("tool_choice") or "auto"
    if isinstance(choice, dict):
        if choice["type"] != "function":
            raise BadRequest(
                f"tool_choice of type {choice['type']} is not supported; name a function.",
                param="tool_choice.type",
            )
        choice = choice["function"]["name"]
        if choice not in names:
            raise BadRequest(f"tool_choice names unknown tool {choice!r}.", param="tool_choice")
    return ToolMode(tools=tuple(tools), choice=choice)
