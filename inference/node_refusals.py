"""How the proxy judges a node's failure before the first byte of its answer.

``inference.proxy`` tries another node after each of these: a transport error, a node marked
down or silent past the first-byte deadline (``failed_before_first_byte``), and a node's 5xx,
429, 401 or 403 (``refused``). Each leaves the node out of the request's next attempts with the
reason (``exclude``), counting a failure against it where it is the node's fault.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from console.lib.bare_http import db_thread
from console.lib.metrics import metric_inc
from inference import services
from inference.control_plane_metrics import PROXY_NODE_REQUEST_ERRORS
from inference.errors import BadRequest, NoHealthyNode, UpstreamError
from inference.models import RoutingPolicy
from inference.relay import describe_transport_error, stop_if_failed_twice, take_out
from inference.request_breaker import request_breaker, request_fingerprint
from nodes import services as node_services

log = logging.getLogger(__name__)

_record_failure = db_thread(node_services.node_record_failure)


class NodeWentDown(Exception):
    """The node was marked down while we waited for its first byte."""


class FirstByteLate(Exception):
    """The node sent nothing within the request's first-byte deadline (the message: why)."""


def describe(exc: Exception) -> str:
    if isinstance(exc, NodeWentDown):
        return "went down while the request waited"
    if isinstance(exc, FirstByteLate):
        return str(exc)
    return describe_transport_error(exc)


def retry_after(response: httpx.Response, default: int) -> int:
    try:
        return max(1, int(float(response.headers.get("retry-after", default))))
    except ValueError:
        return default


async def failed_before_first_byte(
    exc: BaseException,
    node_id: str,
    payload: dict[str, Any],
    policy: RoutingPolicy,
    exclude: dict[str, str],
) -> None:
    """Judge a failure before the first byte: the node is excluded and its failure counted
    (the caller tries another), unless the request could not even be sent (``BadRequest``) or
    the client went away (re-raised)."""
    if isinstance(exc, httpx.LocalProtocolError):  # we could not even send it: not the node
        raise BadRequest(f"The request cannot be sent to a node: {exc}") from exc
    if not isinstance(exc, httpx.TransportError | NodeWentDown | FirstByteLate):
        raise exc  # the client went away (cancelled)
    log.warning("request to %s failed before its first byte: %s", node_id, exc)
    await exclude_node(node_id, describe(exc), exclude, policy, failed=True)
    if _reached_node(exc):
        await stop_if_failed_twice(node_id, payload, describe(exc))


def _reached_node(exc: BaseException) -> bool:
    """Whether the node may have received the request before failing (not a refused or timed
    out connection): then the body itself may be what made it fail."""
    return not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)


OVERLOAD_STATUSES = (429, 503)
NOT_OUR_NODE = (401, 403)
REFUSALS = (*OVERLOAD_STATUSES, *NOT_OUR_NODE)


async def refused(
    target: services.RouteTarget,
    response: httpx.Response,
    *,
    payload: dict[str, Any],
    policy: RoutingPolicy,
    exclude: dict[str, str],
) -> None:
    """A node's 5xx, 429, 401 or 403 before any body. 401 and 403 (our credential refused: a
    misconfigured node, or another array's) count against the node and move the request on.
    Overload (503, 429) moves the request to another
    node, or, for a session pinned there, is passed on as 503 ``node_busy`` with the node's
    Retry-After; nothing is counted against the node. Any other 5xx is this request's failure:
    returned to the client as 502 ``node_error``, never retried with the same body on other
    nodes, and counted against the node only through ``request_breaker`` (distinct requests
    failing there while others succeed). Returns None after excluding the node (the caller
    tries another); raises ``NoHealthyNode`` or ``UpstreamError`` otherwise."""
    status = response.status_code
    if status in NOT_OUR_NODE:  # a wrong credential, or another array's node: the node's fault
        reason = f"refused this control plane's credential ({status}): {error_message(response)}"
        log.warning("%s %s", target.node_id, reason)
        await exclude_node(target.node_id, reason, exclude, policy, failed=True)
        return None
    if status in OVERLOAD_STATUSES:
        if target.decision.action == "stuck":
            raise NoHealthyNode(
                f"{target.node_id}, where this session is pinned, is busy; retry shortly.",
                retry_after=retry_after(response, 1),
                code="node_busy",
            )
        await exclude_node(target.node_id, f"answered {status}", exclude, policy, failed=False)
        return None
    message = error_message(response)
    log.warning("%s answered %s to one request: %s", target.node_id, status, message)
    metric_inc(PROXY_NODE_REQUEST_ERRORS)
    trip = request_breaker.failure(target.node_id, request_fingerprint(payload), message)
    if trip is not None:
        await take_out(target.node_id, trip.describe())
    raise UpstreamError(
        f"{target.node_id} failed this request ({status}): {message}",
        code="node_error",
        status=502,
    )


def error_message(response: httpx.Response) -> str:
    """The ``error.message`` of a node's JSON error body, else the start of its text."""
    try:
        return str(response.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError, RecursionError):  # any body a server may send
        return response.text[:500] or f"HTTP {response.status_code}"


async def exclude_node(
    node_id: str, reason: str, exclude: dict[str, str], policy: RoutingPolicy, *, failed: bool
) -> None:
    """Leave ``node_id`` out of this request's next attempts; count a failure against it."""
    exclude[node_id] = reason
    if failed:
        await _record_failure(
            node_id=node_id, reason=reason, failure_threshold=policy.failure_threshold
        )
