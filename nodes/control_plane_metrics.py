"""What the control plane's ``/metrics`` says of each node: its state, health, load, weight,
pinned sessions, events, validation state, and the series of its own ``/metrics`` the alert
rules read, as last scraped (registered with ``console.lib.metrics`` in ``NodesConfig.ready``)."""

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
    validation = [
        ({"node": n.node_id, "state": s.value}, 1 if n.validation == s.value else 0)
        for n in nodes
        for s in Node.Validation
    ]
    write("phalanx_node_validation", "gauge", "1 for the node's validation state.", validation)
    for name, kind, key, help_text in SCRAPED:
        samples = [
            ({"node": n.node_id}, n.last_seen_load[key])
            for n in nodes
            if n.last_seen_load and n.last_seen_load.get(key) is not None
        ]
        write(name, kind, help_text + " (last scrape)", samples)


# (name, type, key of ``Node.last_seen_load``, help): the node's own series, as last scraped,
# so that alerting rules over this one endpoint need not scrape every node (docs/alerts.md)
SCRAPED = [
    ("phalanx_node_requests_total", "counter", "requests", "Chat requests admitted."),
    ("phalanx_node_failed_requests_total", "counter", "failed", "Requests failed on the node."),
    ("phalanx_node_ttft_p95_seconds", "gauge", "ttft_p95", "TTFT P95, last 256 requests."),
    ("phalanx_node_queue_depth", "gauge", "queue", "Requests waiting for a sequence."),
    ("phalanx_node_sequences_total", "gauge", "total", "Configured KV sequences."),
    (
        "phalanx_node_restores_skipped_total",
        "counter",
        "restores_skipped",
        "Host-RAM KV entries dropped instead of restored.",
    ),
    (
        "phalanx_node_restored_from_host_total",
        "counter",
        "restored",
        "Sessions whose KV came back from host RAM.",
    ),
]
