"""The snapshot the alert rules read (``inference.alerts.rules.Snapshot``), built from the
database in a bounded number of queries (seven, whatever the array's size): the nodes, their
went-down events in the flap window, the first and last utilization samples of the rate
window, upgrades rolled back and jobs failed within the event window (at most ``LIMIT`` each).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from console.models import UtilizationSample
from inference.alerts.rules import Ended, NodeView, Snapshot
from inference.loadtests.models import LoadTestRun
from inference.packages.models import PackageJob
from inference.upgrades.models import Upgrade
from nodes.models import Node, NodeEvent

LIMIT = 50


def snapshot_take(*, now: datetime, settings: Any) -> Snapshot:
    """The array at ``now`` under ``settings`` (an ``AlertSettings``)."""
    start, end, window_s = _window(now, settings.window_s)
    return Snapshot(
        now=now,
        nodes=_nodes(now, settings.flap_window_s),
        start=start,
        end=end,
        window_s=window_s,
        rolled_back=_rolled_back(now - timedelta(seconds=settings.event_window_s)),
        given_up=_given_up(now - timedelta(seconds=settings.event_window_s)),
    )


def _nodes(now: datetime, flap_window_s: int) -> list[NodeView]:
    downs = dict(
        NodeEvent.objects.filter(
            kind=NodeEvent.Kind.WENT_DOWN, created_at__gte=now - timedelta(seconds=flap_window_s)
        )
        .values_list("node__node_id")
        .annotate(n=Count("id"))
    )
    rows = Node.objects.values_list(
        "node_id", "state", "validation", "validation_reason", "last_seen_load", "last_probe_error"
    )
    return [
        NodeView(
            node_id=node_id,
            state=state,
            validation=validation,
            validation_reason=reason,
            went_down=downs.get(node_id, 0),
            ttft_p95_s=(load or {}).get("ttft_p95"),
            probe_error=error,
        )
        for node_id, state, validation, reason, load, error in rows
    ]


def _window(now: datetime, window_s: int) -> tuple[dict, dict, float]:
    """Per-node metric fields of the newest sample and of the oldest within ``window_s``."""
    recent = UtilizationSample.objects.filter(taken_at__gte=now - timedelta(seconds=window_s))
    last = recent.order_by("-taken_at").values_list("taken_at", "snapshot").first()
    first = recent.order_by("taken_at").values_list("taken_at", "snapshot").first()
    if last is None or first is None or last[0] <= first[0]:
        return {}, {}, 0.0
    return (
        first[1].get("nodes", {}),
        last[1].get("nodes", {}),
        (last[0] - first[0]).total_seconds(),
    )


def _rolled_back(since: datetime) -> list[Ended]:
    rows = Upgrade.objects.filter(state=Upgrade.State.ROLLED_BACK, finished_at__gte=since)
    return [
        Ended(f"upgrade:{u.pk}", f"Upgrade {u.pk} of {u.model}", u.reason[:200], u.finished_at)
        for u in rows.only("model", "reason", "finished_at").order_by("-finished_at")[:LIMIT]
    ]


def _given_up(since: datetime) -> list[Ended]:
    jobs = PackageJob.objects.filter(state=PackageJob.State.FAILED, finished_at__gte=since)
    runs = LoadTestRun.objects.filter(state=LoadTestRun.State.FAILED, finished_at__gte=since)
    return [
        Ended(f"package_job:{j.pk}", f"Package job {j.pk} ({j.kind})", j.error[:200], j.finished_at)
        for j in jobs.only("kind", "error", "finished_at").order_by("-finished_at")[:LIMIT]
    ] + [
        Ended(f"loadtest:{r.pk}", f"Load test {r.pk}", r.error[:200], r.finished_at)
        for r in runs.only("error", "finished_at").order_by("-finished_at")[:LIMIT]
    ]
