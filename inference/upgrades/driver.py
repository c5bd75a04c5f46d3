"""The control loop's side of rolling upgrades: one step of each upgrade under way per tick.

Every step reads the upgrade's row, does one thing to one node at most per node, and writes
the row back, so a control-plane restart resumes where it was. A node goes through

    waiting -> draining -> switching -> checking -> done

``draining``: the node takes no new sessions (``Node.state`` draining); its sessions move to
another node of the same version at their next turn (with their KV, docs/node-protocol.md),
and the step waits until the node runs no request and no recently active session is pinned
there, or ``drain_timeout_s``. ``switching``: ``PUT /package`` on the node, which loads the new
version beside the old and swaps (nodes/agent/switch.py); streams running on the old engine
finish there. ``checking``: ``/health`` says the new sha256, and a real smoke chat on the node
(streamed, with a tool call and its result) passes; then the node takes traffic again.

When a batch is done it bakes for ``bake_s`` (``inference.upgrades.bake``): new sessions go
to the new version with ``canary_share`` (first batch), then all of them; the new nodes'
error rate, tool-call parse failures and TTFT P95 are compared with the old ones' over the
bake (``plan.bake_gates``, from the nodes' own metrics); a bake that compared nothing is
skipped and the upgrade's ``no_traffic`` rule decides. Any failed gate rolls back: every node that left the old
version goes back to it the same way (drain, switch, check), and new sessions go to the old
version at once.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.utils import timezone

from console.lib.jobs import hold
from console.lib.steps import StepKind
from inference.models import SessionRoute, Upgrade
from inference.packages.evaluation.smoke import smoke_test
from inference.upgrades.bake import bake_step
from inference.upgrades.drain import RECENT_S
from inference.upgrades.drain import drained as _drained
from inference.upgrades.drain import since as _since
from inference.upgrades.node_switch import ask_switch as _ask_switch
from inference.upgrades.node_switch import move as _move
from inference.upgrades.node_switch import served as _served
from inference.upgrades.node_switch import serves as _serves
from inference.upgrades.outcomes import actor as _actor
from inference.upgrades.outcomes import finish as _finish
from inference.upgrades.outcomes import record_gate as _record_gate
from inference.upgrades.outcomes import roll_back as _roll_back
from inference.upgrades.rollback import backward as _backward
from inference.upgrades.samples import sample
from inference.upgrades.services import upgrade_event
from nodes import client as node_client
from nodes import services as node_services
from nodes.models import Node

log = logging.getLogger(__name__)
State, Step = Upgrade.State, Upgrade.Step
SMOKE_TIMEOUT_S = 120.0


def upgrades_due() -> list[int]:
    """The upgrades under way (pending, running, rolling back): the ones to step now."""
    under_way = Upgrade.objects.filter(state__in=(State.PENDING, State.RUNNING, State.ROLLING_BACK))
    return list(under_way.values_list("pk", flat=True))


def upgrade_step_failed(upgrade_id: int, exc: Exception) -> None:
    """Say on the upgrade's page that a step raised (once, not every second); the step is
    retried next tick."""
    upgrade = Upgrade.objects.get(pk=upgrade_id)
    message = f"step failed, retried next tick: {exc}"
    last = upgrade.events.order_by("-at", "-id").values_list("message", flat=True).first()
    if last != message:
        upgrade_event(upgrade, "error", message)


def upgrades_sample() -> None:
    """A traffic sample of every upgrade under way or paused."""
    for upgrade in Upgrade.objects.filter(
        state__in=(State.RUNNING, State.PAUSED, State.ROLLING_BACK)
    ):
        sample(upgrade)


def upgrades_step_kind() -> StepKind:
    """Rolling upgrades as a step kind (``inference.apps`` registers it with the control
    loop's runner, ``console.lib.steps``): every second, one ``step`` of each upgrade due."""
    return StepKind(
        "upgrade", due=upgrades_due, step=step, interval_s=1.0, on_error=upgrade_step_failed
    )


def upgrades_tick() -> None:
    """One step of every upgrade under way, and a traffic sample of each (``manage.py
    upgrade``, tests; the control loop runs the two on threads of their own)."""
    upgrades_step_kind().tick()
    upgrades_sample()


# a driver that dies mid-step holds its upgrade this long at most (tests shorten it)
LEASE_S = float(os.environ.get("PHALANX_UPGRADE_LEASE_S", "30"))
RENEW_S = LEASE_S / 3  # a step under way renews the lease this often (a smoke chat takes longer)


def step(upgrade_id: int) -> Upgrade | None:
    """Advance one upgrade by one step; returns it as saved, or None when another driver
    holds it (``console.lib.jobs.hold`` on ``lease_until``: one driver steps an upgrade at a
    time). The lease is renewed every ``RENEW_S`` while the step runs, so a driver killed
    mid-step (SIGKILL, a lost host) leaves it to the next one within ``LEASE_S``."""
    with hold(Upgrade, upgrade_id, lease_s=LEASE_S, renew_s=RENEW_S) as held:
        if not held:
            return None
        upgrade = Upgrade.objects.select_related("from_package", "to_package").get(pk=upgrade_id)
        started_as = upgrade.state
        if upgrade.state == State.PENDING:
            upgrade.state, upgrade.started_at = State.RUNNING, timezone.now()
            upgrade.phase = "batch 1"
            upgrade_event(upgrade, "started", "the upgrade started")
        elif upgrade.state == State.RUNNING:
            _forward(upgrade)
        elif upgrade.state == State.ROLLING_BACK:
            _backward(upgrade)
        _save(upgrade, started_as)
    return Upgrade.objects.get(pk=upgrade_id)


DRIVER_FIELDS = (
    "state",
    "phase",
    "paused_from",
    "new_share",
    "reason",
    "started_at",
    "finished_at",
)
PROGRESS_FIELDS = ("nodes", "gates", "bake")


def _save(upgrade: Upgrade, started_as: str) -> None:
    """Write the step, conditionally on the state it started from. When an operator paused
    or aborted it meanwhile, their state stands and the step's progress (nodes, gates) is
    kept; except that a rollback the step began (a failed gate) goes ahead over a pause."""
    fields = {f: getattr(upgrade, f) for f in (*DRIVER_FIELDS, *PROGRESS_FIELDS)}
    if Upgrade.objects.filter(pk=upgrade.pk, state=started_as).update(**fields):
        return
    progress = {f: fields[f] for f in PROGRESS_FIELDS}
    now = Upgrade.objects.filter(pk=upgrade.pk).values_list("state", flat=True).first()
    if upgrade.state == State.ROLLING_BACK and now == State.PAUSED:
        progress.update(state=State.ROLLING_BACK, reason=upgrade.reason, new_share=0.0)
        progress.update(phase=upgrade.phase, paused_from="")
    Upgrade.objects.filter(pk=upgrade.pk).update(**progress)


# --- forward ------------------------------------------------------------------------------------


def _forward(upgrade: Upgrade) -> None:
    batch = _current_batch(upgrade)
    if batch is None:
        _finish(upgrade, State.SUCCEEDED, "every node serves the new version")
        return
    steps = [s for s in upgrade.nodes if s["batch"] == batch]
    for s in steps:
        if upgrade.state != State.RUNNING:
            return
        _advance(upgrade, s)
    if upgrade.state == State.RUNNING and all(s["state"] == Step.DONE for s in steps):
        bake_step(upgrade, batch)


def _current_batch(upgrade: Upgrade) -> int | None:
    """The first batch not yet through its bake, or None when every batch is."""
    open_batches = [s["batch"] for s in upgrade.nodes if not s.get("baked")]
    return min(open_batches) if open_batches else None


def _advance(upgrade: Upgrade, s: dict[str, Any]) -> None:
    node = Node.objects.filter(node_id=s["node_id"]).first()
    if node is None:
        _fail(upgrade, s, "health", f"{s['node_id']} was removed from the array")
        return
    settings = upgrade.settings
    if s["state"] == Step.WAITING:
        if node.state == Node.State.DOWN:
            _fail(upgrade, s, "health", f"{node.node_id} is down: {node.last_probe_error}")
            return
        if _holds_last_sessions(upgrade, s, node):
            return
        node_services.node_drain(node_id=node.node_id, by=_actor(upgrade))
        _move(upgrade, s, Step.DRAINING, "drained: no new sessions")
    elif s["state"] == Step.DRAINING:
        if _drained(node, s, settings["drain_timeout_s"]):
            _switch(upgrade, s, node, upgrade.to_package, Step.SWITCHING)
    elif s["state"] == Step.SWITCHING:
        _await_switch(upgrade, s, node, upgrade.to_package, next_state=Step.CHECKING)
    elif s["state"] == Step.CHECKING:
        if _check(upgrade, s, node):
            if not s.get("was_draining"):
                node_services.node_undrain(node_id=node.node_id, by=_actor(upgrade))
            if s.get("surge"):  # spare capacity takes traffic on the new version for now
                node_services.node_set_weight(node_id=node.node_id, weight=1.0, by=_actor(upgrade))
            _move(upgrade, s, Step.DONE, "serves the new version and takes traffic")
            if upgrade.new_share == 0.0:
                upgrade.new_share = 1.0 if upgrade.promote else float(settings["canary_share"])
                upgrade_event(
                    upgrade,
                    "canary",
                    f"new sessions to {upgrade.to_package.key}: {upgrade.new_share:.0%}",
                )


def _holds_last_sessions(upgrade: Upgrade, s: dict[str, Any], node: Node) -> bool:
    """True while ``node`` must wait before its drain: no node outside its batch serves the
    old version any more, every new session goes to the new one, and sessions of the old
    version active in the last ``RECENT_S`` are pinned there (at most ``drain_timeout_s``).
    Drained now, they would have no node of their version left and change version
    mid-session; kept serving, they end on it while no new session joins them."""
    if upgrade.from_package_id == upgrade.to_package_id or upgrade.new_share < 1.0:
        return False  # a settings roll keeps the version; a canary still needs old nodes
    batch = [x["node_id"] for x in upgrade.nodes if x["batch"] == s["batch"]]
    others = Node.objects.filter(
        package_id=upgrade.from_package_id, state=Node.State.UP, weight__gt=0
    ).exclude(node_id__in=batch)
    if others.exists():
        return False  # its sessions move to another node of their version
    recent = timezone.now() - timedelta(seconds=RECENT_S)
    pinned = SessionRoute.objects.filter(
        node=node, package_id=upgrade.from_package_id, last_seen_at__gte=recent
    ).count()
    if not pinned:
        return False
    if "held_since" not in s:
        s["held_since"] = timezone.now().isoformat()
        upgrade_event(
            upgrade,
            "holding",
            f"{pinned} recent sessions on {upgrade.from_package.key} are pinned here and no "
            "other node serves it: drained when they have ended (at most "
            f"{upgrade.settings['drain_timeout_s']:g} s)",
            s["node_id"],
        )
    held = (timezone.now() - datetime.fromisoformat(s["held_since"])).total_seconds()
    if held >= upgrade.settings["drain_timeout_s"]:
        return False
    s["detail"] = f"waiting for {pinned} sessions on {upgrade.from_package.key} to end"
    return True


# --- one node ------------------------------------------------------------------------------------


def _switch(upgrade: Upgrade, s: dict[str, Any], node: Node, package, state: str) -> None:
    """Ask ``node`` to serve ``package`` (as the upgrade's model); idempotent after a restart:
    a node already serving or loading it is not asked twice."""
    current = node_client.package_state(node.address, node_id=node.node_id)
    if current is None:
        if _since(s) > upgrade.settings["switch_timeout_s"]:
            _fail(upgrade, s, "switch", f"{node.node_id} does not answer GET /package")
        return  # asked again next tick: first learn what it serves (a rollback restores it)
    switch = current.get("switch") or {}
    already = _serves(current, package, upgrade.node_settings) or (
        switch.get("sha256") == package.sha256 and switch.get("state") in ("verifying", "loading")
    )
    if "settings_before" not in s:
        s["settings_before"] = current.get("settings") or {}
    if not already:
        try:
            _ask_switch(upgrade, node, package, upgrade.node_settings)
        except node_client.SwitchBusy:
            return  # another load is under way on the node: ask when it has ended
        except (node_client.NodeRefusedSwitch, httpx.HTTPError) as exc:
            _fail(upgrade, s, "switch", f"{node.node_id} refused {package.key}: {exc}")
            return
    _move(upgrade, s, state, f"loading {package.key}")


def _await_switch(
    upgrade: Upgrade, s: dict[str, Any], node: Node, package, *, next_state: str
) -> bool:
    """Wait for ``node`` to serve ``package``; on success record it and move to
    ``next_state`` (True). A failed load, or none within ``switch_timeout_s``, fails the
    ``switch`` gate."""
    current = node_client.package_state(node.address, node_id=node.node_id)
    switch = (current or {}).get("switch") or {}
    if _serves(current, package, upgrade.node_settings) and switch.get("state") != "loading":
        _served(node, package, upgrade, upgrade.node_settings)
        _move(upgrade, s, next_state, f"serves {package.key}")
        return True
    if switch.get("sha256") == package.sha256 and switch.get("state") == "failed":
        _fail(
            upgrade,
            s,
            "switch",
            f"{node.node_id} could not load {package.key}: {switch.get('error')}",
        )
    elif _since(s) > upgrade.settings["switch_timeout_s"]:
        why = "does not answer" if current is None else f"is still {switch.get('state', '?')}"
        _fail(upgrade, s, "switch", f"{node.node_id} {why} after {_since(s):.0f} s")
    return False


def _check(upgrade: Upgrade, s: dict[str, Any], node: Node) -> bool:
    """``/health`` and a smoke chat on the node; records both gates. False (and the gate
    failed, the upgrade rolling back) when one fails."""
    probe = node_client.probe(node.address, node_id=node.node_id, timeout=5.0)
    if not probe.ok:
        _fail(upgrade, s, "health", f"{node.node_id}: /health {probe.status} {probe.error}".strip())
        return False
    _record_gate(
        upgrade,
        s["node_id"],
        {"gate": "health", "passed": True, "detail": "/health 200", "values": {}},
    )
    with node_client.node_http(node.address, node_id=node.node_id, timeout=SMOKE_TIMEOUT_S) as http:
        smoke = smoke_test(http)
    if not smoke.passed:
        _fail(upgrade, s, "smoke", f"{node.node_id}: {smoke.error}")
        return False
    steps = ", ".join(step["name"] for step in smoke.steps)
    _record_gate(
        upgrade,
        s["node_id"],
        {"gate": "smoke", "passed": True, "detail": f"passed: {steps}", "values": {}},
    )
    return True


def _fail(upgrade: Upgrade, s: dict[str, Any], gate: str, detail: str) -> None:
    _record_gate(
        upgrade, s["node_id"], {"gate": gate, "passed": False, "detail": detail, "values": {}}
    )
    s["detail"] = detail
    _roll_back(upgrade, f"{gate}: {detail}")
