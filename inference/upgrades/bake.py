"""The bake of a batch: once its nodes serve the new version, it serves for ``bake_s`` while
the new version's traffic is compared with the old one's (``plan.bake_gates``, from the
nodes' own counters as last scraped).

Green means measured. A bake whose sides served fewer than ``min_requests`` requests each
compared nothing: its gate is ``skipped``, never a pass. The bake then goes on measuring for
up to another ``bake_s`` (the traffic may only be slow to come); if it still cannot compare,
the upgrade's ``no_traffic`` rule decides: ``pause`` (the default: the operator resumes to go
on without a comparison, or aborts) or ``proceed`` (go on, saying so). Promote skips the wait
and goes on. Which of these happened is in the gate's detail and the event log.

When no node of the old version is left (the last batch), the old side is what the old
version served over the earlier bakes of this upgrade (``Upgrade.bake["baseline"]``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from inference.models import Upgrade
from inference.upgrades import plan
from inference.upgrades.outcomes import finish, record_gate, roll_back
from inference.upgrades.services import upgrade_event
from nodes.models import Node

State, Step = Upgrade.State, Upgrade.Step
COUNTERS = ("requests", "failed", "tool_parse_failures", "ttft_p95")
BASELINE_NOTE = " (old: the old version over this upgrade's earlier bakes; no node serves it now)"


def bake_step(upgrade: Upgrade, batch: int) -> None:
    """One tick of batch ``batch``'s bake (its nodes are all ``done``): begin it, wait, then
    pass, fail (roll back) or skip it and decide how to go on."""
    phase = f"baking batch {batch + 1}"
    if upgrade.phase != phase:
        _begin(upgrade, batch, phase)
        return
    if upgrade.bake.get("held"):  # paused by the no_traffic rule, and an operator resumed
        _go_on(upgrade, batch, f"batch {batch + 1} goes on without a comparison: resumed")
        return
    settings = upgrade.settings
    elapsed = (timezone.now() - datetime.fromisoformat(upgrade.bake["started_at"])).total_seconds()
    if not upgrade.promote and elapsed < settings["bake_s"]:
        return
    old, new, baseline = _sides(upgrade)
    if plan.comparable(old, new, settings):
        _compare(upgrade, batch, old, new, baseline)
    else:
        _nothing_compared(upgrade, batch, old, new, elapsed)


def _begin(upgrade: Upgrade, batch: int, phase: str) -> None:
    upgrade.phase = phase
    upgrade.bake = {
        "batch": batch,
        "started_at": timezone.now().isoformat(),
        "before": counters(),
        "baseline": upgrade.bake.get("baseline"),
    }
    upgrade_event(upgrade, "bake", f"batch {batch + 1} bakes for {upgrade.settings['bake_s']:g} s")


def _compare(upgrade: Upgrade, batch: int, old: plan.Side, new: plan.Side, baseline: bool) -> None:
    results = plan.bake_gates(old, new, upgrade.settings)
    for result in results:
        if baseline:
            result = {**result, "detail": result["detail"] + BASELINE_NOTE}
        record_gate(upgrade, "", result)
    failed = [r for r in results if r["verdict"] == "fail"]
    if failed:
        roll_back(upgrade, f"bake of batch {batch + 1}: {failed[0]['detail']}")
        return
    _keep_baseline(upgrade, old)
    _go_on(upgrade, batch, f"batch {batch + 1} passed its bake", "bake_passed")


def _nothing_compared(
    upgrade: Upgrade, batch: int, old: plan.Side, new: plan.Side, elapsed: float
) -> None:
    """Wait up to another ``bake_s`` for traffic, then skip the gate and decide: promoted by
    an operator, or the ``no_traffic`` rule (pause or proceed)."""
    settings = upgrade.settings
    gate = plan.skipped_gate(old, new, settings)
    if not upgrade.promote and elapsed < 2 * settings["bake_s"]:
        if not upgrade.bake.get("waiting"):
            upgrade.bake["waiting"] = True
            upgrade_event(
                upgrade,
                "bake_waiting",
                f"batch {batch + 1}: {gate['detail'].removeprefix('skipped: ')}; waiting up to "
                f"{settings['bake_s']:g} s more for traffic",
            )
        return
    rule = settings.get("no_traffic", plan.DEFAULTS["no_traffic"])
    decision = "promoted" if upgrade.promote else rule
    how = {
        "promoted": "went on: promoted by an operator",
        "proceed": "went on by the upgrade's rule (no_traffic: proceed)",
        "pause": "paused by the upgrade's rule (no_traffic: pause); resume to go on without "
        "a comparison, or abort to roll back",
    }[decision]
    gate["detail"] += f" after {elapsed:.0f} s; {how}"
    gate["values"].update(decision=decision, waited_s=round(elapsed, 1))
    record_gate(upgrade, "", gate)
    _keep_baseline(upgrade, old)
    if decision == "pause":
        upgrade.bake["held"] = True
        upgrade.state, upgrade.paused_from = State.PAUSED, State.RUNNING
        upgrade.reason = f"batch {batch + 1}'s bake compared nothing: {how}"
        upgrade_event(upgrade, "pause", upgrade.reason)
        return
    _go_on(upgrade, batch, f"batch {batch + 1}'s bake compared nothing; it {how}")


def _go_on(upgrade: Upgrade, batch: int, sentence: str, kind: str = "bake_skipped") -> None:
    """The batch is through its bake: every new session to the new version, the next batch
    (or the end). ``sentence`` says how it got through (an event of ``kind``)."""
    upgrade.new_share = 1.0
    for s in upgrade.nodes:
        if s["batch"] == batch:
            s["baked"] = True
    upgrade.phase = f"batch {batch + 2}"
    upgrade.bake = {"baseline": upgrade.bake.get("baseline")}
    upgrade.reason = ""
    upgrade_event(upgrade, kind, f"{sentence}; new sessions all go to {upgrade.to_package.key}")
    if all(s.get("baked") for s in upgrade.nodes):
        finish(upgrade, State.SUCCEEDED, "every node serves the new version")


def _sides(upgrade: Upgrade) -> tuple[plan.Side, plan.Side, bool]:
    """``(old, new, from_baseline)``: each version's traffic since the bake began, from the
    plan's nodes not yet moved (old) and those done (new); with no old node left, the old
    side is the baseline of the earlier bakes (``from_baseline`` True) when there is one."""
    old_ids = [s["node_id"] for s in upgrade.nodes if s["state"] == Step.WAITING]
    new_ids = [s["node_id"] for s in upgrade.nodes if s["state"] == Step.DONE]
    after, before = counters(), upgrade.bake.get("before") or {}

    def side(ids: list[str]) -> plan.Side:
        return plan.side_from(
            {k: before.get(k, {}) for k in ids}, {k: after[k] for k in ids if k in after}
        )

    baseline = upgrade.bake.get("baseline")
    if not old_ids and baseline:
        return plan.Side(**baseline), side(new_ids), True
    return side(old_ids), side(new_ids), False


def _keep_baseline(upgrade: Upgrade, old: plan.Side) -> None:
    """Add the old version's traffic over this bake to the upgrade's baseline."""
    if not any(s["state"] == Step.WAITING for s in upgrade.nodes):
        return  # the old side was the baseline itself
    kept = upgrade.bake.get("baseline")
    total = plan.Side(**kept).plus(old) if kept else old
    upgrade.bake["baseline"] = total.as_dict()


def counters() -> dict[str, dict[str, Any]]:
    """Every node's request, failure and tool-parse counters and TTFT P95, as last scraped:
    ``{node_id: {"requests", "failed", "tool_parse_failures", "ttft_p95"}}``."""
    out = {}
    for node_id, load in Node.objects.values_list("node_id", "last_seen_load"):
        load = load or {}
        out[node_id] = {k: load.get(k) for k in COUNTERS}
    return out
