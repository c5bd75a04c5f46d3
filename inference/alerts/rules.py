"""The alert rules: pure functions over a ``Snapshot`` of the array (no I/O, no clock), each
returning the ``Finding`` s whose condition holds now. ``inference.alerts.snapshot`` builds
the snapshot from the database; ``inference.alerts.services`` turns findings into alert rows.
Thresholds come from ``AlertSettings`` (any object with its attributes). docs/alerts.md.

Counter rates use two samples of a node's metrics (the control loop's utilization samples at
the start and end of ``window_s``): a counter that went down was reset (the node restarted),
so its increase is its new value, as Prometheus' ``increase()`` takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Metrics = Mapping[str, float]  # one node's sampled fields: requests, failed, queue, total, ...


@dataclass(frozen=True)
class NodeView:
    """One node as the rules see it: ``state`` (up/down/draining/unknown), ``validation``
    (pending/validating/passed/warned/failed/waived) and why, ``went_down`` events within the
    flap window, ``ttft_p95_s`` (seconds, last scrape; None before any request), and the last
    probe's error."""

    node_id: str
    state: str
    validation: str = "passed"
    validation_reason: str = ""
    went_down: int = 0
    ttft_p95_s: float | None = None
    probe_error: str = ""


@dataclass(frozen=True)
class Ended:
    """Work that ended badly: ``subject`` (``upgrade:7``, ``package_job:3``, ``loadtest:2``),
    what it was, why, and when (aware datetime)."""

    subject: str
    label: str
    reason: str
    finished_at: datetime


@dataclass(frozen=True)
class Snapshot:
    """The array at ``now``: nodes, each node's metrics at the start and the end of the rate
    window (``{node_id: {field: value}}``, ``window_s`` seconds apart; empty when fewer than
    two samples exist), upgrades rolled back and jobs given up within the event window."""

    now: datetime
    nodes: list[NodeView] = field(default_factory=list)
    start: Mapping[str, Metrics] = field(default_factory=dict)
    end: Mapping[str, Metrics] = field(default_factory=dict)
    window_s: float = 0.0
    rolled_back: list[Ended] = field(default_factory=list)
    given_up: list[Ended] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """A rule's condition holding for ``subject``: its measure ``value`` (the rule's unit:
    a ratio, seconds, per minute, a count) and a sentence for the operator."""

    rule: str
    subject: str
    value: float | None
    message: str


def increase(start: Metrics, end: Metrics, name: str) -> float | None:
    """How much counter ``name`` grew between two samples (a reset counts its new value);
    None when either sample lacks it."""
    a, b = start.get(name), end.get(name)
    if a is None or b is None:
        return None
    return b - a if b >= a else b


def node_down(snap: Snapshot, t: Any) -> list[Finding]:
    """A node the health checks marked ``down`` (draining and not-yet-seen nodes are not)."""
    return [
        Finding("node_down", f"node:{n.node_id}", 1.0, f"{n.node_id} is down: {n.probe_error}")
        for n in snap.nodes
        if n.state == "down"
    ]


def node_flapping(snap: Snapshot, t: Any) -> list[Finding]:
    """A node that went down ``flap_count`` times or more within ``flap_window_s``."""
    return [
        Finding(
            "node_flapping",
            f"node:{n.node_id}",
            float(n.went_down),
            f"{n.node_id} went down {n.went_down} times in {t.flap_window_s // 60} min",
        )
        for n in snap.nodes
        if n.went_down >= t.flap_count
    ]


def error_rate(snap: Snapshot, t: Any) -> list[Finding]:
    """Failed over admitted requests of a node over the window above ``error_rate_max``,
    once at least ``error_rate_min_requests`` were admitted in it."""
    out = []
    for node_id, end in snap.end.items():
        start = snap.start.get(node_id, {})
        requests = increase(start, end, "requests")
        failed = increase(start, end, "failed")
        if not requests or failed is None or requests < t.error_rate_min_requests:
            continue
        rate = min(1.0, failed / requests)
        if rate > t.error_rate_max:
            out.append(
                Finding(
                    "error_rate",
                    f"node:{node_id}",
                    round(rate, 4),
                    f"{node_id}: {rate:.1%} of {requests:.0f} requests failed "
                    f"(bound {t.error_rate_max:.1%})",
                )
            )
    return out


def ttft_p95(snap: Snapshot, t: Any) -> list[Finding]:
    """A node's TTFT P95 (its last 256 requests; in agent sessions nearly all are cache hits)
    above ``ttft_p95_max_s``."""
    return [
        Finding(
            "ttft_p95",
            f"node:{n.node_id}",
            n.ttft_p95_s,
            f"{n.node_id}: TTFT P95 {n.ttft_p95_s * 1000:.0f} ms "
            f"(target {t.ttft_p95_max_s * 1000:.0f} ms)",
        )
        for n in snap.nodes
        if n.ttft_p95_s is not None and n.ttft_p95_s > t.ttft_p95_max_s
    ]


def _saturation(sample: Metrics) -> float | None:
    total, queue = sample.get("total"), sample.get("queue")
    if not total or queue is None:
        return None
    return queue / total


def queue_saturation(snap: Snapshot, t: Any) -> list[Finding]:
    """Queued requests per configured sequence at or above ``queue_saturation_ratio`` at both
    ends of the window (held, not a burst)."""
    out = []
    for node_id, end in snap.end.items():
        now, then = _saturation(end), _saturation(snap.start.get(node_id, {}))
        if now is None or then is None or min(now, then) < t.queue_saturation_ratio:
            continue
        out.append(
            Finding(
                "queue_saturation",
                f"node:{node_id}",
                round(now, 3),
                f"{node_id}: {end.get('queue', 0):.0f} requests queued for "
                f"{end.get('total', 0):.0f} sequences",
            )
        )
    return out


def kv_thrashing(snap: Snapshot, t: Any) -> list[Finding]:
    """The host-RAM KV store churning: restores skipped per minute above
    ``restores_skipped_per_min_max`` or restores from host (each one follows a spill) per
    minute above ``restores_per_min_max``; value: the larger ratio to its bound's rate."""
    out = []
    if snap.window_s <= 0:
        return out
    minutes = snap.window_s / 60.0
    for node_id, end in snap.end.items():
        start = snap.start.get(node_id, {})
        skipped = (increase(start, end, "restores_skipped") or 0.0) / minutes
        restored = (increase(start, end, "restored") or 0.0) / minutes
        if skipped > t.restores_skipped_per_min_max or restored > t.restores_per_min_max:
            out.append(
                Finding(
                    "kv_thrashing",
                    f"node:{node_id}",
                    round(max(skipped, restored), 2),
                    f"{node_id}: host-RAM KV store thrashing: {skipped:.1f} restores "
                    f"skipped/min, {restored:.1f} restores/min",
                )
            )
    return out


def upgrade_rolled_back(snap: Snapshot, t: Any) -> list[Finding]:
    """An upgrade that ended rolled back within ``event_window_s``."""
    return [
        Finding("upgrade_rolled_back", e.subject, 1.0, f"{e.label} rolled back: {e.reason}")
        for e in snap.rolled_back
    ]


def validation_failed(snap: Snapshot, t: Any) -> list[Finding]:
    """A node whose device validation failed (until it passes again or is waived)."""
    return [
        Finding(
            "validation_failed",
            f"node:{n.node_id}",
            1.0,
            f"{n.node_id} failed validation: {n.validation_reason}",
        )
        for n in snap.nodes
        if n.validation == "failed"
    ]


def job_given_up(snap: Snapshot, t: Any) -> list[Finding]:
    """A job (package job, load test) the job mechanism ended failed within
    ``event_window_s``."""
    return [
        Finding("job_given_up", e.subject, 1.0, f"{e.label} given up: {e.reason}")
        for e in snap.given_up
    ]


Rule = Callable[[Snapshot, Any], list[Finding]]
RULES: dict[str, Rule] = {
    "node_down": node_down,
    "node_flapping": node_flapping,
    "error_rate": error_rate,
    "ttft_p95": ttft_p95,
    "queue_saturation": queue_saturation,
    "kv_thrashing": kv_thrashing,
    "upgrade_rolled_back": upgrade_rolled_back,
    "validation_failed": validation_failed,
    "job_given_up": job_given_up,
}


def evaluate(snap: Snapshot, thresholds: Any) -> list[Finding]:
    """Every rule's findings over ``snap``, in ``RULES`` order."""
    return [f for rule in RULES.values() for f in rule(snap, thresholds)]
