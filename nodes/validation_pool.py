"""The pool a validation is judged beside: the figures of the other validated nodes serving
the same package, and the measured speed each validated node's routing weight is scaled by
(decode tokens/s at 8 sequences over the pool's median). Split from
``nodes.device_validation``; see docs/validation.md, "Weight".
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from nodes.models import Node, ValidationRun

Run = ValidationRun
BENCH_KEYS = ("memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8")
SPEED_LIMITS = (0.1, 10.0)


def figure(value: Any) -> float | None:
    """A finite number (not a bool) as float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def pool_figures(node: Node, *, package_id: int | None) -> dict[str, Any]:
    """Medians of the other nodes serving ``package_id``, from their last passed or warned
    runs of it: ``{"nodes": n, "memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1",
    "decode_tok_s_8"}`` (None when no other node has one)."""
    latest = latest_benches(package_id=package_id, exclude=node.pk)
    medians = {
        k: round(statistics.median(v), 2)
        if (v := [b[k] for b in latest.values() if figure(b.get(k))])
        else None
        for k in BENCH_KEYS
    }
    return {"nodes": len(latest), **medians}


def latest_benches(
    *, package_id: int | None, exclude: int | None = None
) -> dict[int, dict[str, Any]]:
    """``{node pk: bench}`` of the last passed or warned run of ``package_id`` (the package the
    run measured: an upgrade switches packages without a run) of each node that serves it and
    is validated now."""
    nodes = Node.objects.filter(package_id=package_id, validation__in=("passed", "warned"))
    if exclude is not None:
        nodes = nodes.exclude(pk=exclude)
    latest: dict[int, dict[str, Any]] = {}
    for run in (
        Run.objects.filter(
            node__in=nodes,
            package_id=package_id,
            state__in=(Run.State.PASSED, Run.State.WARNED),
            bench__isnull=False,
        )
        .order_by("node_id", "-finished_at")
        .only("node_id", "bench")
    ):
        if isinstance(run.bench, dict):
            latest.setdefault(run.node_id, run.bench)
    return latest


def speeds_refresh(*, package_id: int | None) -> dict[str, float]:
    """Set every validated node of the package's pool to its decode speed at 8 sequences over
    the pool's median (clamped to 0.1-10); a node of the package without a figure for it
    (switched by an upgrade since) is unmeasured. Returns ``{node_id: speed}``."""
    latest = latest_benches(package_id=package_id)
    figures = {pk: f for pk, b in latest.items() if (f := figure(b.get("decode_tok_s_8")))}
    Node.objects.filter(package_id=package_id).exclude(pk__in=figures).update(measured_speed=None)
    if not figures:
        return {}
    median = statistics.median(figures.values())
    low, high = SPEED_LIMITS
    speeds = {}
    for node in Node.objects.filter(pk__in=figures):
        speed = round(min(high, max(low, figures[node.pk] / median)), 3)
        Node.objects.filter(pk=node.pk).update(measured_speed=speed)
        speeds[node.node_id] = speed
    return speeds
