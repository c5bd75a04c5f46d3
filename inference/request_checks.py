"""Checks on what clients send, before anything is routed: each error names the problem."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference.chat_request import decode_json, parse_chat_request
from inference.errors import BadRequest

SESSION_HEADER_ALIASES = (
    "X-Session-Id",
    "X-Session-Affinity",
    "X-Dynamo-Session-ID",
    "X-SMG-Routing-Key",
)
MAX_SESSION_ID = 200


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """Decode a JSON object (``decode_json``); raises ``BadRequest`` (code ``invalid_json``)."""
    data = decode_json(raw)
    if not isinstance(data, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    return data


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
    absent or blank; raises ``BadRequest`` (``check_session_id``) for a bad one.
    """
    for name in (header, *SESSION_HEADER_ALIASES):
        value = headers.get(name)
        if value and value.strip():
            return check_session_id(value.strip(), where=name)
    return None


REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(given: str | None, *, where: str = REQUEST_ID_HEADER) -> str:
    """A turn's request id: ``given`` (the client's ``X-Request-Id``, a websocket turn's
    ``request_id``) when it is 1 to 128 letters, digits, ``.``, ``_``, ``:`` or ``-``; a new
    one (32 hex digits) when absent or empty. Raises ``BadRequest`` (``invalid_request_id``,
    ``param`` ``where``) otherwise. The proxy and the node both check it here."""
    if given is None or given == "":
        return uuid.uuid4().hex
    if not isinstance(given, str) or not REQUEST_ID.fullmatch(given):
        raise BadRequest(
            f"{where} must be 1 to 128 letters, digits, '.', '_', ':' or '-'.",
            code="invalid_request_id",
            param=where,
        )
    return given


def check_session_id(value: str, *, where: str = "the session id") -> str:
    """``value`` when it is 1 to 200 printable ASCII characters, not starting or ending with a
    space (it travels to nodes in an HTTP header, which carries nothing else safely); raises
    ``BadRequest`` otherwise."""
    if len(value) > MAX_SESSION_ID:
        raise BadRequest(
            f"Session key in {where} is longer than {MAX_SESSION_ID} characters.",
            code="invalid_session_id",
        )
    if not value.strip() or value != value.strip() or not all(" " <= ch <= "~" for ch in value):
        raise BadRequest(
            f"Session key in {where} must be printable ASCII (no control or non-ASCII characters).",
            code="invalid_session_id",
        )
    return value


WS_OPTIONS = ("max_tokens", "temperature", "top_p", "seed", "stop")
WS_TOOL_FIELDS = ("tools", "tool_choice")


@dataclass(frozen=True)
class WsTurn:
    """One message from the session websocket: the chat ``message`` it adds to the transcript
    (``{"role": "user", "content"}`` or ``{"role": "tool", "tool_call_id", "content"}``), the
    ``model`` asked for, sampling ``options``, and ``tools`` (``{"tools", "tool_choice"}``, as
    sent; empty when the message carries none)."""

    message: dict[str, Any]
    model: str | None
    options: dict[str, Any]
    tools: dict[str, Any]
    request_id: str = ""  # the turn's request id (the client's ``request_id`` or a new one)


def parse_ws_message(data: Any) -> WsTurn:
    """Accept ``{"type": "user", "content": ...}`` (``{"message": ...}`` or ``{"content": ...}``
    too) or a tool result ``{"type": "tool", "tool_call_id": ..., "content": ...}``, with
    optional ``model``, ``max_tokens``, ``temperature``, ``seed``, ``top_p``, ``stop``,
    ``tools``, ``tool_choice`` and ``request_id`` (kept when a plain token, else a new one).

    Raises ``BadRequest`` for other message types, missing or empty content, a tool result
    without ``tool_call_id``. Options and tools are checked with the whole request
    (``check_chat_body``) when the turn is sent.
    """
    if not isinstance(data, dict):
        raise BadRequest("Message must be a JSON object.", code="invalid_json")
    kind = data.get("type", "user")
    if kind not in ("user", "tool"):
        raise BadRequest(
            f'Unknown message type {kind!r}; send {{"type": "user", "content": "..."}} or '
            '{"type": "tool", "tool_call_id": "...", "content": "..."}.',
            code="invalid_type",
            param="type",
        )
    content = data.get("content", data.get("message"))
    if not isinstance(content, str):
        raise BadRequest("content must be a string.", code="invalid_type", param="content")
    if kind == "user" and not content.strip():
        raise BadRequest("content must not be empty.", code="empty_content", param="content")
    message: dict[str, Any] = {"role": kind, "content": content}
    if kind == "tool":
        call_id = data.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest(
                "tool_call_id must name the tool call this result answers.",
                code="invalid_type",
                param="tool_call_id",
            )
        message["tool_call_id"] = call_id
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise BadRequest("model must be a non-empty string.", code="invalid_type", param="model")
    options = {k: data[k] for k in WS_OPTIONS if data.get(k) is not None}
    tools = {k: data[k] for k in WS_TOOL_FIELDS if data.get(k) is not None}
    rid = request_id(data.get("request_id"), where="request_id")
    return WsTurn(message=message, model=model, options=options, tools=tools, request_id=rid)
