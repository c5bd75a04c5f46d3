"""What open console pages are told when a node changes: its row (``node_payload``) and the
event it caused (``event_payload``), sent to every ``/ws/live/`` socket through the plumbing's
live group (``console.lib.live``).

Call ``live_node_changed(node_id=..., event=...)`` from any sync code that changed a node (the
node services do); ``live_node_removed`` when one is deleted. Both never raise: a failed
broadcast is logged, the change itself stands. Changes made where no layer reaches (another
process in the embedded mode, such as the control loop) still show up within a second, because
the utilization sampler sends each node's state and new events with every snapshot.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from console.lib.live import live_send
from nodes.models import Node, NodeEvent
from nodes.selectors import nodes_status


def node_payload(node: Node) -> dict[str, Any]:
    """What a page needs to redraw a node row: id, address, state (+ colour), weight,
    affinity, package key, failures, last error (a sentence, ``nodes.selectors.NodeStatus``),
    badge (serving, validating, starting, restarting, down ...), load and device validation
    status."""
    status = nodes_status([node])[node.node_id]
    return {
        "node_id": node.node_id,
        "address": node.address,
        "state": node.state,
        "colour": Node.STATE_COLOURS.get(node.state, "grey"),
        "weight": node.weight,
        "affinity": node.affinity,
        "package": node.package.key if node.package_id and node.package else None,
        "failures": node.consecutive_failures,
        "error": status.error,
        "error_at": status.error_at_iso,
        "badge": status.badge,
        "serving": status.serving,
        "recent_error": status.recent_error,
        "load": node.load,
        "validation": node.get_validation_display(),
    }


def event_payload(event: NodeEvent) -> dict[str, Any]:
    """A node event for the page's event log: id, node id, kind (+ label), message, ISO time."""
    return {
        "id": event.pk,
        "node_id": event.node.node_id,
        "kind": event.kind,
        "label": event.get_kind_display(),
        "message": event.message,
        "actor": event.actor,
        "at": event.created_at.isoformat() if event.created_at else None,
    }


def live_node_changed(*, node_id: str, event: NodeEvent | None = None) -> None:
    """Tell every open page that node ``node_id`` changed (state, address, weight ...), with the
    event it caused if any. Sync; inside a transaction it waits for the commit (it reads the
    node back then). From async code wrap it in ``sync_to_async``."""
    event_id = event.pk if event is not None else None
    transaction.on_commit(lambda: _node_changed(node_id, event_id))


def _node_changed(node_id: str, event_id: int | None) -> None:
    node = Node.objects.select_related("package").filter(node_id=node_id).first()
    if node is None:
        live_node_removed(node_id=node_id)
        return
    message: dict[str, Any] = {"type": "node.status", "node": node_payload(node)}
    event = NodeEvent.objects.select_related("node").filter(pk=event_id).first()
    if event is not None:
        message["event"] = event_payload(event)
    live_send(message)


def live_node_removed(*, node_id: str) -> None:
    """Tell every open page that node ``node_id`` is gone from the inventory (after commit)."""
    transaction.on_commit(lambda: live_send({"type": "node.removed", "node_id": node_id}))
