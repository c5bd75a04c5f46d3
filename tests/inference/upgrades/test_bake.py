"""Green means measured (issue 28): a bake whose sides served too few requests compared
nothing, so its gate is ``skipped``, never a pass; the upgrade waits up to another
``bake_s`` for traffic, then goes on by its ``no_traffic`` rule (``pause``, the default, or
``proceed``) or because an operator promoted it, and says which. The last batch, with no node
of the old version left, is compared with what the old version served over the earlier
bakes. Nodes simulated at the client seam (``fakes.FakeNodes``); the bake's clock is moved by
writing its start into the row, never by waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.lib.audit import acting_as
from inference.models import Upgrade
from inference.upgrades import driver, services
from nodes.models import Node
from tests.inference.upgrades.fakes import run_to_end, scrape

pytestmark = pytest.mark.django_db


class Traffic:
    """The health loop's scrape with each node's request counters going up by what
    ``per_tick`` gives it (none for a node not named)."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.per_tick: dict[str, int] = {}

    def scrape(self) -> None:
        scrape()
        for node in Node.objects.all():
            total = self.totals[node.node_id] = self.totals.get(
                node.node_id, 0
            ) + self.per_tick.get(node.node_id, 0)
            node.last_seen_load = {
                "active": 0,
                "queue": 0,
                "requests": total,
                "failed": 0,
                "tool_parse_failures": 0,
                "ttft_p95": 0.4,
            }
            node.save(update_fields=["last_seen_load"])


def until_baking(upgrade: Upgrade, traffic: Traffic | None = None, limit: int = 50) -> Upgrade:
    """Step it until its first batch bakes (the bake has begun)."""
    for _ in range(limit):
        (traffic.scrape if traffic else scrape)()
        row = driver.step(upgrade.pk)
        if row.phase == "baking batch 1":
            return row
    raise AssertionError(f"never baked: {Upgrade.objects.get(pk=upgrade.pk).nodes}")


def bake_began(upgrade: Upgrade, seconds_ago: float) -> None:
    """As if the bake had begun ``seconds_ago``."""
    row = Upgrade.objects.get(pk=upgrade.pk)
    row.bake["started_at"] = (timezone.now() - timedelta(seconds=seconds_ago)).isoformat()
    Upgrade.objects.filter(pk=upgrade.pk).update(bake=row.bake)


def start(packages, **settings) -> Upgrade:
    old, new = packages
    return services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 600, **settings}
    )


def array_gates(upgrade: Upgrade) -> list[dict]:
    return [g for g in Upgrade.objects.get(pk=upgrade.pk).gates if not g["node_id"]]


def kinds(upgrade: Upgrade) -> list[str]:
    return list(upgrade.events.order_by("at", "id").values_list("kind", flat=True))


def test_a_bake_with_too_little_traffic_waits_then_pauses_and_says_so(fleet, packages):
    upgrade = start(packages)
    until_baking(upgrade)
    bake_began(upgrade, 601)  # the bake time is over: nothing to compare, so it waits
    scrape()
    row = driver.step(upgrade.pk)
    assert row.state == "running" and not array_gates(upgrade)
    waiting = upgrade.events.get(kind="bake_waiting").message
    assert waiting == (
        "batch 1: too little traffic to compare (0 requests on the new version, 0 on the old; "
        "at least 3 each); waiting up to 600 s more for traffic"
    )
    bake_began(upgrade, 1201)  # and the wait too
    scrape()
    row = driver.step(upgrade.pk)
    assert row.state == "paused" and row.paused_from == "running"
    (gate,) = array_gates(upgrade)
    assert (gate["gate"], gate["verdict"], gate["passed"]) == ("bake", "skipped", False)
    assert gate["detail"] == (
        "skipped: too little traffic to compare (0 requests on the new version, 0 on the old; "
        "at least 3 each) after 1201 s; paused by the upgrade's rule (no_traffic: pause); "
        "resume to go on without a comparison, or abort to roll back"
    )
    assert gate["values"]["decision"] == "pause"
    assert row.reason.startswith("batch 1's bake compared nothing: paused by the upgrade's rule")
    assert upgrade.events.filter(kind="gate").last().message.startswith("bake skipped: ")
    scrape()
    assert driver.step(upgrade.pk).state == "paused"  # it stays so until an operator acts
    with acting_as("alice"):
        services.upgrade_resume(upgrade_id=upgrade.pk)
    scrape()
    row = driver.step(upgrade.pk)
    assert row.state == "running" and row.phase == "batch 2" and row.new_share == 1.0
    assert row.reason == ""
    went_on = upgrade.events.filter(kind="bake_skipped").last().message
    assert went_on == (
        "batch 1 goes on without a comparison: resumed; new sessions all go to smol-q4_k_m:1"
    )
    assert "resumed by alice" in upgrade.events.filter(kind="resume").last().message


def test_the_proceed_rule_goes_on_and_says_so(fleet, packages):
    upgrade = start(packages, bake_s=0, no_traffic="proceed")
    done = run_to_end(upgrade)
    assert done.state == "succeeded"
    verdicts = [g["verdict"] for g in array_gates(upgrade)]
    assert verdicts == ["skipped", "skipped", "skipped"]
    assert all(
        g["detail"].endswith("went on by the upgrade's rule (no_traffic: proceed)")
        for g in array_gates(upgrade)
    )
    assert "bake_passed" not in kinds(upgrade) and kinds(upgrade).count("bake_skipped") == 3


def test_a_promoted_upgrade_goes_on_without_waiting_and_says_it_was_promoted(fleet, packages):
    upgrade = start(packages, bake_s=3600)
    until_baking(upgrade)
    services.upgrade_promote(upgrade_id=upgrade.pk)
    done = run_to_end(upgrade)
    assert done.state == "succeeded"
    gates = array_gates(upgrade)
    assert {g["verdict"] for g in gates} == {"skipped"}
    assert gates[0]["detail"].endswith("; went on: promoted by an operator")


def test_traffic_that_comes_during_the_wait_is_compared(fleet, packages):
    traffic = Traffic()
    upgrade = start(packages)
    until_baking(upgrade, traffic)
    bake_began(upgrade, 601)
    traffic.scrape()
    assert driver.step(upgrade.pk).state == "running"  # waiting: nothing on either side
    traffic.per_tick = {"n1": 5, "n2": 5, "n3": 5}
    traffic.scrape()
    row = driver.step(upgrade.pk)
    assert [g["verdict"] for g in array_gates(upgrade)] == ["pass", "pass", "pass"]
    assert row.phase == "batch 2" and "bake_passed" in kinds(upgrade)


def test_the_last_batch_is_compared_with_the_old_version_of_the_earlier_bakes(fleet, packages):
    traffic = Traffic()
    traffic.per_tick = {"n1": 4, "n2": 4, "n3": 4}
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"bake_s": 0, "max_unavailable": 2},
    )
    for _ in range(60):
        traffic.scrape()
        row = driver.step(upgrade.pk)
        if row.finished or row.state == "paused":
            break
    assert row.state == "succeeded", (row.state, row.reason)
    first, last = array_gates(upgrade)[:3], array_gates(upgrade)[3:]
    assert [g["verdict"] for g in first] == ["pass"] * 3
    assert [g["verdict"] for g in last] == ["pass"] * 3
    assert "(old: the old version over this upgrade's earlier bakes" in last[0]["detail"]
    assert "(old:" not in first[0]["detail"]


def test_a_one_batch_upgrade_has_nothing_to_compare_with(fleet, packages):
    """No old node after its only batch and no earlier bake: skipped, then the rule."""
    traffic = Traffic()
    traffic.per_tick = {"n1": 4, "n2": 4, "n3": 4}
    upgrade = start(packages, bake_s=0, max_unavailable=3)
    for _ in range(30):
        traffic.scrape()
        row = driver.step(upgrade.pk)
        if row.finished or row.state == "paused":
            break
    assert row.state == "paused"
    (gate,) = array_gates(upgrade)
    assert gate["verdict"] == "skipped" and gate["values"]["old_requests"] == 0
    assert gate["values"]["new_requests"] >= 3
