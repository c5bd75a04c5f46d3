"""The OpenAI-compatible proxy: ``POST /v1/chat/completions``, ``GET /v1/models`` and
``POST /v1/embeddings`` (served by the control plane itself).

Thin async views: authenticate, validate, hand to ``inference.proxy``, translate domain errors
(``inference.errors.ProxyError``) into OpenAI-shaped JSON errors.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from console.lib import logs
from console.lib.bare_http import db_thread
from inference import lookups, proxy, selectors, tokens
from inference.errors import BadRequest, MethodNotAllowed, ProxyError
from inference.migration import is_stream, migrating_events, read_whole, sse_passthrough
from inference.models import RoutingPolicy
from inference.relay import Upstream
from inference.request_checks import (
    REQUEST_ID_HEADER,
    check_chat_body,
    parse_json_object,
    request_id,
    session_key,
)
from inference.semcache import answers
from inference.semcache.embeddings_request import check_embeddings_body, embeddings_body
from inference.semcache.encoder import shared_encoder
from inference.semcache.package import embedding_models, onnx_dir
from inference.usage.limits import cap_max_tokens
from inference.usage.quotas import Caller
from inference.usage.turns import open_ticket, release

NODE_HEADER = "X-Phalanx-Node"
PACKAGE_HEADER = "X-Phalanx-Package"
MIGRATED_HEADER = "X-Phalanx-Migrated-From"  # a non-streamed answer its first node cut


def error_response(exc: ProxyError) -> JsonResponse:
    """OpenAI-shaped error JSON with the error's status (and Retry-After when set)."""
    response = JsonResponse(exc.body(), status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


async def _authenticate(request: HttpRequest) -> Caller:
    return await lookups.acaller_for_token(
        tokens.bearer_token(request.headers.get("Authorization"))
    )


async def _prepare_chat(
    request: HttpRequest,
) -> tuple[dict[str, Any], str, str | None, RoutingPolicy, Caller]:
    """Authenticate, validate (the caller's ``max_tokens`` quota included), resolve the model
    (to its client-facing name: the family) and the session key. Token, package and policy
    come from ``inference.lookups``: no thread hop while they are cached."""
    caller = await _authenticate(request)
    body = cap_max_tokens(check_chat_body(parse_json_object(request.body)), caller.limits)
    model = await lookups.amodel_for_request(body["model"])
    policy = await lookups.arouting_policy()
    key = session_key(request.headers, header=policy.session_header)
    return body, model, key, policy, caller


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """OpenAI chat completion through the array; ``stream: true`` relays the node's SSE.

    Headers in: ``Authorization: Bearer <token>``, the session header (default
    ``X-Session-Id``), ``X-Request-Id`` (optional: kept when a plain token, else 400).
    Out: ``X-Request-Id`` (the client's or a new one, on every answer: the node logs the turn
    under it too), ``X-Phalanx-Node`` names the node that answered, ``X-Phalanx-Package``
    the ``name:version`` that served (also the answer's ``system_fingerprint``; its
    ``model`` is the family).
    """
    try:
        rid = request_id(request.headers.get(REQUEST_ID_HEADER))
    except ProxyError as exc:
        return error_response(exc)
    logs.bind(request_id=rid)
    response = await _chat(request, rid)
    response[REQUEST_ID_HEADER] = rid
    return response


async def _chat(request: HttpRequest, rid: str) -> HttpResponse:
    try:
        if request.method != "POST":
            raise MethodNotAllowed("Use POST for /v1/chat/completions.")
        body, model, key, policy, caller = await _prepare_chat(request)
        logs.bind(session_id=key)
        ticket = await open_ticket(caller, policy)  # OverLimit, ArrayFull: 429
        try:
            asked = await _cache_asked(request, body, model)  # BadRequest: a bad cache header
            if asked.hit is not None:
                await release(ticket)
                return _with_headers(_cached_answer(asked, body), asked, key)
            upstream = await proxy.upstream_open(
                payload=body,
                model=model,
                session_id=key,
                policy=policy,
                request_id=rid,
                ticket=ticket,
            )
        except BaseException:
            await release(ticket)  # no node answers: the turn's slot and lease go back
            raise
    except ProxyError as exc:
        return error_response(exc)
    if is_stream(upstream):
        response: HttpResponse = _streamed(upstream, asked)
    else:
        response, upstream = await _whole(upstream)
        _remember_whole(asked, response, upstream)
    response[NODE_HEADER] = upstream.node_id
    if upstream.package:
        response[PACKAGE_HEADER] = upstream.package
    return _with_headers(response, asked, key)


def _with_headers(response: HttpResponse, asked: answers.Asked, key: str | None) -> HttpResponse:
    for name, value in asked.headers().items():
        response[name] = value
    if key:
        response["X-Session-Id"] = key
    return response


async def _cache_asked(request: HttpRequest, body: dict[str, Any], model: str) -> answers.Asked:
    """The semantic cache's part in this request (``inference.semcache.answers``)."""
    raw = tokens.bearer_token(request.headers.get("Authorization"))
    try:
        choice = answers.opted(
            request.headers.get(answers.HEADER), await lookups.atoken_caches_answers(raw)
        )
    except ValueError as exc:
        raise BadRequest(str(exc), code="invalid_cache_header") from None
    return await answers.ask(body, model, choice)


def _cached_answer(asked: answers.Asked, body: dict[str, Any]) -> HttpResponse:
    hit = asked.hit
    assert hit is not None
    if body.get("stream"):
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response: HttpResponse = _events_response(
            answers.replayed(answers.served_events(hit, usage))
        )
    else:
        response = JsonResponse(answers.served_completion(hit))
    if hit.entry.package:
        response[PACKAGE_HEADER] = hit.entry.package
    return response


_storing: set[asyncio.Task] = set()  # answers being stored after their response went out


def _remember_whole(asked: answers.Asked, response: HttpResponse, upstream: Upstream) -> None:
    if asked.miss is None or response.status_code != 200 or response.streaming:
        return
    try:
        completion = json.loads(response.content)
    except ValueError:
        return
    task = asyncio.ensure_future(answers.remember(asked, completion, upstream.package or ""))
    _storing.add(task)
    task.add_done_callback(_storing.discard)


def _streamed(upstream: Upstream, asked: answers.Asked | None = None) -> StreamingHttpResponse:
    if asked is not None and asked.miss is not None:
        events = migrating_events(upstream)
        teed = answers.teed(events, asked, upstream.package or "")
        return _events_response(ClosingStream(teed, upstream))
    return _events_response(ClosingStream(sse_passthrough(upstream), upstream))


class ClosingStream:
    """A streamed answer's bytes for ``StreamingHttpResponse`` that closes its upstream however
    the response ends. Read, the generator's own ``finally`` closes it; but a response dropped
    before its first byte (the client went away between the view's return and the send)
    never starts the generator, so its ``finally`` never runs: then ``close`` (Django calls it
    from a worker thread) or, failing that, garbage collection hands the upstream's node
    connection, ``max_inflight`` slot and usage lease back on the event loop."""

    def __init__(self, events: AsyncIterator[bytes], upstream: Upstream) -> None:
        self._events = events
        self._upstream = upstream
        self._loop = asyncio.get_running_loop()
        self._started = False
        self._closed = False

    def __aiter__(self) -> ClosingStream:
        return self

    async def __anext__(self) -> bytes:
        self._started = True
        return await anext(self._events)

    async def aclose(self) -> None:
        self._closed = True
        await self._events.aclose()
        if not self._started:
            await self._upstream.aclose()

    def close(self) -> None:
        if self._closed or self._started or self._loop.is_closed():
            return
        self._closed = True
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._upstream.aclose()))

    def __del__(self) -> None:
        self.close()


def _events_response(events: Any) -> StreamingHttpResponse:
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _whole(upstream: Upstream) -> tuple[HttpResponse, Upstream]:
    """The response for a non-streamed answer (or a node's error status) and the upstream
    that gave it: another node's when the first cut it (``MIGRATED_HEADER`` names that one)."""
    try:
        content, answered = await read_whole(upstream)
    except ProxyError as exc:
        return error_response(exc), upstream
    if content is None:
        response: HttpResponse = _streamed(answered)
    else:
        content_type = answered.headers.get("content-type", "application/json")
        response = HttpResponse(content, status=answered.status, content_type=content_type)
    if answered is not upstream:
        response[MIGRATED_HEADER] = upstream.node_id
    return response, answered


@csrf_exempt
async def models_list(request: HttpRequest) -> HttpResponse:
    """OpenAI model list of what clients can ask for now: the chat models of up nodes
    (``selectors.served_models``) ``{"object": "list", "data": [{"id": family, "object":
    "model", "created": s, "owned_by", "kind": "chat", "up": nodes, "versions": [{"package":
    "name:version", "up": nodes}]}]}``, then the approved embedding packages the control plane
    serves (``kind`` ``embedding``, no node counts; ``/v1/embeddings``)."""
    try:
        if request.method != "GET":
            raise MethodNotAllowed("Use GET for /v1/models.")
        await _authenticate(request)
    except ProxyError as exc:
        return error_response(exc)
    served = await db_thread(selectors.served_models)()
    data = [
        {
            "id": model.name,
            "object": "model",
            "owned_by": "phalanx",
            "created": model.created,
            "kind": "chat",
            "up": model.up,
            "versions": [{"package": v.package, "up": v.up} for v in model.versions],
        }
        for model in served
        if model.up
    ]
    return JsonResponse({"object": "list", "data": data + await db_thread(_embedding_listed)()})


def _embedding_listed() -> list[dict[str, Any]]:
    """The approved embedding packages as ``/v1/models`` entries, one per family."""
    entries: dict[str, dict[str, Any]] = {}
    for model in embedding_models():  # newest first
        entry = entries.setdefault(
            model.family,
            {"id": model.family, "object": "model", "owned_by": "phalanx", "kind": "embedding"},
        )
        entry.setdefault("created", model.created)
        entry.setdefault("versions", []).append({"package": model.key})
    return list(entries.values())


@csrf_exempt
async def embeddings(request: HttpRequest) -> HttpResponse:
    """OpenAI's ``POST /v1/embeddings`` with the approved embedding package ``model`` names
    (its name, ``name:version`` or family: ``inference.semcache.package``; the answer's
    ``model`` is its family), run by this process (``inference.semcache.encoder``). Same
    token as chat. 404 ``model_not_found`` naming the embedding models for any other name,
    400 for a chat model's."""
    try:
        if request.method != "POST":
            raise MethodNotAllowed("Use POST for /v1/embeddings.")
        await _authenticate(request)
        asked = check_embeddings_body(parse_json_object(request.body))
        served = await lookups.aembedding_for_request(asked.model)
        vectors, tokens = await _embedded(served.files, asked.texts)
    except ProxyError as exc:
        return error_response(exc)
    body = embeddings_body(vectors, base64_encoded=asked.base64, tokens=tokens, model=served.family)
    return JsonResponse(body)


EMBEDDING_SLOTS = 2  # requests a process embeds at once; more get 503 with Retry-After
_embedding: list[int] = [0]


async def _embedded(files: Path, texts: list[str]) -> tuple[Any, int]:
    """(vectors, tokens) of ``texts`` by the encoder of the package files in ``files``, at most ``EMBEDDING_SLOTS`` requests at a time (the
    encoder takes CPU the proxy needs); ``ProxyError`` 503 when they are taken."""
    if _embedding[0] >= EMBEDDING_SLOTS:
        raise ProxyError(
            "The encoder is busy with other requests; retry shortly.",
            code="embeddings_busy",
            status=503,
            retry_after=1,
        )
    _embedding[0] += 1
    try:
        encoder = await asyncio.to_thread(shared_encoder, onnx_dir(), files)
        vectors = await asyncio.to_thread(encoder.embed, texts)
        return vectors, await asyncio.to_thread(encoder.count_tokens, texts)
    finally:
        _embedding[0] -= 1


async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """JSON 404 for unknown ``/v1/`` paths."""
    return error_response(
        ProxyError(f"Unknown endpoint {request.path}.", code="not_found", status=404)
    )
