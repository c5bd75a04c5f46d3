"""The traffic split of an upgrade over time: one ``UpgradeSample`` per control-loop tick
(sessions active in the last minute and nodes up, per version), drawn on the upgrade's page
and served by ``GET /api/upgrades/{id}/samples``."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from inference.models import SessionRoute, Upgrade, UpgradeSample
from nodes.models import Node

Step = Upgrade.Step


def sample(upgrade: Upgrade) -> UpgradeSample:
    """Sessions active in the last minute and nodes up, per version, now."""
    recent = timezone.now() - timedelta(seconds=60)
    routes = SessionRoute.objects.filter(last_seen_at__gte=recent)
    up = Node.objects.filter(state=Node.State.UP)
    if upgrade.from_package_id == upgrade.to_package_id:  # settings: the sides are nodes
        moved = [s["node_id"] for s in upgrade.nodes if s["state"] in (Step.DONE, Step.REVERTING)]
        mine = routes.filter(package_id=upgrade.from_package_id)
        new_sessions = mine.filter(node__node_id__in=moved).count()
        old_sessions = mine.count() - new_sessions
        new_nodes = up.filter(node_id__in=moved).count()
        old_nodes = up.filter(package_id=upgrade.from_package_id).count() - new_nodes
    else:
        old_sessions = routes.filter(package_id=upgrade.from_package_id).count()
        new_sessions = routes.filter(package_id=upgrade.to_package_id).count()
        old_nodes = up.filter(package_id=upgrade.from_package_id).count()
        new_nodes = up.filter(package_id=upgrade.to_package_id).count()
    return UpgradeSample.objects.create(
        upgrade=upgrade,
        old_sessions=old_sessions,
        new_sessions=new_sessions,
        old_nodes=old_nodes,
        new_nodes=new_nodes,
        new_share=upgrade.new_share,
    )
