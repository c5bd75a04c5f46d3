"""The semantic cache's API for agent runtimes, on ``/v1/cache/`` with the chat token:

- ``POST /v1/cache/tools/lookup`` ``{"tool", "arguments": {...}}`` -> 200 ``{"hit": true,
  "result", "id", "similarity", "age_s", "exact"}`` or ``{"hit": false, "reason"}``;
- ``POST /v1/cache/tools`` ``{"tool", "arguments", "result", "ttl_s"?}`` -> 201 ``{"id",
  "expires_at"}``; 409 ``tool_not_cached`` when no operator enabled the tool's namespace;
- ``POST /v1/cache/false-hits`` ``{"id", "query"?, "note"?}`` -> 201: a served hit (tool result
  or answer, by its ``X-Phalanx-Cache-Id``) was wrong; the entry goes and the report shows on
  the console; 404 when the entry is gone.

A lookup sent with ``X-Phalanx-Cache: bypass`` misses without looking. Each answer carries
``X-Phalanx-Cache`` (``hit`` / ``miss`` / ``bypass``). Bad input is refused here, naming the
field: a tool name that is not 1 to 64 letters, digits, ``_``, ``.`` or ``-``; arguments that
are not an object or exceed ``MAX_ARGUMENTS_BYTES``; a result over ``MAX_RESULT_BYTES``.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from console.lib.bare_http import db_thread
from inference import lookups, tokens
from inference.errors import BadRequest, MethodNotAllowed, ProxyError
from inference.request_checks import parse_json_object
from inference.semcache import service
from inference.semcache.answers import HEADER
from inference.semcache.cache import Hit, tool_text
from inference.semcache.store import Entry

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_RESULT_BYTES = 256 * 1024
MAX_NOTE = 2000
MAX_TTL_S = 30 * 24 * 3600
MAX_ID = 2**63 - 1  # the stores' integer ids


def _error(exc: ProxyError) -> JsonResponse:
    return JsonResponse(exc.body(), status=exc.status)


async def _body(request: HttpRequest) -> dict[str, Any]:
    if request.method != "POST":
        raise MethodNotAllowed(f"Use POST for {request.path}.")
    await lookups.acaller_for_token(tokens.bearer_token(request.headers.get("Authorization")))
    return parse_json_object(request.body)


def _tool_call(body: dict[str, Any]) -> tuple[str, str]:
    """``(namespace, text)`` of the body's tool call; ``BadRequest`` naming the field."""
    tool = body.get("tool")
    if not isinstance(tool, str) or not TOOL_NAME.fullmatch(tool):
        raise BadRequest("'tool' must be 1 to 64 letters, digits, '_', '.' or '-'.", param="tool")
    arguments = body.get("arguments")
    if not isinstance(arguments, dict):
        raise BadRequest("'arguments' must be a JSON object.", param="arguments")
    text = tool_text(tool, arguments)
    if len(text.encode()) > MAX_ARGUMENTS_BYTES:
        raise BadRequest(
            f"'arguments' must be at most {MAX_ARGUMENTS_BYTES} bytes as JSON.", param="arguments"
        )
    return f"{service.TOOLS}{tool}", text


@csrf_exempt
async def tools_lookup(request: HttpRequest) -> HttpResponse:
    """``POST /v1/cache/tools/lookup`` (module docstring)."""
    try:
        namespace, text = _tool_call(await _body(request))
        asked = (request.headers.get(HEADER) or "use").strip().lower()
        if asked not in ("use", "bypass"):
            raise BadRequest(f"{HEADER} must be 'use' or 'bypass', not {asked[:40]!r}.")
    except ProxyError as exc:
        return _error(exc)
    if asked == "bypass":
        found: dict[str, Any] = {"hit": False, "reason": "bypass"}
    else:
        found = await db_thread(_looked_up)(namespace, text)
    response = JsonResponse(found)
    response[HEADER] = (
        "hit" if found["hit"] else ("bypass" if found["reason"] == "bypass" else "miss")
    )
    return response


def _looked_up(namespace: str, text: str) -> dict[str, Any]:
    rules = service.rules_for(namespace)
    if rules is None:
        return {"hit": False, "reason": f"{namespace} is not cached (an operator enables it)"}
    try:
        cache = service.the_cache()
    except ProxyError as exc:  # no approved embedding package: nothing to compare with
        return {"hit": False, "reason": exc.message}
    found = cache.lookup(namespace, "", text, rules)
    if not isinstance(found, Hit):
        return {"hit": False, "reason": found.reason}
    return {
        "hit": True,
        "result": json.loads(found.entry.value),
        "id": found.entry.id,
        "similarity": round(found.similarity, 4),
        "age_s": round(found.age_s(), 1),
        "exact": found.exact,
    }


@csrf_exempt
async def tools_store(request: HttpRequest) -> HttpResponse:
    """``POST /v1/cache/tools`` (module docstring)."""
    try:
        body = await _body(request)
        namespace, text = _tool_call(body)
        value, ttl_s = _result(body)
        stored = await db_thread(_stored)(namespace, text, value, ttl_s)
    except ProxyError as exc:
        return _error(exc)
    return JsonResponse(stored, status=201)


def _result(body: dict[str, Any]) -> tuple[str, float | None]:
    if "result" not in body:
        raise BadRequest("'result' is required: the tool's result, any JSON.", param="result")
    value = json.dumps(body["result"], ensure_ascii=False)
    if len(value.encode()) > MAX_RESULT_BYTES:
        raise BadRequest(
            f"'result' must be at most {MAX_RESULT_BYTES} bytes as JSON.", param="result"
        )
    ttl_s = body.get("ttl_s")
    if ttl_s is not None and (
        isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s <= MAX_TTL_S
    ):
        raise BadRequest(
            f"'ttl_s' must be seconds, more than 0 and at most {MAX_TTL_S}.", param="ttl_s"
        )
    return value, ttl_s


def _stored(namespace: str, text: str, value: str, ttl_s: float | None) -> dict[str, Any]:
    rules = service.rules_for(namespace)
    if rules is None:
        raise ProxyError(
            f"{namespace} is not cached: an operator enables the tool on /cache/ first.",
            code="tool_not_cached",
            status=409,
        )
    if ttl_s is not None:  # a result may live shorter than its namespace allows, not longer
        rules = service.Rules(rules.threshold, min(rules.ttl_s, float(ttl_s)), rules.max_entries)
    entry = service.the_cache().put(Entry(namespace, "", "", text, value, 0.0, 0.0), rules)
    return {"id": entry.id, "expires_at": entry.expires}


@csrf_exempt
async def false_hits(request: HttpRequest) -> HttpResponse:
    """``POST /v1/cache/false-hits`` (module docstring)."""
    try:
        body = await _body(request)
        entry_id, query, note = _report(body)
        reported = await db_thread(_reported)(entry_id, query, note)
    except ProxyError as exc:
        return _error(exc)
    return JsonResponse(reported, status=201)


def _report(body: dict[str, Any]) -> tuple[int, str, str]:
    entry_id = body.get("id")
    if (
        isinstance(entry_id, str)
        and entry_id.isascii()
        and entry_id.isdigit()
        and len(entry_id) < 20
    ):
        entry_id = int(entry_id)
    if isinstance(entry_id, bool) or not isinstance(entry_id, int) or not 0 < entry_id <= MAX_ID:
        raise BadRequest("'id' must be the X-Phalanx-Cache-Id of the hit.", param="id")
    query, note = body.get("query", ""), body.get("note", "")
    for name, value in (("query", query), ("note", note)):
        if not isinstance(value, str) or len(value) > MAX_NOTE:
            raise BadRequest(f"'{name}' must be text of at most {MAX_NOTE} characters.", param=name)
    return entry_id, query, note


def _reported(entry_id: int, query: str, note: str) -> dict[str, Any]:
    try:
        entry = service.the_cache().report_false_hit(entry_id, query, 0.0, note)
    except KeyError:
        raise ProxyError(
            f"No cached entry {entry_id}: it expired, was invalidated or was reported already.",
            code="not_found",
            status=404,
        ) from None
    service.log.warning(
        "semantic cache false hit reported",
        extra={"namespace": entry.namespace, "entry_id": entry_id, "at": time.time()},
    )
    return {"removed": entry_id, "namespace": entry.namespace}
