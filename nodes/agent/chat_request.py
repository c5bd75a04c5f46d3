"""Parsing and validating an OpenAI chat-completion request body for the node agent.

Every error is a ``BadRequest`` whose message names the field and what is wrong with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inference.engine.prompt import ToolMode

ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP_STRINGS = 8


class BadRequest(ValueError):
    """A 400 answer: ``message`` names the problem, ``param`` the offending field."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request"
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class ChatRequest:
    """A validated request. ``max_tokens`` None means: the rest of the sequence's context."""

    model: str | None
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


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"'{key}' must be a number", param=key)
    if not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be between {lo} and {hi}, got {value}", param=key)
    return float(value)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer", param=key)
    if not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be between {lo} and {hi}, got {value}", param=key)
    return value


def _messages(body: dict) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"'{where}' must be an object", param=where)
        if message.get("role") not in ROLES:
            raise BadRequest(
                f"'{where}.role' must be one of {sorted(ROLES)}", param=f"{where}.role"
            )
        content = message.get("content")
        if content is None and not message.get("tool_calls"):
            raise BadRequest(f"'{where}.content' is required", param=f"{where}.content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(
                f"'{where}.content' must be a string or a list of parts", param=f"{where}.content"
            )
    return messages


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequest(f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return tuple(stop)


def _response_format(body: dict) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            "'response_format.type' must be text, json_object or json_schema",
            param="response_format",
        )
    if fmt["type"] == "json_schema" and not isinstance(
        (fmt.get("json_schema") or {}).get("schema"), dict
    ):
        raise BadRequest(
            "'response_format.json_schema.schema' must be an object", param="response_format"
        )
    return fmt


def _tool_mode(body: dict) -> ToolMode | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", param="tools")
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"'tools[{i}].function.name' is required", param=f"tools[{i}]")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise BadRequest(
                f"'tools[{i}].function.parameters' must be a JSON schema object",
                param=f"tools[{i}]",
            )
        names.append(fn["name"])
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name")
        if choice not in names:
            raise BadRequest(f"'tool_choice' names unknown tool {choice!r}", param="tool_choice")
    elif choice not in ("auto", "required"):
        raise BadRequest(
            "'tool_choice' must be none, auto, required or a named function", param="tool_choice"
        )
    return ToolMode(tools=tuple(tools), choice=choice)


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body. Raises ``BadRequest``."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    max_tokens = _integer(body, "max_completion_tokens", None, 1, 1 << 20)
    max_tokens = _integer(body, "max_tokens", max_tokens, 1, 1 << 20)
    tool_mode = _tool_mode(body)
    response_format = _response_format(body)
    if tool_mode and response_format and response_format["type"] != "text":
        raise BadRequest(
            "'tools' and a JSON 'response_format' cannot be combined", param="response_format"
        )
    return ChatRequest(
        model=model,
        messages=_messages(body),
        stream=stream,
        max_tokens=max_tokens,
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
    )
