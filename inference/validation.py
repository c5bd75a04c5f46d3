"""Checks on what clients send, before anything is routed: each error names the problem."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference.engine.text import has_unpaired_surrogate
from inference.errors import BadRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
SESSION_HEADER_ALIASES = (
    "X-Session-Id",
    "X-Session-Affinity",
    "X-Dynamo-Session-ID",
    "X-SMG-Routing-Key",
)
MAX_SESSION_ID = 200


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """Decode a JSON object; raises ``BadRequest`` (code ``invalid_json``) otherwise."""
    try:
        data = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    _check_encodable(data)
    return data


def _check_encodable(data: Any) -> None:
    if has_unpaired_surrogate(data):
        raise BadRequest(
            "The JSON holds an unpaired UTF-16 surrogate (e.g. \\ud800); it is not valid text.",
            code="invalid_json",
        )


def _check_number(body: Mapping[str, Any], key: str, *, integer: bool, minimum: float) -> None:
    if key not in body or body[key] is None:
        return
    value = body[key]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{key}' must be {kind} >= {minimum:g}.", code="invalid_type", param=key)


def check_messages(messages: Any, *, param: str = "messages") -> list[dict[str, Any]]:
    """Validate an OpenAI ``messages`` list; raises ``BadRequest`` naming the bad item."""
    if messages is None:
        raise BadRequest(f"'{param}' is required.", code="missing_messages", param=param)
    if not isinstance(messages, list):
        raise BadRequest(f"'{param}' must be a list of messages.", code="invalid_type", param=param)
    if not messages:
        raise BadRequest(f"'{param}' must not be empty.", code="empty_messages", param=param)
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object.", code="invalid_type", param=where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(
                f"{where}.role must be one of {', '.join(sorted(ROLES))}.",
                code="invalid_role",
                param=f"{where}.role",
            )
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue
        if not isinstance(content, str | list):
            raise BadRequest(
                f"{where}.content must be a string or a list of content parts.",
                code="invalid_type",
                param=f"{where}.content",
            )
    return messages


def check_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """Validate an OpenAI chat completion body (model, messages, stream, sampling numbers).

    Returns the body unchanged; unknown fields pass through to the node.
    """
    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required.", code="missing_model", param="model")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("'model' must be a non-empty string.", code="invalid_type", param="model")
    check_messages(body.get("messages"))
    if "stream" in body and not isinstance(body["stream"], bool | None):
        raise BadRequest("'stream' must be a boolean.", code="invalid_type", param="stream")
    _check_number(body, "max_tokens", integer=True, minimum=1)
    _check_number(body, "max_completion_tokens", integer=True, minimum=1)
    _check_number(body, "temperature", integer=False, minimum=0)
    _check_number(body, "top_p", integer=False, minimum=0)
    _check_number(body, "seed", integer=True, minimum=-(2**63))
    return body


def session_key(headers: Mapping[str, str], *, header: str) -> str | None:
    """The session key from the policy's ``header`` or one of the common aliases.

    ``headers`` must be case-insensitive (Django's ``request.headers``). Returns None when
    absent or blank; raises ``BadRequest`` when longer than 200 characters.
    """
    for name in (header, *SESSION_HEADER_ALIASES):
        value = headers.get(name)
        if value and value.strip():
            value = value.strip()
            if len(value) > MAX_SESSION_ID:
                raise BadRequest(
                    f"Session key in {name} is longer than {MAX_SESSION_ID} characters.",
                    code="invalid_session_id",
                )
            return value
    return None


@dataclass(frozen=True)
class WsTurn:
    """One user message from the session websocket and its sampling options."""

    content: str
    model: str | None
    options: dict[str, Any]


def parse_ws_message(data: Any) -> WsTurn:
    """Accept ``{"type": "user", "content": ...}``, ``{"message": ...}`` or ``{"content": ...}``
    with optional ``model``, ``max_tokens``, ``temperature``, ``seed``, ``top_p``, ``stop``.

    Raises ``BadRequest`` for anything else (empty content, wrong types, other event types).
    """
    if not isinstance(data, dict):
        raise BadRequest("Message must be a JSON object.", code="invalid_json")
    _check_encodable(data)
    kind = data.get("type", "user")
    if kind != "user":
        raise BadRequest(
            f'Unknown message type {kind!r}; send {{"type": "user", "content": "..."}}.',
            code="invalid_type",
        )
    content = data.get("content", data.get("message"))
    if not isinstance(content, str):
        raise BadRequest("'content' must be a string.", code="invalid_type", param="content")
    if not content.strip():
        raise BadRequest("'content' must not be empty.", code="empty_content", param="content")
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise BadRequest("'model' must be a non-empty string.", code="invalid_type", param="model")
    _check_number(data, "max_tokens", integer=True, minimum=1)
    _check_number(data, "temperature", integer=False, minimum=0)
    _check_number(data, "top_p", integer=False, minimum=0)
    _check_number(data, "seed", integer=True, minimum=-(2**63))
    if "stop" in data and not isinstance(data["stop"], str | list | None):
        raise BadRequest("'stop' must be a string or a list of strings.", code="invalid_type")
    options = {
        k: data[k]
        for k in ("max_tokens", "temperature", "top_p", "seed", "stop")
        if data.get(k) is not None
    }
    return WsTurn(content=content, model=model, options=options)
