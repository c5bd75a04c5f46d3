"""The pool a validation is judged beside: the figures of the other validated nodes serving
the same package, and the measured speed each validated node's routing weight is scaled by
(decode tokens/s at 8 sequences over the pool's median). Split from
``nodes.device_validation``; see docs/validation.md, "Weight".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
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
    runs of it: ``{"nodes": n, "node_ids": [...], "left_out": [{"node_id", "why"}],
    "memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8"}`` (a median
    is None when no other node has one; ``left_out``: the other nodes serving the package
    that are not in the pool, each with the reason)."""
    latest = latest_benches(package_id=package_id, exclude=node.pk)
    medians = {
        k: round(statistics.median(v), 2)
        if (v := [b[k] for b in latest.values() if figure(b.get(k))])
        else None
        for k in BENCH_KEYS
    }
    others = Node.objects.filter(package_id=package_id).exclude(pk=node.pk).order_by("node_id")
    return {
        "nodes": len(latest),
        "node_ids": [n.node_id for n in others if n.pk in latest],
        "left_out": [
            {"node_id": n.node_id, "why": _why_left_out(n)} for n in others if n.pk not in latest
        ],
        **medians,
    }


_LEFT_OUT = {
    "validating": "validating at the same time: its figures join the pool when its run ends",
    "pending": "not validated yet",
    "failed": "failed validation",
    "waived": "validation waived: it has no figures",
}


def _why_left_out(node: Node) -> str:
    """Why a node serving the package has no figures in its pool (docs/validation.md)."""
    return _LEFT_OUT.get(
        node.validation, "no passed run of this package (an upgrade switched it since)"
    )


def pool_note(pool: dict[str, Any]) -> str:
    """The pool rule's words when no other node has a figure: who serves the package and why
    each is not in the pool, or that no other node serves it."""
    left = pool.get("left_out") or []
    if not left:
        return "no other node serves this package to compare"
    return "no other node's figures to compare yet: " + "; ".join(
        f"{n['node_id']} {n['why']}" for n in left
    )


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


def pool_rejudge(*, package_id: int | None, rule: Callable[[dict, dict], list[dict]]) -> list[str]:
    """Judge again, beside the pool as it is now, the last run of each validated node of the
    package whose pool had fewer nodes than it has now (runs that overlapped: the first to end
    saw its peer still validating). ``rule(bench, pool)`` gives the pool rule's results as
    dicts. The pool rule only passes or warns, so a node moves at most between passed and
    warned and keeps taking traffic. Returns the node ids judged again."""
    rejudged = []
    for pk in latest_benches(package_id=package_id):
        node = Node.objects.get(pk=pk)
        run = (
            Run.objects.filter(
                node=node, package_id=package_id, state__in=(Run.State.PASSED, Run.State.WARNED)
            )
            .order_by("-finished_at")
            .first()
        )
        pool = pool_figures(node, package_id=package_id)
        if run is None or pool["nodes"] <= int((run.pool or {}).get("nodes") or 0):
            continue
        rules = [r for r in run.rules if r.get("rule") != "pool"] + rule(run.bench or {}, pool)
        _rejudged(node, run, rules, pool)
        rejudged.append(node.node_id)
    return rejudged


def _rejudged(node: Node, run: ValidationRun, rules: list[dict], pool: dict[str, Any]) -> None:
    worst = max((r["status"] for r in rules), key=("pass", "warn", "fail").index, default="pass")
    state = Run.State.WARNED if worst != "pass" else Run.State.PASSED
    findings = [f"{r['rule']}: {r['reason']}" for r in rules if r["status"] != "pass"]
    reason = "; ".join(findings) or "every rule passes"
    Run.objects.filter(pk=run.pk).update(rules=rules, pool=pool, state=state, reason=reason)
    latest = node.validation_runs.order_by("-created_at", "-id").first()
    if (
        latest is not None
        and latest.pk == run.pk
        and node.validation in (Node.Validation.PASSED, Node.Validation.WARNED)
    ):
        Node.objects.filter(pk=node.pk).update(
            validation=str(state), validation_reason=reason[:2000]
        )
