"""Reads for the proxy and the admin API: packages served right now, the routing table."""

from __future__ import annotations

from inference.models import ModelPackage, SessionRoute
from nodes.models import Node


def packages_served() -> list[tuple[str, ModelPackage]]:
    """``(name clients ask for, package)`` for each model served by at least one ``up`` node
    that may take traffic (device validation passed, warned or waived)
    (its served name: the name stays while upgrades change the version under it), the newest
    version of each name first."""
    nodes = Node.objects.filter(
        state=Node.State.UP,
        package__isnull=False,
        validation__in=Node.ROUTABLE_VALIDATIONS,
    ).select_related("package")
    pairs = sorted(
        ((n.model_name, n.package) for n in nodes),
        key=lambda pair: (pair[0], -pair[1].created_at.timestamp()),
    )
    return [pair for pair in pairs if pair[0]]


def served_name(package: ModelPackage) -> str:
    """The name clients ask for ``package`` by: the served name of a node serving it, else
    its own name."""
    named = (
        Node.objects.filter(package=package)
        .exclude(served_name="")
        .values_list("served_name", flat=True)
        .first()
    )
    return named or package.name


def package_default() -> ModelPackage | None:
    """The package a websocket session uses when the client names none: the one served by the
    most ``up`` nodes, else the newest package."""
    from django.db.models import Count, Q

    return (
        ModelPackage.objects.annotate(
            up=Count(
                "nodes",
                filter=Q(
                    nodes__state=Node.State.UP,
                    nodes__validation__in=Node.ROUTABLE_VALIDATIONS,
                ),
            )
        )
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
