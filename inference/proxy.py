"""The inference proxy's core, shared by the REST view and the session websocket.

``upstream_open`` routes a chat request, sends it to the chosen node and waits for the node's
first body bytes; a failure before that point (refused, timed out, overloaded) is retried on
another node (with backoff), bumping the failed node's failure counter when it was refused or
timed out; a node's 500 for one request is that request's failure (``_refused``); a node marked down while the
request waits (a stopped process) is given up. A session that moves off a live node (drain,
rebalance) takes its KV along (export, import, erase). After the first byte the request is committed
to its node: ``sse_passthrough`` relays the node's bytes as they arrive (REST) and
``sse_events`` decodes them into events (websocket); either ends a stream that breaks mid-way
with an in-band ``{"error": ...}`` event. Closing the upstream (``Upstream.aclose``), which both do
on exit or cancellation, drops the connection so the node stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from console.bare_http import db_thread
from console.prometheus import metric_inc
from inference import lookups, services
from inference.errors import ArrayFull, NoHealthyNode, UpstreamError
from inference.models import RoutingPolicy
from inference.request_breaker import request_breaker, request_fingerprint
from inference.route_writer import route_writer
from inference.routing import Decision
from nodes import client as node_client
from nodes import services as node_services
from nodes.models import Node
from nodes.selectors import NodeTable, nodes_for_routing

log = logging.getLogger(__name__)

_record_failure = db_thread(node_services.node_record_failure)
_record_kv_move = db_thread(services.route_record_kv_move)

RECORD_DELAY_S = 0.005  # after the first token is relayed, see Upstream.record_soon
KV_MOVE_TIMEOUT_S = 10.0  # export + import of one session's KV between two nodes
MAX_BACKOFF_S = 1.0


class Inflight:
    """Requests this process has open, per node and in all (one instance per process).

    Routing reads ``per_node()`` (fresher than the last metrics scrape); the proxy refuses
    with 429 past the policy's ``max_inflight``. Single event-loop use: no locking needed.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.total = 0

    def acquire(self, node_id: str) -> None:
        self.nodes[node_id] = self.nodes.get(node_id, 0) + 1
        self.total += 1

    def release(self, node_id: str) -> None:
        self.nodes[node_id] = max(0, self.nodes.get(node_id, 0) - 1)
        self.total = max(0, self.total - 1)

    def per_node(self) -> dict[str, int]:
        return dict(self.nodes)


inflight = Inflight()


@dataclass
class Upstream:
    """A node's open answer: status, headers, the first body bytes and an iterator for the rest.

    Holds one ``inflight`` slot for its node until ``aclose``.
    """

    node_id: str
    decision: Decision
    status: int
    headers: httpx.Headers
    first: bytes
    rest: AsyncIterator[bytes]
    response: httpx.Response
    failure_threshold: int
    attempts: list[str] = field(default_factory=list)
    held: Any = None  # the route change route_writer holds for this request
    recorded: asyncio.Future[None] | None = None
    record_scheduled: bool = False
    released: bool = False

    def record(self) -> None:
        """Queue the request's route record for writing, once."""
        if self.held is not None:
            self.recorded = route_writer.commit(self.held)
            self.held = None

    def record_soon(self) -> None:
        """``record`` in ``RECORD_DELAY_S``: the relays call it once the node's first token
        (its second chunk: the first, the role, comes before prefill) has been passed on, so
        the write takes neither CPU from prefill nor time from that token's way out; it runs
        while the node decodes the next token."""
        if self.held is not None and not self.record_scheduled:
            self.record_scheduled = True
            asyncio.get_running_loop().call_later(RECORD_DELAY_S, self.record)

    async def aclose(self) -> None:
        """Close the node's response (drops the connection when unread: the node cancels),
        then wait until the request's route is in the database (``route_writer``)."""
        if not self.released:
            self.released = True
            inflight.release(self.node_id)
        await node_client.chat_close(self.response)
        self.record()
        if self.recorded is not None:
            await asyncio.shield(self.recorded)

    async def read_all(self) -> bytes:
        """The whole body; raises ``UpstreamError`` when the node breaks before the end."""
        parts = [self.first]
        try:
            async for chunk in self.rest:
                parts.append(chunk)
                self.record()
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


class NodeWentDown(Exception):
    """The node was marked down while we waited for its first byte."""


def _describe(exc: Exception) -> str:
    if isinstance(exc, NodeWentDown):
        return "went down while the request waited"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return (
        f"unreachable ({type(exc).__name__})"
        if isinstance(exc, httpx.ConnectError)
        else (type(exc).__name__)
    )


@db_thread
def _read_routing(
    session_id: str | None, *, policy: RoutingPolicy
) -> tuple[services.RouteRow | None, float, NodeTable]:
    """The session's row, when its read started (``time.monotonic()``) and the node table."""
    table = nodes_for_routing(
        stale_after_s=services.routing_stale_after_s(policy), pinned=lookups.pinned_counts()
    )
    row_read_at = time.monotonic()
    row = services.route_read(session_id=session_id) if session_id else None
    return row, row_read_at, table


async def _route(
    *,
    session_id: str | None,
    model: str,
    exclude: dict[str, str],
    new_turn: bool,
    policy: RoutingPolicy,
) -> tuple[services.RouteTarget, Any]:
    """Decide the node for one attempt and hold its record in ``route_writer``'s ledger;
    returns the target and the held change (None without a session) for ``commit``. Only the
    reads leave the event loop: the decision and the hold run with no await between them, so
    concurrent decisions of this process see each other, and nobody waits for a write."""
    row, row_read_at, table = await _read_routing(session_id, policy=policy)
    if session_id is not None:
        row = route_writer.pin_of(session_id, row, read_at=row_read_at)
    table = table.with_local_counts(
        pinned_delta=route_writer.pinned_delta(read_at=table.pinned_read_at),
        inflight=inflight.per_node(),
    )
    target = services.route_plan(
        session_id=session_id,
        row=row,
        table=table,
        model=model,
        policy=policy,
        exclude=exclude,
        new_turn=new_turn,
    )
    held = route_writer.hold(target.record) if target.record is not None else None
    return target, held


@db_thread
def _node_is_down(node_id: str) -> bool:
    return Node.objects.filter(node_id=node_id, state=Node.State.DOWN).exists()


async def _open_first(
    address: str,
    *,
    node_id: str,
    body: dict[str, Any],
    session_id: str | None,
    policy: RoutingPolicy,
) -> tuple[httpx.Response, AsyncIterator[bytes] | None, bytes]:
    """Send the request and read up to the first body bytes (or the whole body of a 5xx or a
    429, returned with no iterator)."""
    response = await node_client.chat_open(
        address,
        node_id=node_id,
        payload=body,
        session_id=session_id,
        connect_timeout=policy.connect_timeout_s,
        read_timeout=policy.request_timeout_s,
    )
    try:
        if response.status_code >= 500 or response.status_code == 429:
            await response.aread()
            await node_client.chat_close(response)
            return response, None, b""
        rest = response.aiter_raw()
        return response, rest, await anext(rest, b"")
    except BaseException:
        await node_client.chat_close(response)
        raise


async def _watched(
    node_id: str, opening: Any, *, check_every_s: float
) -> tuple[httpx.Response, AsyncIterator[bytes] | None, bytes]:
    """Await ``opening`` (``_open_first``), checking every ``check_every_s`` seconds whether
    the control loop marked the node down meanwhile (a stopped process accepts connections but
    never answers); then raises ``NodeWentDown``. Cancelling closes the node's response."""
    task = asyncio.ensure_future(opening)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=check_every_s)
            if done:
                return task.result()
            if await _node_is_down(node_id):
                raise NodeWentDown(node_id)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


_kv_moves: dict[str, asyncio.Future[None]] = {}  # session id -> its KV move in flight


async def _moving_kv(
    target: services.RouteTarget, session_id: str, recorded: asyncio.Future[None] | None
) -> None:
    """``_move_kv``, announced in ``_kv_moves`` so that the session's concurrent turns wait
    for it instead of starting the session afresh on the new node (its import would then be
    refused)."""
    move = asyncio.ensure_future(_move_kv(target, session_id, recorded))
    _kv_moves[session_id] = move
    try:
        await asyncio.shield(move)
    finally:
        if _kv_moves.get(session_id) is move:
            del _kv_moves[session_id]


async def _move_kv(
    target: services.RouteTarget, session_id: str, recorded: asyncio.Future[None] | None
) -> None:
    """Carry a moving session's KV from the node it leaves to its new node, then erase it there.

    Best effort: any failure (nothing held, session busy, budget) means the new node prefills
    from the transcript instead, which is always correct, only slower.
    """
    assert target.kv_source is not None and target.decision.previous is not None
    source = target.decision.previous
    try:
        blob = await node_client.session_export(
            target.kv_source, node_id=source, session_id=session_id, timeout=KV_MOVE_TIMEOUT_S
        )
        if blob is None:
            return
        imported = await node_client.session_import(
            target.address,
            node_id=target.node_id,
            session_id=session_id,
            blob=blob,
            timeout=KV_MOVE_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        log.info("KV of %s not moved from %s: %s", session_id, source, exc)
        return
    await node_client.session_erase(
        target.kv_source, node_id=source, session_id=session_id, timeout=2.0
    )
    if recorded is not None:
        await asyncio.shield(recorded)  # the "moved" entry first, then "kv_moved"
    await _record_kv_move(
        session_id=session_id,
        node_id=target.node_id,
        reason=f"KV moved from {source} to {target.node_id}: "
        f"{imported.get('tokens', '?')} tokens, {len(blob)} bytes",
    )


def _retry_after(response: httpx.Response, default: int) -> int:
    try:
        return max(1, int(float(response.headers.get("retry-after", default))))
    except ValueError:
        return default


async def upstream_open(
    *,
    payload: dict[str, Any],
    model: str,
    session_id: str | None,
    policy: RoutingPolicy | None = None,
) -> Upstream:
    """Route ``payload`` (an OpenAI chat body) for package ``model`` and open the node's answer.

    Tries at most ``policy.max_attempts`` nodes, waiting ``retry_backoff_ms`` (doubling, at
    most 1 s) between attempts. A node's 4xx is returned as is (the caller passes it on);
    connection failures, timeouts, overload (503, 429) and a node marked down while we wait
    move to the next node. A 503 (queue full) from the node a session is pinned to is passed
    on as 503 with Retry-After instead: the session keeps its KV and its node. Any other 5xx
    raises ``UpstreamError`` (502 ``node_error``) without a retry (see ``_refused``). Raises ``ArrayFull`` (429) when
    this process already holds ``max_inflight`` requests or every node is at its limits, and
    ``NoHealthyNode`` (503) when no node is left; both carry ``retry_after``. ``policy`` saves
    a read when the caller already has it.
    """
    policy = policy or await lookups.arouting_policy()
    if policy.max_inflight and inflight.total >= policy.max_inflight:
        raise ArrayFull(
            f"The control plane has {inflight.total} requests open (max_inflight "
            f"{policy.max_inflight}); retry shortly.",
            retry_after=1,
        )
    exclude: dict[str, str] = {}
    for attempt in range(policy.max_attempts):
        if attempt:
            metric_inc("phalanx_proxy_retries_total")
            await asyncio.sleep(
                min(MAX_BACKOFF_S, policy.retry_backoff_ms / 1000 * 2 ** (attempt - 1))
            )
        target, held = await _route(
            session_id=session_id,
            model=model,
            exclude=exclude,
            new_turn=attempt == 0,
            policy=policy,
        )
        upstream = await _attempt(
            target, held, payload=payload, session_id=session_id, policy=policy, exclude=exclude
        )
        if upstream is not None:
            return upstream
    tried = "; ".join(f"{node} {why}" for node, why in exclude.items())
    raise NoHealthyNode(
        f"No node could take the request ({tried}).",
        retry_after=max(1, round(policy.health_interval_s)),
    )


async def _attempt(
    target: services.RouteTarget,
    held: Any,
    *,
    payload: dict[str, Any],
    session_id: str | None,
    policy: RoutingPolicy,
    exclude: dict[str, str],
) -> Upstream | None:
    """Send the request to ``target`` and wait for its first byte. Returns the open answer, or
    None after adding the node to ``exclude`` with the reason (the caller tries another).
    Raises ``NoHealthyNode`` (503 ``node_busy``) when the node a session sticks to is busy."""
    recorded = None
    if target.kv_source and session_id:
        recorded, held = route_writer.commit(held), None
        await _moving_kv(target, session_id, recorded)
    elif session_id in _kv_moves:  # a concurrent turn carries the KV: send after it lands
        with contextlib.suppress(Exception):
            await asyncio.shield(_kv_moves[session_id])
    inflight.acquire(target.node_id)
    try:
        response, rest, first = await _watched(
            target.node_id,
            _open_first(
                target.address,
                node_id=target.node_id,
                body={**payload, "model": target.model},
                session_id=session_id,
                policy=policy,
            ),
            check_every_s=max(0.2, policy.health_interval_s / 2),
        )
    except BaseException as exc:
        inflight.release(target.node_id)
        route_writer.commit(held)
        if not isinstance(exc, httpx.TransportError | NodeWentDown):
            raise  # the client went away (cancelled)
        log.warning("request to %s failed before its first byte: %s", target.node_id, exc)
        await _exclude(target.node_id, _describe(exc), exclude, policy, failed=True)
        return None
    if rest is None:  # 5xx or 429
        inflight.release(target.node_id)
        route_writer.commit(held)
        return await _refused(target, response, payload=payload, policy=policy, exclude=exclude)
    request_breaker.success(target.node_id)
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
        held,
        recorded,
    )


OVERLOAD_STATUSES = (429, 503)


async def _refused(
    target: services.RouteTarget,
    response: httpx.Response,
    *,
    payload: dict[str, Any],
    policy: RoutingPolicy,
    exclude: dict[str, str],
) -> None:
    """A node's 5xx or 429 before any body. Overload (503, 429) moves the request to another
    node, or, for a session pinned there, is passed on as 503 ``node_busy`` with the node's
    Retry-After; nothing is counted against the node. Any other 5xx is this request's failure:
    returned to the client as 502 ``node_error``, never retried with the same body on other
    nodes, and counted against the node only through ``request_breaker`` (distinct requests
    failing there while others succeed). Returns None after excluding the node (the caller
    tries another); raises ``NoHealthyNode`` or ``UpstreamError`` otherwise."""
    status = response.status_code
    if status in OVERLOAD_STATUSES:
        if target.decision.action == "stuck":
            raise NoHealthyNode(
                f"{target.node_id}, where this session is pinned, is busy; retry shortly.",
                retry_after=_retry_after(response, 1),
                code="node_busy",
            )
        await _exclude(target.node_id, f"answered {status}", exclude, policy, failed=False)
        return None
    message = _error_message(response)
    log.warning("%s answered %s to one request: %s", target.node_id, status, message)
    metric_inc("phalanx_proxy_node_request_errors_total")
    trip = request_breaker.failure(target.node_id, request_fingerprint(payload), message)
    if trip is not None:
        await _record_failure(node_id=target.node_id, reason=trip.describe(), failure_threshold=1)
    raise UpstreamError(
        f"{target.node_id} failed this request ({status}): {message}",
        code="node_error",
        status=502,
    )


def _error_message(response: httpx.Response) -> str:
    """The ``error.message`` of a node's JSON error body, else the start of its text."""
    try:
        return str(response.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return response.text[:500] or f"HTTP {response.status_code}"


async def _exclude(
    node_id: str, reason: str, exclude: dict[str, str], policy: RoutingPolicy, *, failed: bool
) -> None:
    """Leave ``node_id`` out of this request's next attempts; count a failure against it."""
    exclude[node_id] = reason
    if failed:
        await _record_failure(
            node_id=node_id, reason=reason, failure_threshold=policy.failure_threshold
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
                upstream.record_soon()
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
            upstream.record_soon()
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
