"""Reads for the proxy: which packages the array serves right now."""

from __future__ import annotations

from inference.models import ModelPackage
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
