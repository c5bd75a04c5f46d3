"""External nodes: any OpenAI-compatible server as a node of the array (the hybrid array: big
models on GPU servers, small agent models on the CPU pool; docs/control-plane.md "External
nodes").

An external node (``Node.kind`` ``external``) is probed with what such servers have:

- health: ``GET /health`` (llama-server, vLLM: 200 ready, 503 loading); a server without it
  (404, 405; llama-cpp-python's own server) is healthy when ``GET /v1/models`` answers 200 with
  a model list;
- load: ``GET /slots`` (llama-server: one entry a slot, busy when ``is_processing``) gives busy
  and total slots; ``GET /metrics`` adds the queue (llama-server's
  ``llamacpp:requests_deferred``, vLLM's ``vllm:num_requests_waiting``) and, without slots, the
  busy count (``llamacpp:requests_processing``, ``vllm:num_requests_running``). Neither: the load
  is unknown (routing never takes unknown for idle).

It is called with the node's credential (``Authorization: Bearer``; give the server that value
as its API key, ``manage.py nodecredential``). Sessions stick to it by routing alone: it has no
session KV to export, so a move re-sends the history. Its devices are not Phalanx's to validate:
it is registered with its validation waived (``nodes.services.node_upsert``).
"""

from __future__ import annotations

from typing import Any

import httpx

from nodes.client import ProbeResult, health_refusal, probe_failure, sync_client
from nodes.credentials import node_auth_headers
from nodes.metrics import parse_prometheus

QUEUE_METRICS = ("llamacpp:requests_deferred", "vllm:num_requests_waiting")
BUSY_METRICS = ("llamacpp:requests_processing", "vllm:num_requests_running")


def probe_external(address: str, *, node_id: str, timeout: float) -> ProbeResult:
    """Health and load of the external server at ``address`` (see the module docstring).
    Never raises for network trouble; the result says what happened."""
    base, headers = f"http://{address}", node_auth_headers(node_id)
    try:
        health = sync_client().get(f"{base}/health", headers=headers, timeout=timeout)
        if health.status_code in (404, 405):
            health = _models(base, headers, timeout)
    except httpx.TransportError as exc:
        return probe_failure(exc, timeout)
    unhealthy = health_refusal(health, health.request.url.path)
    if unhealthy is not None:
        return unhealthy
    return ProbeResult(True, "ok", "", _load(base, headers, timeout))


def _models(base: str, headers: dict[str, str], timeout: float) -> httpx.Response:
    """``GET /v1/models``; a 200 whose body is not a model list counts as a 502."""
    response = sync_client().get(f"{base}/v1/models", headers=headers, timeout=timeout)
    if response.status_code == 200:
        try:
            listed = response.json().get("data")
        except (ValueError, AttributeError):
            listed = None
        if not isinstance(listed, list):
            return httpx.Response(502, request=response.request)
    return response


def _load(base: str, headers: dict[str, str], timeout: float) -> dict[str, Any] | None:
    slots = samples = None
    try:
        answer = sync_client().get(f"{base}/slots", headers=headers, timeout=timeout)
        slots = answer.json() if answer.status_code == 200 else None
    except (httpx.TransportError, ValueError):
        pass
    try:
        answer = sync_client().get(f"{base}/metrics", headers=headers, timeout=timeout)
        samples = parse_prometheus(answer.text) if answer.status_code == 200 else None
    except httpx.TransportError:
        pass
    return external_load(slots, samples)


def _first(samples: dict[str, float], names: tuple[str, ...]) -> float | None:
    """The first of ``names`` the samples have, summed over its label sets (vLLM labels every
    sample with ``model_name``: ``vllm:num_requests_running{model_name="..."}``)."""
    for name in names:
        values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
        if values:
            return float(sum(values))
    return None


def external_load(slots: Any, samples: dict[str, float] | None) -> dict[str, Any] | None:
    """``{"load", "active", "queue", "total"}`` from a server's ``/slots`` list and
    ``/metrics`` samples (either may be None); None when neither says anything.

    With its slots known, ``load`` = (busy + queued) / slots, as for our nodes. Without them
    (vLLM: its capacity is not published), a server that queues nothing is below 1 (busy / (busy
    + 1): it has room, the busier the less) and one that queues is above 1 (1 + queued / busy:
    requests wait), so routing's overload threshold reads it as it reads our nodes."""
    samples = samples or {}
    total = active = None
    if isinstance(slots, list) and slots:
        total = float(len(slots))
        active = float(sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing")))
    queue = _first(samples, QUEUE_METRICS)
    if active is None:
        active = _first(samples, BUSY_METRICS)
    if active is None and queue is None:
        return None
    busy, waiting = active or 0.0, queue or 0.0
    if total:
        load = (busy + waiting) / total
    else:
        load = 1.0 + waiting / max(1.0, busy) if waiting else busy / (busy + 1.0)
    return {"load": round(load, 4), "active": active, "queue": queue, "total": total}
