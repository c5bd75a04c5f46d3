"""What the control plane's ``/metrics`` says of each node: its state, health, load, weight,
pinned sessions and events (registered with ``console.lib.metrics`` in ``NodesConfig.ready``)."""

from __future__ import annotations

from django.db.models import Count

from console.lib.metrics import Write
from nodes.models import Node, NodeEvent
from nodes.selectors import nodes_with_pinned


def node_families(write: Write) -> None:
    """The node families, one sample per node (``phalanx_node_*``), read from the database."""
    nodes = list(nodes_with_pinned())
    up = [({"node": n.node_id}, 1 if n.state == Node.State.UP else 0) for n in nodes]
    write("phalanx_node_up", "gauge", "1 when the node is up (healthy, not draining).", up)
    states = [
        ({"node": n.node_id, "state": s.value}, 1 if n.state == s.value else 0)
        for n in nodes
        for s in Node.State
    ]
    write("phalanx_node_state", "gauge", "1 for the node's current state.", states)
    write(
        "phalanx_node_load",
        "gauge",
        "Last load from the node's metrics: (active + queued) / sequences.",
        [({"node": n.node_id}, n.load) for n in nodes if n.load is not None],
    )
    failures = [({"node": n.node_id}, n.consecutive_failures) for n in nodes]
    write("phalanx_node_consecutive_failures", "gauge", "Failed probes in a row.", failures)
    write(
        "phalanx_node_weight",
        "gauge",
        "Routing weight.",
        [({"node": n.node_id}, n.weight) for n in nodes],
    )
    pinned = [({"node": n.node_id}, n.pinned) for n in nodes]
    write("phalanx_node_sessions", "gauge", "Sessions pinned to the node.", pinned)
    events = NodeEvent.objects.values_list("node__node_id", "kind").annotate(n=Count("id"))
    write(
        "phalanx_node_events_total",
        "counter",
        "Node events (went_down, came_back, drained, undrained, registered).",
        [({"node": node_id, "kind": kind}, n) for node_id, kind, n in events],
    )
