"""One node's part in an upgrade, shared by the way forward (``inference.upgrades.driver``) and
the way back (``inference.upgrades.rollback``): its step moving to a new state (with a line
of the upgrade's event log), asking it to serve a package (``PUT /package``), whether it
serves one (``GET /package``), and recording what it serves (``nodes.services``)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from inference.models import Upgrade
from inference.upgrades.outcomes import actor, answers_forget
from inference.upgrades.services import upgrade_event
from nodes import client as node_client
from nodes import services as node_services
from nodes.models import Node


def move(upgrade: Upgrade, s: dict[str, Any], state: str, detail: str) -> None:
    """The node step ``s`` enters ``state`` now, saying ``detail`` (also a line of the
    upgrade's event log, naming the node)."""
    s["state"], s["since"], s["detail"] = state, timezone.now().isoformat(), detail
    upgrade_event(upgrade, state, detail, s["node_id"])


def ask_switch(upgrade: Upgrade, node: Node, package, settings: dict[str, int]) -> None:
    """``PUT /package`` on ``node``: serve ``package`` as the upgrade's model, with
    ``settings``. Raises what ``node_client.package_switch`` raises."""
    node_client.package_switch(
        node.address,
        node_id=node.node_id,
        model_path=package.gguf_path,
        package=upgrade.model,
        sha256=package.sha256,
        settings=settings or None,
    )


def serves(current: dict[str, Any] | None, package, settings: dict[str, int]) -> bool:
    """The node's ``GET /package`` says it serves ``package`` with ``settings``."""
    if not current or current.get("sha256") != package.sha256:
        return False
    have = current.get("settings") or {}
    return all(have.get(k) == v for k, v in settings.items())


def served(node: Node, package, upgrade: Upgrade, settings: dict[str, int] | None = None) -> None:
    """Record what ``node`` serves now (as ``upgrade``'s model), with the settings it took
    (kept for its restarts); the node's event and audit entry name the upgrade."""
    node_services.node_record_package_switch(
        node_id=node.node_id,
        package_id=package.pk,
        served_name=upgrade.model,
        settings=settings,
        by=actor(upgrade),
    )
    answers_forget(upgrade)
