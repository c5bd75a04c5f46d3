"""Reads of the node inventory that need care."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, OuterRef, Subquery
from django.utils import timezone

from console.lib.compiled_sql import CompiledQuery, as_datetime, as_json
from inference.model_names import client_name, package_key
from inference.models import SessionRoute
from inference.routing import NodeView
from nodes.models import Node, NodeEvent, effective_weight


def _number(data: Any, key: str) -> float | None:
    if isinstance(data, dict) and isinstance(data.get(key), int | float):
        return float(data[key])
    return None


@dataclass(frozen=True)
class PinnedCounts:
    """Sessions pinned to each node (``{node_id: count}``), as read at ``read_at``
    (``time.monotonic()`` just before the read)."""

    counts: dict[str, int]
    read_at: float


_pinned_rows = CompiledQuery(
    lambda: (
        SessionRoute.objects.filter(node__isnull=False)
        .values_list("node__node_id")
        .annotate(n=Count("id"))
    )
)


def pinned_counts() -> PinnedCounts:
    """How many sessions are pinned to each node (nodes without any are left out)."""
    read_at = time.monotonic()
    return PinnedCounts(dict(_pinned_rows.rows()), read_at)


@dataclass(frozen=True)
class NodeTable:
    """The inventory as routing sees it: ``views`` (one ``NodeView`` per node), each node's
    address and package id, and ``pinned_read_at``: when the pinned-session counts in the views
    were read (``time.monotonic()``)."""

    views: list[NodeView]
    addresses: dict[str, str] = field(default_factory=dict)
    package_ids: dict[str, int | None] = field(default_factory=dict)
    pinned_read_at: float = 0.0
    node_names: dict[str, str | None] = field(default_factory=dict)  # what each node answers to
    package_keys: dict[str, str | None] = field(default_factory=dict)  # name:version it serves

    def prefill_speed(self, node_id: str) -> float | None:
        """The node's measured prefill speed (tokens/s), None when unknown."""
        view = next((v for v in self.views if v.node_id == node_id), None)
        return view.prefill_speed if view else None

    def with_local_counts(
        self, *, pinned_delta: Mapping[str, int], inflight: Mapping[str, int]
    ) -> NodeTable:
        """A copy with this process's counts as of now: pinned-session counts plus
        ``pinned_delta`` (``{node_id: +/- sessions}`` this process pinned that the counts did
        not show yet at ``pinned_read_at``), and ``inflight`` (``{node_id: open requests}``)."""
        views = [
            replace(
                v,
                sessions=max(0, v.sessions + pinned_delta.get(v.node_id, 0)),
                inflight=inflight.get(v.node_id, 0),
            )
            for v in self.views
        ]
        return replace(self, views=views)


def routing_state(state: str, validation: str) -> str:
    """The state routing sees: a node that has not passed device validation is
    ``validating`` or ``failed validation`` whatever its health (routing takes only ``up``)."""
    if validation in Node.ROUTABLE_VALIDATIONS or state != Node.State.UP:
        return state
    return "failed validation" if validation == Node.Validation.FAILED else "validating"


_NODE_FIELDS = (
    "node_id",
    "state",
    "weight",
    "affinity",
    "address",
    "package_id",
    "package__name",
    "package__version",
    "package__family",
    "served_name",
    "last_probe_at",
    "last_seen_load",
    "max_sessions",
    "kv_budget_tokens",
    "validation",
    "measured_speed",
    "weight_measured",
)


_node_rows = CompiledQuery(lambda: Node.objects.values_list(*_NODE_FIELDS))


def nodes_for_routing(
    *,
    stale_after_s: float,
    inflight: Mapping[str, int] | None = None,
    pinned: PinnedCounts | None = None,
) -> NodeTable:
    """Every node as a routing ``NodeView``, with addresses and package ids (``NodeTable``).
    A view's ``model`` is the name clients ask for (``inference.model_names.client_name``: the
    family); ``node_names`` what the node agent itself answers to, ``package_keys`` the
    ``name:version`` it serves.

    A load older than ``stale_after_s`` seconds (no recent probe) counts as unknown, so a
    silent node is never taken for idle. ``sessions`` counts the routes pinned to each node
    (``pinned``, read now when not given: the proxy passes counts it reads less often);
    ``inflight`` (``{node_id: open requests}``, this process's own count) is copied in.
    """
    pinned = pinned or pinned_counts()
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    views: list[NodeView] = []
    addresses: dict[str, str] = {}
    package_ids: dict[str, int | None] = {}
    node_names: dict[str, str | None] = {}
    package_keys: dict[str, str | None] = {}
    open_requests = inflight or {}
    for row in _node_rows.rows():
        node = dict(zip(_NODE_FIELDS, row, strict=True))
        node_id = node["node_id"]
        probed = as_datetime(node["last_probe_at"])
        seen = as_json(node["last_seen_load"]) if probed is not None and probed >= cutoff else None
        views.append(
            NodeView(
                node_id=node_id,
                state=routing_state(node["state"], node["validation"]),
                weight=effective_weight(
                    node["weight"], node["measured_speed"], bool(node["weight_measured"])
                ),
                load=_number(seen, "load"),
                model=client_name(
                    served_name=node["served_name"],
                    package_name=node["package__name"],
                    family=node["package__family"],
                ),
                sessions=pinned.counts.get(node_id, 0),
                affinity=bool(node["affinity"]),
                total=_number(seen, "total"),
                kv_used=_number(seen, "kv_used"),
                kv_capacity=_number(seen, "kv_capacity"),
                max_sessions=node["max_sessions"],
                kv_budget=node["kv_budget_tokens"],
                inflight=open_requests.get(node_id, 0),
                prefill_speed=_number(seen, "prefill_speed"),
                package_id=node["package_id"],
            )
        )
        addresses[node_id] = node["address"]
        package_ids[node_id] = node["package_id"]
        node_names[node_id] = node["served_name"] or node["package__name"]
        package_keys[node_id] = package_key(node["package__name"], node["package__version"])
    return NodeTable(views, addresses, package_ids, pinned.read_at, node_names, package_keys)


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
