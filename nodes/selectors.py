"""Reads of the node inventory that need care: the state routing sees of a node
(``routing_state``, ``takes_sessions``) and what a person reads of it (its badge and last
error). Routing's own read of the table is ``inference.node_table``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.utils import timezone

from nodes.models import Node, NodeEvent


def nodes_with_pinned() -> QuerySet[Node]:
    """Every node with its package and ``pinned``, the sessions pinned to it (one query).
    Routing's own, cached read of the pinned counts is ``inference.node_table.pinned_counts``."""
    return Node.objects.select_related("package").annotate(pinned=Count("session_routes"))


def nodes_with_sessions() -> list[Node]:
    """Every node with its package, ``pinned`` (sessions pinned) and ``status`` (a
    ``NodeStatus``: badge, whether it takes sessions, last error)."""
    nodes = list(nodes_with_pinned())
    statuses = nodes_status(nodes)
    for node in nodes:
        node.status = statuses[node.node_id]  # type: ignore[attr-defined]
    return nodes


def routing_state(state: str, validation: str) -> str:
    """The state routing sees: a node that has not passed device validation is
    ``validating`` or ``failed validation`` whatever its health (routing takes only ``up``)."""
    if validation in Node.ROUTABLE_VALIDATIONS or state != Node.State.UP:
        return state
    return "failed validation" if validation == Node.Validation.FAILED else "validating"


# --- what a person reads of a node: its badge and last error --------------------------------

RECENT_ERROR_S = 3600.0
_FAILED_RUN = re.compile(r"^validation \d+ (failed|could not run)")
BADGE_COLOURS = {
    "serving": "green",
    "validating": "blue",
    "failed validation": "red",
    "starting": "grey",
    "restarting": "orange",
    "down": "red",
    "draining": "orange",
    "standby": "grey",
}


def takes_sessions(node: Node) -> bool:
    """True when routing places new sessions on ``node``: ``up``, device validation passed
    (or waived) and a routing weight above 0 (the rule ``routing_state`` and the proxy
    apply; ``up``'s "takes sessions" is this)."""
    return node.routing_weight > 0 and routing_state(node.state, node.validation) == "up"


@dataclass(frozen=True)
class NodeStatus:
    """What the overview and the nodes table show of a node: ``badge`` (serving, validating,
    failed validation, starting, restarting, down, draining, standby), its ``colour``,
    ``serving`` (takes new sessions), the last ``error`` as a sentence (a failed probe now,
    else the last went-down, crash-restart or failed validation event; "" when none),
    ``recent_error`` (a probe failing now, or such an event in the last hour) and
    ``error_at``, when the error happened (the pages draw it in the one time format)."""

    badge: str
    colour: str
    serving: bool
    error: str = ""
    recent_error: bool = False
    error_at: datetime | None = None

    @property
    def error_at_iso(self) -> str | None:
        """``error_at`` in ISO 8601, as the live feed sends it; None when there is none."""
        return self.error_at.isoformat() if self.error_at else None


def _is_error(event: NodeEvent) -> bool:
    if event.kind == NodeEvent.Kind.WENT_DOWN:
        return True
    if event.kind == NodeEvent.Kind.RESTARTED:  # an operator's restart is no error
        return not event.message.startswith("restarted at the request")
    return event.kind == NodeEvent.Kind.VALIDATION and bool(_FAILED_RUN.match(event.message))


def _badge(node: Node, latest: NodeEvent | None) -> str:
    if node.restart_requested_at is not None:
        return "restarting"
    if node.state == Node.State.DRAINING:
        return "draining"
    if node.state == Node.State.DOWN:
        return "down"
    if latest is not None and latest.kind == NodeEvent.Kind.RESTARTED:
        return "restarting"  # its agent exited; nothing has answered since
    if node.state == Node.State.UNKNOWN:
        return "starting"
    seen = routing_state(node.state, node.validation)
    if seen != "up":
        return seen
    return "serving" if node.routing_weight > 0 else "standby"


def node_status(
    node: Node, *, latest: NodeEvent | None, last_error: NodeEvent | None
) -> NodeStatus:
    """The status of ``node`` from its row, its ``latest`` event and its last error event."""
    badge = _badge(node, latest)
    error, error_at, recent = "", None, False
    if node.last_probe_error:
        error, error_at, recent = f"Probe failed: {node.last_probe_error}", node.last_probe_at, True
    elif last_error is not None:
        error = f"{last_error.get_kind_display()}: {last_error.message}"
        error_at = last_error.created_at
        recent = (timezone.now() - last_error.created_at).total_seconds() < RECENT_ERROR_S
    colour = BADGE_COLOURS.get(badge, "grey")
    return NodeStatus(badge, colour, badge == "serving", error, recent, error_at)


def nodes_status(nodes: list[Node]) -> dict[str, NodeStatus]:
    """``{node_id: NodeStatus}`` of ``nodes``: their latest events in one query, their last
    error events from the newest 500 events of those kinds."""
    newest = NodeEvent.objects.filter(node=OuterRef("pk")).order_by("-created_at", "-id")
    ids = dict(
        Node.objects.filter(pk__in=[n.pk for n in nodes])
        .annotate(latest=Subquery(newest.values("pk")[:1]))
        .values_list("pk", "latest")
    )
    by_id = NodeEvent.objects.in_bulk([i for i in ids.values() if i])
    latest = {pk: by_id.get(i) for pk, i in ids.items() if i}
    last_error: dict[int, NodeEvent] = {}
    kinds = (NodeEvent.Kind.WENT_DOWN, NodeEvent.Kind.RESTARTED, NodeEvent.Kind.VALIDATION)
    candidates = NodeEvent.objects.filter(node__in=nodes, kind__in=kinds).order_by(
        "-created_at", "-id"
    )
    for event in candidates[:500]:
        if event.node_id not in last_error and _is_error(event):
            last_error[event.node_id] = event
    return {
        n.node_id: node_status(n, latest=latest.get(n.pk), last_error=last_error.get(n.pk))
        for n in nodes
    }
