"""All outbound HTTP from the control plane to nodes goes through this module (httpx).

Every call but ``/health`` presents the node's credential (``nodes.credentials``), so each
function takes the node's id beside its address, and with it a fresh challenge; every answer's
proof is checked by the clients' response hook (``check_proof``): an answer that does not prove
the node raises ``NodeNotProven``, a transport error, so a request fails over before its first
byte as from a node that cannot be reached. Tests patch this one seam. The control loop uses the blocking ``probe``; the proxy and the
websocket consumer use ``chat_open`` / ``chat_close`` on a shared ``httpx.AsyncClient`` per
event loop (building a client costs milliseconds, too much per request), whose transport is
``nodes.http11``'s (httpx's own cost about 4 ms of CPU per chat request).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from nodes.credentials import (
    CHALLENGE_HEADER,
    PROOF_HEADER,
    array_id,
    node_auth_headers,
    proof_problem,
)
from nodes.http11 import NodeTransport
from nodes.metrics import load_from_metrics, parse_prometheus

_sync_client: httpx.Client | None = None
_sync_lock = threading.Lock()
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)
_chat_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)
PROBE_HEADER = "X-Phalanx-Probe"  # the control plane's own checks: not counted as traffic
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
REFUSED_CREDENTIAL = (
    "the node refused this control plane's credential (401): its credential was revoked, or "
    "it was given another (docs/node-protocol.md)"
)


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one health probe.

    ``ok``: ``/health`` answered 200. ``status``: "ok", "loading" (503 while the model loads),
    "unreachable" (connection refused/reset), "timeout" (no answer in time: a hung or stopped
    process), or "error" (any other answer). ``load``: summary from ``/metrics`` (see
    ``nodes.metrics.load_from_metrics``) or None when metrics could not be read.
    """

    ok: bool
    status: str
    error: str = ""
    load: dict[str, Any] | None = field(default=None)
    device: dict[str, Any] | None = field(default=None)  # /health's "device" block, if any


class NodeNotProven(httpx.RemoteProtocolError):
    """The answer did not prove it came from the node called (no or a wrong
    ``X-Phalanx-Proof``): another server at its address, or a node whose credential was
    revoked. A transport error: callers treat it as a node that cannot be reached."""


def check_proof(response: httpx.Response) -> None:
    """Raise ``NodeNotProven`` when ``response`` owes a proof of its node and lacks a right one
    (``nodes.credentials.proof_problem``); the clients' response hook."""
    request = response.request
    problem = proof_problem(
        request.headers.get("authorization"),
        request.headers.get(CHALLENGE_HEADER),
        response.status_code,
        response.headers.get(PROOF_HEADER),
    )
    if problem:
        raise NodeNotProven(problem, request=request)


async def _acheck_proof(response: httpx.Response) -> None:
    check_proof(response)


def sync_client() -> httpx.Client:
    global _sync_client
    with _sync_lock:
        if _sync_client is None:
            _sync_client = httpx.Client(
                limits=_LIMITS, trust_env=False, event_hooks={"response": [check_proof]}
            )
        return _sync_client


def probe(address: str, *, node_id: str, timeout: float) -> ProbeResult:
    """GET ``http://<address>/health`` then ``/metrics``, each within ``timeout`` seconds.

    Never raises for network trouble; the result says what happened.
    """
    base = f"http://{address}"
    try:
        response = sync_client().get(f"{base}/health", timeout=timeout)
    except httpx.TransportError as exc:
        return probe_failure(exc, timeout)
    unhealthy = health_refusal(response, "health")
    if unhealthy is not None:
        return unhealthy
    stranger = _stranger(response, node_id)
    if stranger:
        return ProbeResult(False, "error", stranger)
    try:
        metrics = sync_client().get(
            f"{base}/metrics", headers=node_auth_headers(node_id), timeout=timeout
        )
    except NodeNotProven as exc:
        return ProbeResult(False, "error", str(exc)[:255])
    except httpx.TransportError:
        return ProbeResult(True, "ok", "", None, _device_block(response))
    if metrics.status_code == 401:
        return ProbeResult(False, "error", REFUSED_CREDENTIAL)
    load = load_from_metrics(parse_prometheus(metrics.text)) if metrics.status_code == 200 else None
    return ProbeResult(True, "ok", "", load, _device_block(response))


def probe_failure(exc: httpx.TransportError, timeout: float) -> ProbeResult:
    """A probe that got no answer: ``timeout`` (a hung or stopped process) or ``unreachable``."""
    if isinstance(exc, httpx.TimeoutException):
        return ProbeResult(False, "timeout", f"no answer in {timeout:g} s ({type(exc).__name__})")
    return ProbeResult(False, "unreachable", f"{type(exc).__name__}: {exc}"[:200])


def health_refusal(response: httpx.Response, what: str) -> ProbeResult | None:
    """A health answer that is not 200: ``loading`` (503) or ``error`` naming ``what`` answered;
    None for a 200."""
    if response.status_code == 503:
        return ProbeResult(False, "loading", "health 503 (loading)")
    if response.status_code != 200:
        return ProbeResult(False, "error", f"{what} answered {response.status_code}")
    return None


def _device_block(health: httpx.Response) -> dict[str, Any] | None:
    """What ``/health`` says of the node's devices (``{"instance", "fingerprint",
    "validation"}``), None when it says nothing (an external server)."""
    try:
        body = health.json()
    except ValueError:
        return None
    device = body.get("device") if isinstance(body, dict) else None
    return device if isinstance(device, dict) and device.get("instance") else None


def _stranger(health: httpx.Response, node_id: str) -> str:
    """Why the node answering ``/health`` is not ``node_id`` of this array ("" when it is, or
    when it does not say: an external OpenAI-compatible server)."""
    try:
        body = health.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    said_node, said_array = body.get("node"), body.get("array")
    ours = array_id()
    if said_node not in (None, node_id) or said_array not in (None, "", ours):
        return (
            f"the server at this address is node {said_node!r} of array {said_array!r}, not "
            f"{node_id!r} of this array ({ours}): another array's node, or a wrong address"
        )
    return ""


def async_client(*, chat: bool = False) -> httpx.AsyncClient:
    """The shared ``httpx.AsyncClient`` of the running event loop; ``chat``: the one for chat
    requests, on the lean transport (``nodes.http11``: the proxy's hot path)."""
    loop = asyncio.get_running_loop()
    clients = _chat_clients if chat else _async_clients
    client = clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            limits=_LIMITS,
            trust_env=False,
            event_hooks={"response": [_acheck_proof]},
            transport=NodeTransport() if chat else None,
        )
        clients[loop] = client
    return client


async def chat_open(
    address: str,
    *,
    node_id: str,
    payload: dict[str, Any],
    session_id: str | None,
    connect_timeout: float,
    read_timeout: float,
    answer_as: tuple[str, str] | None = None,
    request_id: str | None = None,
) -> httpx.Response:
    """POST ``payload`` to the node's ``/v1/chat/completions`` and return the response with its
    body still unread (stream it with ``aiter_raw``; always ``chat_close`` it).

    ``X-Session-Id: <session_id>`` is sent when given; ``answer_as`` ``(model, name:version)``
    as ``X-Phalanx-Model`` / ``X-Phalanx-Package``, which the answer reports (``model``,
    ``system_fingerprint``); ``request_id`` as ``X-Request-Id`` (the node logs the turn
    under it). Raises ``httpx.TransportError`` when the
    node cannot be reached or sends no headers within ``read_timeout`` seconds.
    """
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream, application/json",
        **node_auth_headers(node_id),
    }
    if session_id:
        headers["X-Session-Id"] = session_id
    if answer_as:
        headers["X-Phalanx-Model"], headers["X-Phalanx-Package"] = answer_as
    if request_id:
        headers["X-Request-Id"] = request_id
    timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
    client = async_client(chat=True)
    request = client.build_request(
        "POST",
        f"http://{address}/v1/chat/completions",
        json=payload,
        headers=headers,
        timeout=timeout,
    )
    return await client.send(request, stream=True)


async def chat_close(response: httpx.Response) -> None:
    """Close a response from ``chat_open``, dropping the connection if its body is unread
    (which is how the node learns that the client went away)."""
    await response.aclose()


def canary(address: str, *, node_id: str, model: str | None, timeout: float) -> ProbeResult:
    """A tiny real completion (one token, no session): proves the engine still generates.

    ``ok`` when the node answers 200 with a ``choices`` list within ``timeout`` seconds; status
    "ok", "timeout", "unreachable" or "error" as for ``probe``. Never raises for network trouble.
    """
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    if model:
        body["model"] = model
    try:
        response = sync_client().post(
            f"http://{address}/v1/chat/completions",
            json=body,
            headers={**node_auth_headers(node_id), PROBE_HEADER: "1"},
            timeout=timeout,
        )
    except httpx.TimeoutException:
        return ProbeResult(False, "timeout", f"canary: no completion in {timeout:g} s")
    except NodeNotProven as exc:
        return ProbeResult(False, "error", f"canary: {exc}"[:255])
    except httpx.TransportError as exc:
        return ProbeResult(False, "unreachable", f"canary: {type(exc).__name__}")
    if response.status_code == 503:
        return ProbeResult(True, "ok")  # busy: it is working, just full
    try:
        ok = response.status_code == 200 and isinstance(response.json().get("choices"), list)
    except ValueError:
        ok = False
    if not ok:
        return ProbeResult(False, "error", f"canary: answered {response.status_code}")
    return ProbeResult(True, "ok")


async def metrics_text(address: str, *, node_id: str, timeout: float) -> str | None:
    """``GET /metrics`` (Prometheus text), or None on network trouble or another status."""
    try:
        response = await async_client().get(
            f"http://{address}/metrics", headers=node_auth_headers(node_id), timeout=timeout
        )
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


async def session_export(
    address: str, *, node_id: str, session_id: str, timeout: float
) -> bytes | None:
    """``GET /sessions/<id>/state``: the session's KV as an opaque blob, or None when the node
    holds none (404). Raises ``httpx.HTTPError`` on network trouble or another status."""
    response = await async_client().get(
        f"http://{address}/sessions/{quote(session_id, safe='')}/state",
        headers=node_auth_headers(node_id),
        timeout=timeout,
    )
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.content


async def session_import(
    address: str, *, node_id: str, session_id: str, blob: bytes, timeout: float
) -> dict[str, Any]:
    """``PUT /sessions/<id>/state``; returns the node's JSON (``{"tokens", "bytes", ...}``).
    Raises ``httpx.HTTPError`` on network trouble or a refusal (409 model mismatch, 507)."""
    response = await async_client().put(
        f"http://{address}/sessions/{quote(session_id, safe='')}/state",
        content=blob,
        headers={"Content-Type": "application/octet-stream", **node_auth_headers(node_id)},
        timeout=timeout,
    )
    response.raise_for_status()
    return response.json()


async def session_erase(address: str, *, node_id: str, session_id: str, timeout: float) -> bool:
    """``DELETE /sessions/<id>``; True when the node held KV for it. Never raises."""
    try:
        response = await async_client().delete(
            f"http://{address}/sessions/{quote(session_id, safe='')}",
            headers=node_auth_headers(node_id),
            timeout=timeout,
        )
        return response.status_code == 200 and bool(response.json().get("erased"))
    except (httpx.HTTPError, ValueError):
        return False


def session_erase_sync(address: str, *, node_id: str, session_id: str, timeout: float) -> bool:
    """Blocking ``session_erase`` for synchronous callers (the admin API). Never raises."""
    try:
        response = sync_client().delete(
            f"http://{address}/sessions/{quote(session_id, safe='')}",
            headers=node_auth_headers(node_id),
            timeout=timeout,
        )
        return response.status_code == 200 and bool(response.json().get("erased"))
    except (httpx.HTTPError, ValueError):
        return False


class NodeRefusedSwitch(Exception):
    """The node refused a package switch (400: a bad request, a file it does not have); the
    message is the node's."""


class SwitchBusy(NodeRefusedSwitch):
    """The node is loading another switch (409): ask again when it has ended."""


def package_switch(
    address: str,
    *,
    node_id: str,
    model_path: str,
    package: str,
    sha256: str,
    settings: dict[str, int] | None = None,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """``PUT /package``: ask the node to load ``model_path`` and serve it as ``package``
    (nodes/agent/switch.py); returns its state (202). Raises ``SwitchBusy`` while another
    switch loads, ``NodeRefusedSwitch`` for a refusal, ``httpx.HTTPError`` on network trouble."""
    body = {"model_path": model_path, "package": package, "sha256": sha256}
    if settings:
        body["settings"] = settings
    response = sync_client().put(
        f"http://{address}/package", json=body, headers=node_auth_headers(node_id), timeout=timeout
    )
    if response.status_code == 409:
        raise SwitchBusy(_error_message(response))
    if response.status_code == 400:
        raise NodeRefusedSwitch(_error_message(response))
    response.raise_for_status()
    return response.json()


def package_state(address: str, *, node_id: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """``GET /package``: what the node serves and its last switch, or None when it cannot be
    asked (network trouble, another status). Never raises."""
    try:
        response = sync_client().get(
            f"http://{address}/package", headers=node_auth_headers(node_id), timeout=timeout
        )
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


class ValidationUnsupported(Exception):
    """The node does not speak device validation (404: an external server)."""


class NodeValidationBusy(Exception):
    """The node runs another validation (409)."""


def validation_start(
    address: str, *, node_id: str, run: str, timeout: float = 5.0
) -> dict[str, Any]:
    """``POST /validation``: start run ``run`` on the node (nodes/agent/validation.py); returns
    its state. Raises ``ValidationUnsupported`` (404), ``NodeValidationBusy`` (409),
    ``httpx.HTTPError`` on network trouble or another status."""
    response = sync_client().post(
        f"http://{address}/validation",
        json={"run": run},
        headers=node_auth_headers(node_id),
        timeout=timeout,
    )
    if response.status_code == 404:
        raise ValidationUnsupported(_error_message(response))
    if response.status_code == 409:
        raise NodeValidationBusy(_error_message(response))
    response.raise_for_status()
    return response.json()


def validation_state(address: str, *, node_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """``GET /validation``: the node's last run (``run``, ``state``, ``phase``, ``progress``,
    ``report``, ``error``, ``instance``). Raises ``httpx.HTTPError`` (network trouble, another
    status) or ``ValueError`` (not JSON)."""
    response = sync_client().get(
        f"http://{address}/validation", headers=node_auth_headers(node_id), timeout=timeout
    )
    response.raise_for_status()
    return response.json()


def node_http(address: str, *, node_id: str, timeout: float) -> httpx.Client:
    """A client for ``address`` that presents the node's credential (the upgrade's smoke
    test); close it after use."""
    return httpx.Client(
        base_url=f"http://{address}",
        headers={**node_auth_headers(node_id), PROBE_HEADER: "1"},
        timeout=timeout,
        trust_env=False,
        event_hooks={"response": [check_proof]},
    )


def _error_message(response: httpx.Response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return f"HTTP {response.status_code}"


def prefixes_hold(
    address: str, *, node_id: str, prefixes: list[dict[str, Any]], timeout: float = 60.0
) -> list[dict[str, Any]]:
    """``POST /prefixes``: have the node prefill and keep registered agent openings
    (``[{"messages", "tools"}]``, nodes/agent/prefix_endpoint.py); returns its
    ``[{"agent", "tokens", "state"}]`` in the same order. Raises ``httpx.HTTPError`` on
    network trouble or another status than 200, ``ValueError`` for an answer not in shape."""
    response = sync_client().post(
        f"http://{address}/prefixes",
        json={"prefixes": prefixes},
        headers=node_auth_headers(node_id),
        timeout=timeout,
    )
    response.raise_for_status()
    held = response.json().get("prefixes")
    if not isinstance(held, list) or len(held) != len(prefixes):
        raise ValueError("the node's answer to POST /prefixes is not one result per prefix")
    return held
