"""The inference proxy's core, shared by the REST view and the session websocket.

``upstream_open`` routes a chat request, sends it to the chosen node and waits for the node's
first body bytes; a failure before that point (refused, timed out, 5xx) is retried on another
node, bumping the failed node's failure counter. After the first byte the request is committed
to its node: ``sse_passthrough`` relays the node's bytes as they arrive (REST) and
``sse_events`` decodes them into events (websocket); either ends a stream that breaks mid-way
with an in-band ``{"error": ...}`` event. Closing the upstream (``Upstream.aclose``), which both do
on exit or cancellation, drops the connection so the node stops generating.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from asgiref.sync import sync_to_async

from inference import services
from inference.errors import NoHealthyNode, UpstreamError
from inference.models import RoutingPolicy
from inference.routing import Decision
from nodes import client as node_client
from nodes import services as node_services

log = logging.getLogger(__name__)

_load_policy = sync_to_async(RoutingPolicy.load)
_route_resolve = sync_to_async(services.route_resolve)
_record_failure = sync_to_async(node_services.node_record_failure)


@dataclass
class Upstream:
    """A node's open answer: status, headers, the first body bytes and an iterator for the rest."""

    node_id: str
    decision: Decision
    status: int
    headers: httpx.Headers
    first: bytes
    rest: AsyncIterator[bytes]
    response: httpx.Response
    failure_threshold: int
    attempts: list[str] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close the node's response (drops the connection when unread: the node cancels)."""
        await node_client.chat_close(self.response)

    async def read_all(self) -> bytes:
        """The whole body; raises ``UpstreamError`` when the node breaks before the end."""
        parts = [self.first]
        try:
            async for chunk in self.rest:
                parts.append(chunk)
        except httpx.TransportError as exc:
            await self._broke(exc)
            raise UpstreamError(f"{self.node_id} broke off its answer: {_describe(exc)}") from exc
        finally:
            await self.aclose()
        return b"".join(parts)

    async def _broke(self, exc: Exception) -> None:
        await _record_failure(
            node_id=self.node_id,
            reason=f"broke mid-answer: {_describe(exc)}",
            failure_threshold=self.failure_threshold,
        )


def _describe(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return (
        f"unreachable ({type(exc).__name__})"
        if isinstance(exc, httpx.ConnectError)
        else (type(exc).__name__)
    )


async def upstream_open(*, payload: dict[str, Any], model: str, session_id: str | None) -> Upstream:
    """Route ``payload`` (an OpenAI chat body) for package ``model`` and open the node's answer.

    Tries at most ``policy.max_attempts`` nodes. A node's 4xx is returned as is (the caller
    passes it on); connection failures, timeouts and 5xx move to the next node. Raises
    ``NoHealthyNode`` (503, ``retry_after`` set) when no node is left.
    """
    policy = await _load_policy()
    exclude: dict[str, str] = {}
    for attempt in range(policy.max_attempts):
        target = await _route_resolve(
            session_id=session_id, model=model, exclude=exclude, new_turn=attempt == 0
        )
        body = {**payload, "model": target.model}
        try:
            response = await node_client.chat_open(
                target.address,
                payload=body,
                session_id=session_id,
                connect_timeout=policy.connect_timeout_s,
                read_timeout=policy.request_timeout_s,
            )
        except httpx.TransportError as exc:
            exclude[target.node_id] = _describe(exc)
            await _record_failure(
                node_id=target.node_id,
                reason=_describe(exc),
                failure_threshold=policy.failure_threshold,
            )
            log.warning("request to %s failed before its first byte: %s", target.node_id, exc)
            continue
        if response.status_code >= 500:
            await response.aread()
            await node_client.chat_close(response)
            exclude[target.node_id] = f"answered {response.status_code}"
            if response.status_code != 503:  # 503 is a busy or loading node, not a broken one
                await _record_failure(
                    node_id=target.node_id,
                    reason=exclude[target.node_id],
                    failure_threshold=policy.failure_threshold,
                )
            continue
        rest = response.aiter_raw()
        try:
            first = await anext(rest, b"")
        except BaseException as exc:  # the client went away (cancelled) or the node broke
            await node_client.chat_close(response)
            if not isinstance(exc, httpx.TransportError):
                raise
            exclude[target.node_id] = _describe(exc)
            await _record_failure(
                node_id=target.node_id,
                reason=_describe(exc),
                failure_threshold=policy.failure_threshold,
            )
            continue
        return Upstream(
            target.node_id,
            target.decision,
            response.status_code,
            response.headers,
            first,
            rest,
            response,
            policy.failure_threshold,
            list(exclude),
        )
    tried = "; ".join(f"{node} {why}" for node, why in exclude.items())
    raise NoHealthyNode(
        f"No node could take the request ({tried}).",
        retry_after=max(1, round(policy.health_interval_s)),
    )


def sse_error_event(message: str, *, code: str = "upstream_error") -> bytes:
    """An in-band SSE error event followed by ``[DONE]`` (the node protocol's shape)."""
    body = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


async def sse_passthrough(upstream: Upstream) -> AsyncIterator[bytes]:
    """Relay the node's SSE bytes chunk by chunk as they arrive.

    A break mid-way ends the stream with ``sse_error_event``. When the consumer stops (client
    disconnect cancels the generator) the upstream is closed, so the node stops generating.
    """
    tail = upstream.first[-2:]
    try:
        if upstream.first:
            yield upstream.first
        async for chunk in upstream.rest:
            if chunk:
                tail = (tail + chunk)[-2:]
                yield chunk
    except httpx.TransportError as exc:
        await upstream._broke(exc)
        separator = b"" if tail == b"\n\n" or not tail else b"\n\n"
        yield separator + sse_error_event(
            f"{upstream.node_id} broke off the stream: {_describe(exc)}"
        )
    finally:
        await upstream.aclose()


class SSEDecoder:
    """Incremental SSE decoder: feed bytes, get the JSON payloads of complete ``data:`` events.

    ``[DONE]`` is returned as the string ``"[DONE]"``; undecodable data as ``{"raw": text}``.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[Any]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        events: list[Any] = []
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            data = "\n".join(
                line[5:].lstrip()
                for line in raw.decode("utf-8", "replace").split("\n")
                if line.startswith("data:")
            )
            if not data:
                continue
            if data.strip() == "[DONE]":
                events.append("[DONE]")
                continue
            try:
                events.append(json.loads(data))
            except ValueError:
                events.append({"raw": data})
        return events


async def sse_events(upstream: Upstream) -> AsyncIterator[Any]:
    """Decoded SSE events of a streamed answer (dicts, then ``"[DONE]"``).

    A break mid-way yields ``{"error": {"message": ...}}`` and ends; the upstream is always
    closed on exit.
    """
    decoder = SSEDecoder()
    try:
        for event in decoder.feed(upstream.first):
            yield event
        async for chunk in upstream.rest:
            for event in decoder.feed(chunk):
                yield event
    except httpx.TransportError as exc:
        await upstream._broke(exc)
        yield {
            "error": {
                "message": f"{upstream.node_id} broke off the stream: {_describe(exc)}",
                "type": "upstream_error",
                "code": "upstream_error",
            }
        }
    finally:
        await upstream.aclose()
