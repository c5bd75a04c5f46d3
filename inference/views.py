"""The OpenAI-compatible proxy: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Thin async views: authenticate, validate, hand to ``inference.proxy``, translate domain errors
(``inference.errors.ProxyError``) into OpenAI-shaped JSON errors.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from console.bare_http import db_thread
from inference import lookups, proxy, selectors, services
from inference.errors import MethodNotAllowed, ProxyError
from inference.models import RoutingPolicy
from inference.relay import sse_passthrough
from inference.validation import check_chat_body, parse_json_object, session_key

NODE_HEADER = "X-Phalanx-Node"


def error_response(exc: ProxyError) -> JsonResponse:
    """OpenAI-shaped error JSON with the error's status (and Retry-After when set)."""
    response = JsonResponse(exc.body(), status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


async def _authenticate(request: HttpRequest) -> str:
    return await lookups.acaller_for_token(
        services.bearer_token(request.headers.get("Authorization"))
    )


async def _prepare_chat(
    request: HttpRequest,
) -> tuple[dict[str, Any], str, str | None, RoutingPolicy]:
    """Authenticate, validate, resolve the model and the session key. Token, package and
    policy come from ``inference.lookups``: no thread hop while they are cached."""
    await _authenticate(request)
    body = check_chat_body(parse_json_object(request.body))
    package = await lookups.apackage_for_model(body["model"])
    policy = await lookups.arouting_policy()
    key = session_key(request.headers, header=policy.session_header)
    return body, package.name, key, policy


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """OpenAI chat completion through the array; ``stream: true`` relays the node's SSE.

    Headers in: ``Authorization: Bearer <token>``, the session header (default
    ``X-Session-Id``). Out: ``X-Phalanx-Node`` names the node that answered.
    """
    try:
        if request.method != "POST":
            raise MethodNotAllowed("Use POST for /v1/chat/completions.")
        body, model, key, policy = await _prepare_chat(request)
        upstream = await proxy.upstream_open(
            payload=body, model=model, session_id=key, policy=policy
        )
    except ProxyError as exc:
        return error_response(exc)
    content_type = upstream.headers.get("content-type", "application/json")
    if upstream.status == 200 and content_type.startswith("text/event-stream"):
        response: HttpResponse | StreamingHttpResponse = StreamingHttpResponse(
            sse_passthrough(upstream), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        try:
            content = await upstream.read_all()
        except ProxyError as exc:
            response = error_response(exc)
        else:
            response = HttpResponse(content, status=upstream.status, content_type=content_type)
    response[NODE_HEADER] = upstream.node_id
    if key:
        response["X-Session-Id"] = key
    return response


@csrf_exempt
async def models_list(request: HttpRequest) -> HttpResponse:
    """OpenAI model list of the packages served by healthy nodes:
    ``{"object": "list", "data": [{"id": name, "object": "model", "created": s, "owned_by"}]}``."""
    try:
        if request.method != "GET":
            raise MethodNotAllowed("Use GET for /v1/models.")
        await _authenticate(request)
    except ProxyError as exc:
        return error_response(exc)
    served = await db_thread(selectors.packages_served)()
    seen: set[str] = set()
    data = []
    for name, package in served:
        if name in seen:
            continue
        seen.add(name)
        data.append(
            {
                "id": name,
                "object": "model",
                "owned_by": "phalanx",
                "created": int(package.created_at.timestamp()),
                "version": package.version,
            }
        )
    return JsonResponse({"object": "list", "data": data})


async def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """JSON 404 for unknown ``/v1/`` paths."""
    return error_response(
        ProxyError(f"Unknown endpoint {request.path}.", code="not_found", status=404)
    )
