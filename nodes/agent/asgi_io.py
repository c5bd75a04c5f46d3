"""Small ASGI helpers for the node agent: read a bounded body, answer JSON/text, stream SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(ValueError):
    pass


class ClientGone(Exception):
    """The client disconnected before the body was read."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body. Raises ``BodyTooLarge`` past ``limit`` bytes, ``ClientGone``."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


def header(scope: dict[str, Any], name: str) -> str | None:
    wanted = name.lower().encode()
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


async def send_start(send: Send, status: int, content_type: str, extra: dict[str, str]) -> None:
    headers = [(b"content-type", content_type.encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: str, extra: dict[str, str]
) -> None:
    await send_start(send, status, content_type, extra)
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: Any, extra: dict[str, str]) -> None:
    await send_bytes(send, status, json.dumps(payload).encode(), "application/json", extra)


def error_body(
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client goes away (after the body has been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def watch_disconnect(receive: Receive, on_gone: Callable[[], None]) -> asyncio.Task:
    async def watcher() -> None:
        await wait_for_disconnect(receive)
        on_gone()

    return asyncio.ensure_future(watcher())
