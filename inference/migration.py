"""Request migration: a streamed answer its node cut goes on on another node.

When a streamed answer breaks after its first byte (the node died, its connection dropped, it
sent something that is not an answer: ``inference.sse.StreamBroken``), the proxy keeps what it
relayed and re-issues the turn once, to another Phalanx node, with the relayed text as the
start of the assistant's answer (``continue_final_message``: the node continues that message
rather than starting one). The client sees one stream: the continuation's role chunk is
dropped, its chunks carry the first answer's ``id`` and ``created``, and the chunks that end it
(finish reason, usage) say ``"migrated": {"from": node, "to": node}``; usage counts the first
node's relayed deltas (one token each on a Phalanx node) in ``completion_tokens``. A node
relays a tool call only once it is whole (``nodes.agent.completions.CompletionShaper``), so a
call cut mid-way was never seen and starts again: nothing is spliced.

Bounded: one migration a turn, and only when the continuation's first token (not its role
chunk, which a node sends before prefill) arrives within the request's first-byte deadline
(``inference.deadlines``). Otherwise, and when the answer cannot be continued (text relayed
under a JSON ``response_format``, a tool call or a finish reason already relayed), the answer
ends with the honest in-band error event, as it did before. Nvidia Dynamo calls this request
migration; docs/control-plane.md, "Failover".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from console.lib.metrics import metric_inc
from inference import proxy
from inference.chat_request import parse_chat_request
from inference.control_plane_metrics import PROXY_MIGRATIONS, PROXY_MIGRATIONS_FAILED
from inference.errors import BadRequest, ProxyError, UpstreamError
from inference.relay import Upstream, checked_events
from inference.sse import DONE, StreamBroken, error_body, sse_error_event

log = logging.getLogger(__name__)

CUT_THE_ANSWER = "cut this answer"
Event = tuple[bytes, Any]  # an SSE event's bytes and its decoded payload


@dataclass
class Relayed:
    """What the client has been sent of one answer: ``see`` each event as it goes out."""

    parts: list[str] = field(default_factory=list)
    deltas: int = 0  # content deltas relayed
    called: bool = False  # a tool_calls delta went out
    finished: bool = False  # a finish reason went out
    id: Any = None
    created: Any = None

    def see(self, payload: Any) -> None:
        if not isinstance(payload, dict):
            return
        if self.id is None:
            self.id, self.created = payload.get("id"), payload.get("created")
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and delta.get("content"):
                self.parts.append(str(delta["content"]))
                self.deltas += 1
            if isinstance(delta, dict) and delta.get("tool_calls"):
                self.called = True
            if choice.get("finish_reason"):
                self.finished = True

    @property
    def text(self) -> str:
        return "".join(self.parts)


def continuation_body(payload: dict[str, Any], relayed: Relayed) -> dict[str, Any] | None:
    """The chat body that goes on with ``payload``'s answer after ``relayed``, or None when it
    cannot go on (a call or a finish reason went out; text went out under a grammar, which
    ``inference.chat_request`` refuses to continue). Nothing relayed yet: the turn itself, again. ``max_tokens`` is lowered by the
    deltas relayed (at least 1)."""
    if relayed.called or relayed.finished:
        return None
    body = {k: v for k, v in payload.items() if k != "max_completion_tokens"}
    limit = _limit(payload)
    if limit is not None:
        body["max_tokens"] = max(1, limit - relayed.deltas)
    if not relayed.text:
        return body
    body["messages"] = _with_answer_start(payload["messages"], relayed.text, payload)
    body["continue_final_message"] = True
    try:  # the one rule of what can be continued, the node's own (no grammar-held answer)
        parse_chat_request(body)
    except BadRequest:
        return None
    return body


def _limit(payload: dict[str, Any]) -> int | None:
    limit = payload.get("max_tokens") or payload.get("max_completion_tokens")
    return limit if isinstance(limit, int) else None


def _at_limit(payload: dict[str, Any], relayed: Relayed) -> bool:
    """Whether the relayed deltas already reach the turn's ``max_tokens`` (no finish went
    out): a continuation would write past it."""
    limit = _limit(payload)
    return limit is not None and not relayed.finished and relayed.deltas >= limit


def _ended_at_limit(relayed: Relayed) -> list[Event]:
    """The end of an answer cut after its last allowed token: its finish (``length``, what the
    node would have sent) and ``[DONE]``."""
    finish = {
        "id": relayed.id,
        "object": "chat.completion.chunk",
        "created": relayed.created,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
    }
    return [
        (f"data: {json.dumps(finish)}\n\n".encode(), finish),
        (f"data: {DONE}\n\n".encode(), DONE),
    ]


def _with_answer_start(
    messages: list[dict[str, Any]], text: str, payload: dict[str, Any]
) -> list[dict[str, Any]]:
    """``messages`` with ``text`` as the assistant's answer so far: a new last message, or, when
    the client itself asked to continue its last message, that message's text plus ``text``."""
    if not payload.get("continue_final_message"):
        return [*messages, {"role": "assistant", "content": text}]
    last = messages[-1]
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return [*messages[:-1], {**last, "content": content + text}]


async def migrating_events(upstream: Upstream) -> AsyncIterator[Event]:
    """``upstream``'s answer as checked ``(raw, payload)`` events, continued once on another
    node when it breaks (module doc). Every upstream it opens is closed on exit; an answer
    that breaks and cannot go on ends with an in-band error event (its raw bytes include
    ``[DONE]``)."""
    relayed = Relayed()
    try:
        async for raw, payload in checked_events(upstream):
            relayed.see(payload)
            yield raw, payload
        return
    except StreamBroken as exc:
        await upstream.broke(str(exc), detail=exc.detail)
        cut = f"{upstream.node_id} {exc}"
    finally:
        await upstream.aclose()
    if _at_limit(upstream.payload, relayed):  # cut after its last token: it is whole
        for event in _ended_at_limit(relayed):
            yield event
        return
    body = continuation_body(upstream.payload, relayed)
    if body is None:
        yield _error(f"{cut}; the answer cannot be continued on another node")
        return
    async for event in _continued(upstream, body, relayed, cut):
        yield event


async def _continued(
    cut_upstream: Upstream, body: dict[str, Any], relayed: Relayed, cut: str
) -> AsyncIterator[Event]:
    """The continuation's events, rewritten to belong to the cut answer; the honest error event
    when no node continues it in time or the continuation breaks too."""
    opened, why = await _open_continuation(cut_upstream, body)
    if opened is None:
        metric_inc(PROXY_MIGRATIONS_FAILED)
        yield _error(f"{cut}; {why}")
        return
    moved = {"from": cut_upstream.node_id, "to": opened.node_id}
    log.info("answer cut on %s continues on %s", moved["from"], moved["to"])
    try:
        events = checked_events(opened)
        started = await _first_token(opened, events)
        if started is None:
            metric_inc(PROXY_MIGRATIONS_FAILED)
            yield _error(f"{cut}; {opened.node_id} did not continue it within its deadline")
            return
        metric_inc(PROXY_MIGRATIONS)
        async for raw, payload in _chained(started, events):
            if not _is_role_only(payload):  # the client has had its role chunk
                yield from_continuation(raw, payload, relayed, moved)
    except StreamBroken as exc:
        await opened.broke(str(exc), detail=exc.detail)
        yield _error(f"{cut}; its continuation on {opened.node_id} {exc}")
    finally:
        await opened.aclose()


async def _elsewhere(cut: Upstream, body: dict[str, Any], *, continuing: bool) -> Upstream:
    """``body`` opened on another node than ``cut``'s, for the same turn (model, session,
    request id); ``proxy.upstream_open``'s errors."""
    return await proxy.upstream_open(
        payload=body,
        model=cut.model,
        session_id=cut.session_id,
        avoid={cut.node_id: CUT_THE_ANSWER},
        continuing=continuing,
        request_id=cut.request_id,
        ticket=cut.ticket.carried_on() if cut.ticket is not None else None,
    )


async def _open_continuation(
    cut_upstream: Upstream, body: dict[str, Any]
) -> tuple[Upstream | None, str]:
    """Another node's open answer to ``body`` (a Phalanx node, not the one that cut it), or
    None and why not."""
    try:
        opened = await _elsewhere(cut_upstream, body, continuing=True)
    except ProxyError as exc:
        return None, f"no other node could continue it: {exc.message}"
    if not is_stream(opened):
        await opened.aclose()
        return None, f"{opened.node_id} refused to continue it (HTTP {opened.status})"
    return opened, ""


async def _first_token(opened: Upstream, events: AsyncIterator[Event]) -> list[Event] | None:
    """The continuation's events up to its first token (or its end), read within its
    first-byte deadline (``Upstream.first_token_deadline_s``); None when that passes.
    Raises ``StreamBroken`` when it breaks first."""
    give_up_at = time.monotonic() + (opened.first_token_deadline_s or 0.0)
    started: list[Event] = []
    while True:
        try:
            raw, payload = await asyncio.wait_for(
                anext(events), timeout=max(0.0, give_up_at - time.monotonic())
            )
        except TimeoutError:
            return None
        except StopAsyncIteration:
            return started
        started.append((raw, payload))
        if not _is_role_only(payload):
            return started


def _is_role_only(payload: Any) -> bool:
    """Whether an event is a chunk that only opens the assistant's message (sent before
    prefill): no content, call, finish reason, usage or error."""
    if not isinstance(payload, dict) or "error" in payload or payload.get("usage"):
        return False
    for choice in payload.get("choices") or [{}]:
        if not isinstance(choice, dict):
            return False
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if choice.get("finish_reason") or delta.get("content") or delta.get("tool_calls"):
            return False
    return True


async def _chained(first: list[Event], rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    for event in first:
        yield event
    async for event in rest:
        yield event


def from_continuation(raw: bytes, payload: Any, relayed: Relayed, moved: dict[str, str]) -> Event:
    """One continuation event (not its role chunk) as part of the cut answer: ids are the first
    answer's, the chunks that end it carry ``migrated`` and usage that counts the relayed
    deltas. ``[DONE]`` and errors pass as sent."""
    if payload == DONE or not isinstance(payload, dict) or "error" in payload:
        return raw, payload
    out = {**payload, "id": relayed.id or payload.get("id")}
    if relayed.created is not None:
        out["created"] = relayed.created
    if payload.get("usage") or any(
        isinstance(c, dict) and c.get("finish_reason") for c in payload.get("choices") or []
    ):
        out["migrated"] = moved
        out["usage"] = _usage_with(payload.get("usage"), relayed.deltas)
    return f"data: {json.dumps(out)}\n\n".encode(), out


def _usage_with(usage: Any, deltas: int) -> Any:
    if not isinstance(usage, dict):
        return usage
    completion = int(usage.get("completion_tokens") or 0) + deltas
    return {
        **usage,
        "completion_tokens": completion,
        "total_tokens": completion + int(usage.get("prompt_tokens") or 0),
    }


def _error(message: str) -> Event:
    return sse_error_event(message), error_body(message)


async def read_whole(upstream: Upstream) -> tuple[bytes | None, Upstream]:
    """A non-streamed answer's body and the upstream that gave it. An answer its node cut
    (``Upstream.read_all`` raises ``UpstreamError``: broken, empty, not a completion) was
    never sent, so the turn is asked once of another node (any kind: it starts afresh); when
    that one streams (the turn asked for a stream, the first node answered with no stream),
    the body is None and the caller relays the returned upstream. Raises ``UpstreamError``
    (502) naming both nodes when the second fails too."""
    try:
        return await upstream.read_all(), upstream
    except UpstreamError as cut:
        try:
            again = await _elsewhere(upstream, upstream.payload, continuing=False)
        except ProxyError as exc:
            metric_inc(PROXY_MIGRATIONS_FAILED)
            raise UpstreamError(
                f"{cut.message}; no other node could answer: {exc.message}"
            ) from exc
    log.info("answer cut on %s is asked of %s", upstream.node_id, again.node_id)
    metric_inc(PROXY_MIGRATIONS)
    if is_stream(again):
        return None, again
    try:
        return await again.read_all(), again
    except UpstreamError as exc:
        raise UpstreamError(f"{upstream.node_id} cut the answer; {exc.message}") from exc


def is_stream(upstream: Upstream) -> bool:
    """Whether the node's answer is a 200 SSE stream (else: a whole body or an error)."""
    content_type = upstream.headers.get("content-type", "")
    return upstream.status == 200 and content_type.startswith("text/event-stream")


async def sse_passthrough(upstream: Upstream) -> AsyncIterator[bytes]:
    """Relay the node's SSE events one by one as they complete (the bytes it sent), continued
    on another node when it cuts the answer (``migrating_events``). When the consumer stops
    (client disconnect cancels the generator) every upstream is closed, so nodes stop
    generating."""
    async for raw, _ in migrating_events(upstream):
        yield raw


async def sse_events(upstream: Upstream) -> AsyncIterator[Any]:
    """Decoded SSE events of a streamed answer (dicts, then ``"[DONE]"``), continued on another
    node when it cuts the answer; an answer that breaks for good yields ``{"error":
    {"message": ...}}`` and ends. Every upstream is closed on exit."""
    async for _, payload in migrating_events(upstream):
        yield payload
