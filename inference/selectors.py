"""Reads for the proxy and the admin API: packages served right now, the routing table."""

from __future__ import annotations

from inference.models import ModelPackage, SessionRoute
from nodes.models import Node


def packages_served() -> list[ModelPackage]:
    """Packages served by at least one ``up`` node, newest version of each name first."""
    return list(
        ModelPackage.objects.filter(nodes__state=Node.State.UP)
        .distinct()
        .order_by("name", "-created_at")
    )


def package_default() -> ModelPackage | None:
    """The package a websocket session uses when the client names none: the one served by the
    most ``up`` nodes, else the newest package."""
    from django.db.models import Count, Q

    return (
        ModelPackage.objects.annotate(up=Count("nodes", filter=Q(nodes__state=Node.State.UP)))
        .order_by("-up", "-created_at", "-id")
        .first()
    )


def session_routes(
    *, node_id: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[int, list[SessionRoute]]:
    """``(count, routes)`` of the routing table, most recently seen first, optionally only the
    sessions pinned to ``node_id``."""
    routes = SessionRoute.objects.select_related("node", "package").order_by("-last_seen_at")
    if node_id:
        routes = routes.filter(node__node_id=node_id)
    return routes.count(), list(routes[offset : offset + limit])


def session_route(*, session_id: str) -> SessionRoute | None:
    """One route with its node, package and decisions, or None."""
    return (
        SessionRoute.objects.select_related("node", "package")
        .prefetch_related("decisions")
        .filter(session_id=session_id)
        .first()
    )
