"""The drain wait of a node an upgrade moves: it is switched once it runs and queues no
request (by its metrics, scraped after the drain began) and no session active in the last
``RECENT_S`` is pinned there, or after the upgrade's ``drain_timeout_s``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from inference.models import SessionRoute
from nodes.models import Node

RECENT_S = 30.0  # a pinned session seen this recently counts against a drain


def since(s: dict[str, Any]) -> float:
    """Seconds since the node step ``s`` entered its state."""
    return (timezone.now() - datetime.fromisoformat(s["since"])).total_seconds()


def drained(node: Node, s: dict[str, Any], timeout_s: float) -> bool:
    """No request runs or waits on ``node`` (its metrics scraped since the drain began) and
    no session active in the last ``RECENT_S`` is pinned there, or ``timeout_s`` passed."""
    began = datetime.fromisoformat(s["since"])
    if node.state == Node.State.DOWN:
        return True  # nothing to wait for: the switch will say whether it answers
    if node.last_probe_at is None or node.last_probe_at <= began:
        return False
    load = node.last_seen_load or {}
    if load.get("active") or load.get("queue"):
        # past the timeout the switch may go ahead: requests running then end on the old
        # engine, which the node keeps until they have (nodes/agent/switch.py)
        return since(s) >= timeout_s
    recent = timezone.now() - timedelta(seconds=RECENT_S)
    pinned = SessionRoute.objects.filter(node=node, last_seen_at__gte=recent).count()
    if pinned and since(s) < timeout_s:
        s["detail"] = f"draining: {pinned} recently active sessions still pinned"
        return False
    return True
