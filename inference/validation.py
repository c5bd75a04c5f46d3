"""Checks on what clients send, before anything is routed: each error names the problem."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference.chat_request import parse_chat_request
from inference.engine.text import has_unpaired_surrogate
from inference.errors import BadRequest

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


def check_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """Validate an OpenAI chat completion body exactly as a node will
    (``inference.chat_request.parse_chat_request``); raises ``BadRequest`` naming the field.

    Returns the body unchanged; unknown fields pass through to the node.
    """
    parse_chat_request(body)
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
