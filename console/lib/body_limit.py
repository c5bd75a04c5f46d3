"""Bounded HTTP request bodies: past ``settings.MAX_REQUEST_BODY_BYTES`` the answer is 413.

An ASGI wrapper in front of Django (both handlers): a ``Content-Length`` over the limit is
refused before a byte of the body is read; a chunked body is counted as it arrives and refused
the moment it passes the limit. Django's own check (``DATA_UPLOAD_MAX_MEMORY_SIZE``) would
answer 400, and only after reading the whole body into a spooled file.

Large files (GGUF packages) are uploaded in parts of at most this limit
(``inference/packages/uploads.py``): daphne reads a whole body into memory before any
application code runs, so no path may take a bigger one.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodyLimit:
    """Wraps ``app``; reads each request's body (at most ``limit`` bytes) before calling it and
    hands it over in one message; later ``receive`` calls (disconnect) go to the server."""

    def __init__(self, app: Any, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _declared_length(scope) > self.limit:
            return await self._too_large(send)
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            total += len(body)
            if total > self.limit:
                return await self._too_large(send)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send: Any) -> None:
        message = f"The request body is over the limit of {self.limit} bytes."
        await _refuse(send, 413, message, "body_too_large")


async def _refuse(send: Any, status: int, message: str, code: str) -> None:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "code": code,
                "param": None,
            },
            "detail": message,
            "code": code,
        }
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
