"""Reads of the node inventory that need care."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from inference.routing import NodeView
from nodes.models import Node


def nodes_for_routing(*, stale_after_s: float) -> tuple[list[NodeView], dict[str, str]]:
    """Every node as a routing ``NodeView``, plus ``{node_id: address}``.

    A load older than ``stale_after_s`` seconds (no recent probe) counts as unknown, so a
    silent node is never taken for idle. ``sessions`` counts the routes pinned to each node.
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    rows = Node.objects.select_related("package").annotate(pinned=Count("session_routes"))
    views: list[NodeView] = []
    addresses: dict[str, str] = {}
    for node in rows:
        fresh = node.last_probe_at is not None and node.last_probe_at >= cutoff
        views.append(
            NodeView(
                node_id=node.node_id,
                state=node.state,
                weight=node.weight,
                load=node.load if fresh else None,
                model=node.package.name if node.package else None,
                sessions=node.pinned,
                affinity=node.affinity,
            )
        )
        addresses[node.node_id] = node.address
    return views, addresses
