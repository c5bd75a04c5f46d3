"""The way back of a rolling upgrade that failed a gate or was aborted: every node that left
the old version goes back to it (drain, switch, check), at most ``max_unavailable`` at a time,
one phase per tick of the control loop (``inference.upgrades.driver.step``); then the upgrade
ends ``rolled_back``, or ``failed`` naming the nodes that could not go back."""

from __future__ import annotations

from typing import Any

import httpx
from django.utils import timezone

from inference.models import Upgrade
from inference.upgrades.drain import drained as _drained
from inference.upgrades.drain import since as _since
from inference.upgrades.node_switch import ask_switch as _ask_switch
from inference.upgrades.node_switch import move as _move
from inference.upgrades.node_switch import served as _served
from inference.upgrades.node_switch import serves as _serves
from inference.upgrades.outcomes import actor as _actor
from inference.upgrades.outcomes import finish as _finish
from inference.upgrades.services import upgrade_event
from nodes import client as node_client
from nodes import services as node_services
from nodes.models import Node

State, Step = Upgrade.State, Upgrade.Step


def backward(upgrade: Upgrade) -> None:
    """Every node that left the old version goes back to it, at most ``max_unavailable`` out
    of service at a time, the most recently moved first; untouched nodes are released. A node
    that cannot go back within its time ends the upgrade ``failed``, naming it (it stays
    drained for the operator)."""
    budget = int(upgrade.settings["max_unavailable"])
    for s in sorted(upgrade.nodes, key=lambda s: -s["batch"]):
        if s["state"] in (Step.REVERTED, Step.STUCK):
            continue
        node = Node.objects.filter(node_id=s["node_id"]).first()
        if node is None:
            _move(upgrade, s, Step.REVERTED, "removed from the array")
            continue
        out = sum(1 for x in upgrade.nodes if x["state"] == Step.REVERTING)
        _revert(upgrade, s, node, may_drain=out < budget)
    if all(s["state"] in (Step.REVERTED, Step.STUCK) for s in upgrade.nodes):
        stuck = [s["node_id"] for s in upgrade.nodes if s["state"] == Step.STUCK]
        if stuck:
            _finish(
                upgrade,
                State.FAILED,
                f"{upgrade.reason}; could not go back to {upgrade.from_package.key}: "
                f"{', '.join(stuck)} (left drained)",
            )
        else:
            _finish(upgrade, State.ROLLED_BACK, upgrade.reason or "rolled back")


def _revert(upgrade: Upgrade, s: dict[str, Any], node: Node, *, may_drain: bool) -> None:
    """Take ``node`` back to the old version, one phase per tick: first whether it must go
    back at all, then (``s["revert"]``) draining, switching, checking, and reverted. Not back
    within ``switch_timeout_s`` + ``drain_timeout_s``: stuck."""
    if s["state"] != Step.REVERTING:
        _revert_begin(upgrade, s, node, may_drain=may_drain)
        return
    old = upgrade.from_package
    phase = s.get("revert", "")
    limit = upgrade.settings["switch_timeout_s"] + upgrade.settings["drain_timeout_s"]
    if _since(s) > limit:
        _move(upgrade, s, Step.STUCK, f"did not get back to {old.key} within {limit:.0f} s")
        return
    if phase == Step.DRAINING:
        _revert_drained(upgrade, s, node)
    elif phase == Step.SWITCHING:
        _revert_switched(upgrade, s, node)
    elif phase == Step.CHECKING:
        _revert_checked(upgrade, s, node)


def _revert_begin(upgrade: Upgrade, s: dict[str, Any], node: Node, *, may_drain: bool) -> None:
    """A node that still serves the old version is released (reverted); one never reached
    that does not answer is too; any other is drained to go back, when ``may_drain``."""
    old = upgrade.from_package
    before = s.get("settings_before") or {}
    current = node_client.package_state(node.address, node_id=node.node_id)
    switch = (current or {}).get("switch") or {}
    if switch.get("state") in ("verifying", "loading"):
        return  # a load under way (ours, perhaps): let it end before deciding
    if _serves(current, old, before) and node.package_id == old.pk:
        if s["state"] == Step.DRAINING or (
            s["state"] != Step.WAITING and node.state == Node.State.DRAINING
        ):
            if not s.get("was_draining"):
                node_services.node_undrain(node_id=node.node_id, by=_actor(upgrade))
        _move(upgrade, s, Step.REVERTED, f"kept {old.key}")
        return
    if current is None and s["state"] == Step.WAITING:
        _move(upgrade, s, Step.REVERTED, f"not reached; kept {old.key}")
        return
    if not may_drain:
        return
    node_services.node_drain(node_id=node.node_id, by=_actor(upgrade))
    s["revert"] = Step.DRAINING
    _move(upgrade, s, Step.REVERTING, f"drained to go back to {old.key}")


def _revert_drained(upgrade: Upgrade, s: dict[str, Any], node: Node) -> None:
    """Once drained, ask the node for the old version with its settings from before (unless
    it serves them already); then wait for the switch."""
    if not _drained(node, s, upgrade.settings["drain_timeout_s"]):
        return
    old = upgrade.from_package
    before = s.get("settings_before") or {}
    current = node_client.package_state(node.address, node_id=node.node_id)
    if current is None:
        return  # cannot ask it now; next tick
    if not _serves(current, old, before):
        try:
            _ask_switch(upgrade, node, old, before)
        except node_client.SwitchBusy:
            return  # a load is under way; ask when it has ended
        except (node_client.NodeRefusedSwitch, httpx.HTTPError) as exc:
            s["detail"] = f"going back to {old.key} refused, retried: {exc}"
            return
    s["revert"] = Step.SWITCHING
    s["since"] = timezone.now().isoformat()
    upgrade_event(upgrade, "reverting", f"loading {old.key}", s["node_id"])


def _revert_switched(upgrade: Upgrade, s: dict[str, Any], node: Node) -> None:
    """Once the load has ended: serving the old version, it is recorded and checked; else
    (it failed, or a later load won) it is asked again."""
    old = upgrade.from_package
    before = s.get("settings_before") or {}
    current = node_client.package_state(node.address, node_id=node.node_id)
    switch = (current or {}).get("switch") or {}
    if switch.get("state") in ("verifying", "loading"):
        return
    if _serves(current, old, before):
        _served(node, old, upgrade, before)
        s["revert"] = Step.CHECKING
    elif current is not None:
        s["revert"] = Step.DRAINING  # it failed, or a later load won: ask again


def _revert_checked(upgrade: Upgrade, s: dict[str, Any], node: Node) -> None:
    """Once ``/health`` answers, the node takes traffic again (unless it was drained before
    the upgrade): reverted."""
    if node_client.probe(node.address, node_id=node.node_id, timeout=5.0).ok:
        if not s.get("was_draining"):
            node_services.node_undrain(node_id=node.node_id, by=_actor(upgrade))
        s.pop("revert", None)
        _move(upgrade, s, Step.REVERTED, f"back on {upgrade.from_package.key}")
