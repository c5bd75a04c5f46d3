"""The control plane's own Prometheus text at ``/metrics`` (format 0.0.4), so an existing
Prometheus/Grafana can watch the array: routing decisions, moves, retries, sessions, and per
node its state, health, load and events. Read from the database on each scrape (and from the
cache for counters that have no table), so every replica answers the same.

Counters with no table behind them are bumped with ``metric_inc(name)``; the proxy should call
``metric_inc("phalanx_proxy_retries_total")`` for each retry on another node.
"""

from __future__ import annotations

from django.core.cache import cache
from django.db.models import Count, Sum

from inference.models import RouteDecision, SessionRoute
from nodes.models import Node, NodeEvent

CACHE_COUNTERS = {
    "phalanx_proxy_retries_total": "Chat requests retried on another node before the first byte.",
}
_PREFIX = "phalanx:metric:"


def metric_inc(name: str, amount: int = 1) -> None:
    """Add ``amount`` to a counter in ``CACHE_COUNTERS`` (shared by replicas with Redis)."""
    key = _PREFIX + name
    if not cache.add(key, amount, timeout=None):
        try:
            cache.incr(key, amount)
        except ValueError:  # expired between add and incr
            cache.add(key, amount, timeout=None)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    lines: list[str],
    name: str,
    kind: str,
    help_text: str,
    samples: list[tuple[dict[str, str], float]],
) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")


def prometheus_text() -> str:
    """Every control-plane metric as Prometheus text."""
    lines: list[str] = []
    decisions = dict(RouteDecision.objects.values_list("action").annotate(n=Count("id")))
    _family(
        lines,
        "phalanx_routing_decisions_total",
        "counter",
        "Routing decisions recorded, by action (placed, moved).",
        [({"action": a.value}, decisions.get(a.value, 0)) for a in RouteDecision.Action],
    )
    routes = SessionRoute.objects.aggregate(n=Count("id"), moves=Sum("moves"), turns=Sum("turns"))
    _family(
        lines,
        "phalanx_session_moves_total",
        "counter",
        "Sessions redirected to another node (node failed or drained).",
        [({}, routes["moves"] or 0)],
    )
    _family(
        lines,
        "phalanx_session_turns_total",
        "counter",
        "Turns routed for sessions.",
        [({}, routes["turns"] or 0)],
    )
    _family(
        lines, "phalanx_sessions", "gauge", "Sessions in the routing table.", [({}, routes["n"])]
    )
    for name, help_text in CACHE_COUNTERS.items():
        _family(lines, name, "counter", help_text, [({}, cache.get(_PREFIX + name) or 0)])
    nodes = list(Node.objects.select_related("package").annotate(pinned=Count("session_routes")))
    _family(
        lines,
        "phalanx_node_up",
        "gauge",
        "1 when the node is up (healthy, not draining).",
        [({"node": n.node_id}, 1 if n.state == Node.State.UP else 0) for n in nodes],
    )
    _family(
        lines,
        "phalanx_node_state",
        "gauge",
        "1 for the node's current state.",
        [
            ({"node": n.node_id, "state": s.value}, 1 if n.state == s.value else 0)
            for n in nodes
            for s in Node.State
        ],
    )
    _family(
        lines,
        "phalanx_node_load",
        "gauge",
        "Last load from the node's metrics: (active + queued) / sequences.",
        [({"node": n.node_id}, n.load) for n in nodes if n.load is not None],
    )
    _family(
        lines,
        "phalanx_node_consecutive_failures",
        "gauge",
        "Failed probes in a row.",
        [({"node": n.node_id}, n.consecutive_failures) for n in nodes],
    )
    _family(
        lines,
        "phalanx_node_weight",
        "gauge",
        "Routing weight.",
        [({"node": n.node_id}, n.weight) for n in nodes],
    )
    _family(
        lines,
        "phalanx_node_sessions",
        "gauge",
        "Sessions pinned to the node.",
        [({"node": n.node_id}, n.pinned) for n in nodes],
    )
    events = NodeEvent.objects.values_list("node__node_id", "kind").annotate(n=Count("id"))
    _family(
        lines,
        "phalanx_node_events_total",
        "counter",
        "Node events (went_down, came_back, drained, undrained, registered).",
        [({"node": node_id, "kind": kind}, n) for node_id, kind, n in events],
    )
    return "\n".join(lines) + "\n"
