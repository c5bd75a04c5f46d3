"""What the control plane's ``/metrics`` says of routing: decisions, moves, turns and sessions
in the routing table, and the proxy's retries (registered with ``console.lib.metrics`` in
``InferenceConfig.ready``)."""

from __future__ import annotations

from django.db.models import Count, Sum

from console.lib.metrics import Write
from inference.models import RouteDecision, SessionRoute

PROXY_RETRIES = "phalanx_proxy_retries_total"
PROXY_NODE_REQUEST_ERRORS = "phalanx_proxy_node_request_errors_total"
PROXY_BROKEN_ANSWERS = "phalanx_proxy_broken_answers_total"
PROXY_MIGRATIONS = "phalanx_proxy_migrations_total"
PROXY_MIGRATIONS_FAILED = "phalanx_proxy_migrations_failed_total"
# the proxy's counters with no table behind them (``console.lib.metrics.metric_inc``)
COUNTERS = {
    PROXY_RETRIES: "Chat requests retried on another node before the first byte.",
    PROXY_NODE_REQUEST_ERRORS: "Requests to a node that failed (connection, timeout, HTTP error).",
    PROXY_BROKEN_ANSWERS: "Node answers the proxy cut off as malformed (a poisoned body).",
    PROXY_MIGRATIONS: "Streamed answers cut by their node that went on on another node.",
    PROXY_MIGRATIONS_FAILED: "Cut answers no other node continued in time (an error event).",
}


def routing_families(write: Write) -> None:
    """Routing decisions by action, session moves and turns, sessions in the routing table."""
    decisions = dict(RouteDecision.objects.values_list("action").annotate(n=Count("id")))
    write(
        "phalanx_routing_decisions_total",
        "counter",
        "Routing decisions recorded, by action (placed, moved).",
        [({"action": a.value}, decisions.get(a.value, 0)) for a in RouteDecision.Action],
    )
    routes = SessionRoute.objects.aggregate(n=Count("id"), moves=Sum("moves"), turns=Sum("turns"))
    write(
        "phalanx_session_moves_total",
        "counter",
        "Sessions redirected to another node (node failed or drained).",
        [({}, routes["moves"] or 0)],
    )
    turns = [({}, routes["turns"] or 0)]
    write("phalanx_session_turns_total", "counter", "Turns routed for sessions.", turns)
    write("phalanx_sessions", "gauge", "Sessions in the routing table.", [({}, routes["n"])])
