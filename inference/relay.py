"""A node's open answer and its relay to the client, checked to the end.

``Upstream`` is what ``inference.proxy.upstream_open`` returns once a node has sent its first
body bytes. ``checked_events`` yields a streamed answer's SSE events (``inference.migration``
relays them, and continues a cut answer on another node); ``Upstream.read_all`` reads a
non-streamed answer. Each checks that the answer ended honestly (``inference.sse``): a stream
that breaks, is cut short, ends without a finish reason or ``[DONE]``, or sends an event that
is not JSON raises ``StreamBroken``; ``Upstream.broke`` counts it against the node and makes
the session's next turn move to another node. Closing the upstream (``Upstream.aclose``)
drops the connection so the node stops generating.
``refuse_poison`` and ``stop_if_failed_twice`` keep a body that failed on two nodes from being
carried round the array (``request_breaker``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from console.lib.bare_http import db_thread
from console.lib.metrics import metric_inc
from inference.control_plane_metrics import PROXY_BROKEN_ANSWERS
from inference.errors import UpstreamError
from inference.request_breaker import request_breaker, request_fingerprint
from inference.route_writer import route_writer
from inference.routing import Decision
from inference.sse import DONE, SSEDecoder, StreamBroken, StreamCheck, check_completion
from inference.usage import turns as usage_turns
from nodes import client as node_client
from nodes import services as node_services

log = logging.getLogger(__name__)

_record_failure = db_thread(node_services.node_record_failure)

RECORD_DELAY_S = 0.005  # after the first token is relayed, see Upstream.record_soon
DRAIN_BYTES = 64 << 10  # what a whole answer's connection may still carry (Upstream._drain)
DRAIN_S = 0.25
BROKEN_TURN_MEMORY_S = 3600.0  # how long a broken turn sends its session's next turn elsewhere


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


class BrokenTurns:
    """Sessions whose last turn broke mid-answer, and on which node (per process).

    ``inference.proxy`` keeps such a session off that node at its next turn (docs/
    control-plane.md: the next turn moves with the whole transcript)."""

    def __init__(self) -> None:
        self._broken: dict[str, tuple[str, float]] = {}

    def note(self, session_id: str | None, node_id: str) -> None:
        if session_id:
            self._broken[session_id] = (node_id, time.monotonic())

    def take(self, session_id: str | None) -> str | None:
        """The node that broke the session's last turn (once), or None."""
        if not session_id or session_id not in self._broken:
            return None
        node_id, at = self._broken.pop(session_id)
        return node_id if time.monotonic() - at < BROKEN_TURN_MEMORY_S else None

    def clear(self) -> None:
        self._broken.clear()


broken_turns = BrokenTurns()


@dataclass
class Upstream:
    """A node's open answer: status, headers, the first body bytes and an iterator for the rest.

    Holds one ``inflight`` slot for its node until ``aclose``. ``payload`` is the body sent
    (for the request's fingerprint when it fails), ``session_id`` its session.
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
    payload: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    package: str | None = None  # name:version the node serves (X-Phalanx-Package)
    model: str = ""  # the client-facing name it was routed for (the family)
    first_token_deadline_s: float | None = None  # streamed: the request's first-byte deadline
    request_id: str | None = None  # X-Request-Id: the turn's id on every log line of it
    record_scheduled: bool = False
    released: bool = False
    whole: bool = False  # the answer ended ([DONE]): what follows may be read and dropped
    ticket: usage_turns.Ticket | None = None  # whom the turn counts against (inference.usage)
    broken: bool = False  # the node broke the answer after its first byte

    async def count(self) -> None:
        """Count the turn's usage against its caller, once (``inference.usage.turns``)."""
        if self.ticket is not None and not self.ticket.ended:
            await usage_turns.ended(
                self.ticket,
                model=self.model,
                package=self.package or "",
                node_id=self.node_id,
                session_id=self.session_id,
                request_id=self.request_id,
                failed=self.status != 200 or self.broken,
            )

    def record(self) -> None:
        """Queue the request's route record for writing, once."""
        if self.held is not None:
            self.recorded = route_writer.commit(self.held)
            self.held = None

    def record_soon(self) -> None:
        """``record`` in ``RECORD_DELAY_S``: the relays call it once the node's first token
        (its second event: the first, the role, comes before prefill) has been passed on, so
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
            log.info("answer closed", extra={"node_id": self.node_id, "status": self.status})
            await self.count()
        if self.whole:
            await self._drain()
        await node_client.chat_close(self.response)
        self.record()
        if self.recorded is not None:
            await asyncio.shield(self.recorded)

    async def _drain(self) -> None:
        """Read what the node still sends after a whole answer (its HTTP body's last chunk)
        and drop it, so the connection goes back to the pool instead of being closed: the
        next request to this node skips a TCP connect and the node's accept. At most
        ``DRAIN_BYTES`` within ``DRAIN_S``; past either the connection is dropped as before."""
        read = 0

        async def rest() -> None:
            nonlocal read
            async for chunk in self.rest:
                read += len(chunk)
                if read > DRAIN_BYTES:
                    return

        try:
            await asyncio.wait_for(rest(), DRAIN_S)
        except (TimeoutError, httpx.TransportError):
            pass

    async def read_all(self) -> bytes:
        """The whole body; raises ``UpstreamError`` (502) when the node breaks before the end
        or a 200 is not a finished completion (empty, cut short, not JSON)."""
        parts = [self.first]
        try:
            async for chunk in self.rest:
                parts.append(chunk)
                self.record()
            body = b"".join(parts)
            check_completion(self.status, body)
            if self.ticket is not None:
                self.ticket.meter.see_body(body)
        except httpx.TransportError as exc:
            reason = f"broke off its answer: {describe_transport_error(exc)}"
            await self.broke(reason)
            raise UpstreamError(f"{self.node_id} {reason}") from exc
        except StreamBroken as exc:
            await self.broke(str(exc), detail=exc.detail)
            raise UpstreamError(f"{self.node_id} {exc}") from exc
        finally:
            await self.aclose()
        return body

    async def broke(self, reason: str, *, detail: str = "") -> None:
        """The answer broke after its first byte: log it (with ``detail``, what the node sent),
        count it against the node (a failed probe, and in ``request_breaker``), and send the
        session's next turn elsewhere."""
        log.warning("%s broke an answer: %s %s", self.node_id, reason, detail)
        self.broken = True
        metric_inc(PROXY_BROKEN_ANSWERS)
        broken_turns.note(self.session_id, self.node_id)
        await self.request_failed(reason)
        await _record_failure(
            node_id=self.node_id,
            reason=f"broke mid-answer: {reason}",
            failure_threshold=self.failure_threshold,
        )

    async def request_failed(self, reason: str) -> None:
        """Note this request's failure in ``request_breaker``; a trip takes the node out."""
        trip = request_breaker.failure(self.node_id, request_fingerprint(self.payload), reason)
        if trip is not None:
            await take_out(self.node_id, trip.describe())


async def take_out(node_id: str, evidence: str) -> None:
    """Mark ``node_id`` down now (``request_breaker`` tripped), with the evidence as reason."""
    await _record_failure(node_id=node_id, reason=evidence, failure_threshold=1)


async def stop_if_failed_twice(node_id: str, payload: dict[str, Any], reason: str) -> None:
    """Note a failure of a request the node received; raises ``UpstreamError`` (502) instead of
    a retry when the same body already failed on another node: a body that crashes or wedges
    nodes (a "query of death") is not carried round the array."""
    fingerprint = request_fingerprint(payload)
    trip = request_breaker.failure(node_id, fingerprint, reason)
    if trip is not None:
        await take_out(node_id, trip.describe())
    failed_on = request_breaker.nodes_failed(fingerprint) | {node_id}
    if len(failed_on) >= POISON_NODES:
        raise UpstreamError(
            f"This request failed on {' and '.join(sorted(failed_on))} ({reason}); it is not "
            "sent to another node.",
            code="request_failed_on_nodes",
        )


def refuse_poison(payload: dict[str, Any]) -> None:
    """Raises ``UpstreamError`` (422) for a body that failed on ``POISON_NODES`` nodes within
    the breaker's window. Costs nothing while no request has failed."""
    if not request_breaker.failed_on:
        return
    failed_on = request_breaker.nodes_failed(request_fingerprint(payload))
    if len(failed_on) >= POISON_NODES:
        raise UpstreamError(
            f"This request made {' and '.join(sorted(failed_on))} fail in the last "
            f"{request_breaker.window_s:g} s; it is not sent again until then.",
            code="request_quarantined",
            status=422,
        )


POISON_NODES = 2


def describe_transport_error(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"unreachable ({type(exc).__name__})"
    return type(exc).__name__


async def checked_events(upstream: Upstream) -> AsyncIterator[tuple[bytes, Any]]:
    """The node's SSE events as ``(raw bytes, payload)``, checked (``StreamCheck``); raises
    ``StreamBroken`` when the answer cannot end as a success, transport errors included. An
    in-band error from the node counts as the request's failure; its missing ``[DONE]`` is
    added. Nothing after ``[DONE]`` is read: the answer is whole (the caller closes the
    upstream), whatever a node sends after it."""
    decoder, check = SSEDecoder(), StreamCheck()
    meter = upstream.ticket.meter if upstream.ticket is not None else None
    try:
        for raw, payload in decoder.feed(upstream.first):
            check.see(payload)
            if meter is not None:
                meter.see(payload)
            upstream.whole = check.done
            if check.done:  # counted before the client hears the end: its next turn sees it
                await upstream.count()
            yield raw, payload
            if check.done:
                return
        async for chunk in upstream.rest:
            for raw, payload in decoder.feed(chunk):
                check.see(payload)
                if meter is not None:
                    meter.see(payload)
                upstream.whole = check.done
                if check.done:
                    await upstream.count()
                yield raw, payload
                upstream.record_soon()
                if check.done:
                    return
        check.end(decoder.pending)
    except httpx.TransportError as exc:
        raise StreamBroken(f"broke off the stream: {describe_transport_error(exc)}") from exc
    if check.errored:
        if check.error_type != "invalid_request_error":  # the request's fault is not the node's
            await upstream.request_failed("sent an in-band error event")
        if not check.done:
            yield f"data: {DONE}\n\n".encode(), DONE
