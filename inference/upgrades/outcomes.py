"""How an upgrade's steps are recorded and how it ends: a gate's verdict (its row in
``Upgrade.gates`` and a line of the event log), a rollback, the end of the upgrade, and who
acts on a node for it. Shared by the driver (``inference.upgrades.driver``) and the bake
(``inference.upgrades.bake``); the caller saves the row."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from inference.models import Upgrade
from inference.upgrades.services import upgrade_event
from nodes import services as node_services

State = Upgrade.State
MARKS = {"pass": "passed", "fail": "FAILED", "skipped": "skipped"}


def record_gate(upgrade: Upgrade, node_id: str, result: dict[str, Any]) -> None:
    """Append ``result`` (``{"gate", "passed", "detail", "values"}``, with ``verdict`` ``pass``,
    ``fail`` or ``skipped``; without one, ``passed`` decides pass or fail) to the upgrade's
    gates, stamped now, and log it (``node_id`` "" for the array)."""
    verdict = result.get("verdict") or ("pass" if result["passed"] else "fail")
    row = {"at": timezone.now().isoformat(), "node_id": node_id, **result, "verdict": verdict}
    row["passed"] = verdict == "pass"
    upgrade.gates = [*upgrade.gates, row]
    upgrade_event(
        upgrade, "gate", f"{result['gate']} {MARKS[verdict]}: {result['detail']}", node_id
    )


def roll_back(upgrade: Upgrade, why: str) -> None:
    """Turn the upgrade around: new sessions to the old version now, every moved node back."""
    upgrade.state, upgrade.reason, upgrade.new_share = State.ROLLING_BACK, why, 0.0
    upgrade.phase = "rolling back"
    upgrade_event(upgrade, "rollback", f"rolling back: {why}")


def actor(upgrade: Upgrade) -> str:
    """Who acts on a node for ``upgrade``, as its node events and audit entries say:
    ``"upgrade 3"``."""
    return f"upgrade {upgrade.pk}"


def finish(upgrade: Upgrade, state: str, why: str) -> None:
    """End the upgrade as ``state`` (succeeded, rolled_back, failed) saying ``why``; its surge
    nodes are standby again (weight 0, on whichever version they serve)."""
    upgrade.state, upgrade.finished_at, upgrade.phase = state, timezone.now(), ""
    surged = [s["node_id"] for s in upgrade.nodes if s.get("surge")]
    if surged:
        for node_id in surged:
            node_services.node_set_weight(node_id=node_id, weight=0.0, by=actor(upgrade))
        upgrade_event(upgrade, "surge_end", f"standby again: {', '.join(surged)}")
    if state == State.SUCCEEDED:
        upgrade.new_share = 1.0
        upgrade.reason = why
    upgrade_event(upgrade, state, why)
    answers_forget(upgrade)


def answers_forget(upgrade: Upgrade) -> None:
    """The answers cached for the upgrade's model came from the package being replaced (or,
    rolling back, from the new one): they go (``inference.semcache``), at each node's switch
    and once more when the upgrade ends (what old nodes stored meanwhile)."""
    from inference import model_names
    from inference.semcache.service import package_changed

    try:
        package_changed(model_names.family_of(upgrade.model))
    except Exception as exc:  # the cache's store down must not stop an upgrade
        upgrade_event(upgrade, "cache", f"could not invalidate cached answers: {exc}")
