"""Streamed chat completions from a node, read event by event (``stream_chat``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class StreamResult:
    """What a streamed chat completion delivered. ``error``: the node's message (an HTTP
    error, an in-band error event, a broken stream), "" when none; ``broken``: the error is
    the connection's (the node is gone or cut the stream), not an answer of the node;
    ``stopped``: the reader stopped before the end (``stream_chat``'s ``until``);
    ``tool_calls``: OpenAI ``tool_calls`` assembled from the deltas; times are
    ``time.perf_counter()`` seconds."""

    status: int = 0
    chunks: int = 0
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str = ""
    broken: bool = False
    stopped: bool = False
    sent_at: float = 0.0
    first_content_at: float | None = None
    last_content_at: float | None = None


def http_error(response: httpx.Response) -> str:
    """``HTTP <status> <code>: <message>`` from an OpenAI-shaped error body (or the raw body)."""
    try:
        error = response.json().get("error") or {}
        return f"HTTP {response.status_code} {error.get('code')}: {error.get('message')}"
    except (ValueError, AttributeError):
        return f"HTTP {response.status_code}: {response.text[:500]}"


def stream_chat(
    client: httpx.Client,
    body: dict[str, Any],
    *,
    until: Callable[[StreamResult], bool] | None = None,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """POST ``body`` with ``stream: true`` and read its server-sent events to ``[DONE]``, or
    until ``until(result so far)`` is true after a chunk (the connection is then closed, and
    the node cancels the generation). Never raises for the node's failures: they are in
    ``StreamResult.error``."""
    result = StreamResult(sent_at=time.perf_counter())
    calls: dict[int, dict[str, Any]] = {}
    try:
        with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
        ) as r:
            result.status = r.status_code
            if r.status_code != 200:
                r.read()
                result.error = http_error(r)
                return result
            _read_events(r, result, calls, until)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"broken stream: {type(exc).__name__}: {exc}"
        result.broken = True
    result.tool_calls = [calls[i] for i in sorted(calls)]
    return result


def _read_events(
    response: httpx.Response,
    result: StreamResult,
    calls: dict[int, dict[str, Any]],
    until: Callable[[StreamResult], bool] | None,
) -> None:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk["error"]
            result.error = f"error event {error.get('code')}: {error.get('message')}"
            return
        result.chunks += 1
        _take_chunk(result, chunk, calls)
        if until is not None and until(result):
            result.stopped = True
            return
    result.error = "the stream ended without [DONE]"
    result.broken = True


def _take_chunk(result: StreamResult, chunk: dict[str, Any], calls: dict[int, dict]) -> None:
    if chunk.get("usage"):
        result.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            now = time.perf_counter()
            result.first_content_at = result.first_content_at or now
            result.last_content_at = now
            result.content += delta["content"]
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(
                part.get("index", 0),
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = part.get("id") or call["id"]
            function = part.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
