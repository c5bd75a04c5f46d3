"""Reads of the node inventory that need care."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from inference.routing import NodeView
from nodes.models import Node


def _number(data: Any, key: str) -> float | None:
    if isinstance(data, dict) and isinstance(data.get(key), int | float):
        return float(data[key])
    return None


def nodes_for_routing(
    *, stale_after_s: float, inflight: Mapping[str, int] | None = None
) -> tuple[list[NodeView], dict[str, str]]:
    """Every node as a routing ``NodeView``, plus ``{node_id: address}``.

    A load older than ``stale_after_s`` seconds (no recent probe) counts as unknown, so a
    silent node is never taken for idle. ``sessions`` counts the routes pinned to each node;
    ``inflight`` (``{node_id: open requests}``, this process's own count) is copied in.
    """
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    rows = Node.objects.select_related("package").annotate(pinned=Count("session_routes"))
    views: list[NodeView] = []
    addresses: dict[str, str] = {}
    open_requests = inflight or {}
    for node in rows:
        fresh = node.last_probe_at is not None and node.last_probe_at >= cutoff
        seen = node.last_seen_load if fresh else None
        views.append(
            NodeView(
                node_id=node.node_id,
                state=node.state,
                weight=node.weight,
                load=node.load if fresh else None,
                model=node.package.name if node.package else None,
                sessions=node.pinned,
                affinity=node.affinity,
                total=_number(seen, "total"),
                kv_used=_number(seen, "kv_used"),
                kv_capacity=_number(seen, "kv_capacity"),
                max_sessions=node.max_sessions,
                kv_budget=node.kv_budget_tokens,
                inflight=open_requests.get(node.node_id, 0),
            )
        )
        addresses[node.node_id] = node.address
    return views, addresses
