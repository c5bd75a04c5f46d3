"""The upgrade state machine against nodes simulated at the client seam (``nodes.client``):
a plan that succeeds batch by batch, a smoke test that fails and rolls every node back, a
node that cannot load, a restart in the middle, the operator's actions. The real nodes and
model are in bench/upgrade.py and tests/nodes/agent/test_switch.py."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.lib.audit import acting_as
from console.lib.errors import Conflict, Invalid
from inference.models import ModelPackage, Upgrade
from inference.upgrades import driver, services
from nodes.models import Node, NodeEvent
from tests.inference.upgrades.fakes import run_to_end, scrape

pytestmark = pytest.mark.django_db


def test_an_upgrade_rolls_batch_by_batch_to_the_new_version(fleet, packages):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"max_unavailable": 2, "bake_s": 0, "no_traffic": "proceed"},
    )
    assert [(s["node_id"], s["batch"]) for s in upgrade.nodes] == [("n1", 0), ("n2", 0), ("n3", 1)]
    done = run_to_end(upgrade)
    assert done.state == "succeeded" and done.new_share == 1.0
    for node in Node.objects.all():
        assert node.package == new and node.served_name == "smol-q4_1" and node.state == "up"
    assert [a[1] for a in fleet.asked] == [new.sha256] * 3
    gates = [(g["node_id"], g["gate"], g["passed"]) for g in done.gates]
    assert ("n1", "smoke", True) in gates and ("n3", "health", True) in gates
    # no traffic in these fakes: each bake compared nothing, and went on by the rule
    bakes = [(g["gate"], g["verdict"]) for g in done.gates if not g["node_id"]]
    assert bakes == [("bake", "skipped"), ("bake", "skipped")]
    kinds = list(done.events.values_list("kind", flat=True))
    assert kinds[:3] == ["planned", "started", "draining"] and kinds[-1] == "succeeded"
    assert "canary" in kinds and NodeEvent.objects.filter(kind="switched").count() == 3
    # the nodes' own events name the upgrade as who drained, switched and undrained them
    said = set(NodeEvent.objects.values_list("kind", "message"))
    by = f"upgrade {upgrade.pk}"
    assert {m for k, m in said if k in ("drained", "undrained")} == {
        f"drained by {by}",
        f"undrained by {by}",
    }
    assert {m for k, m in said if k == "switched"} == {
        f"switched by {by}: serves smol-q4_k_m:1 as smol-q4_1"
    }
    moved = ("drained", "switched", "undrained")  # each names its actor, as the pages show it
    assert set(NodeEvent.objects.filter(kind__in=moved).values_list("actor", flat=True)) == {by}
    driver.upgrades_tick()  # a finished upgrade is no longer sampled
    samples = list(done.samples.values_list("new_share", flat=True))
    assert samples and samples[-1] == 1.0


def test_a_failed_smoke_test_rolls_every_node_back(fleet, packages):
    old, new = packages
    fleet.broken.add(new.sha256)
    upgrade = services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    done = run_to_end(upgrade)
    assert done.state == "rolled_back" and done.new_share == 0.0
    assert done.reason == "smoke: n1: tool_call: HTTP 400 template_error: boom"
    assert all(s["state"] == "reverted" for s in done.nodes)
    assert set(fleet.serving.values()) == {old.sha256}
    assert all(n.package == old and n.state == "up" for n in Node.objects.all())
    assert fleet.asked == [("n1", new.sha256), ("n1", old.sha256)]  # n2, n3 never left


def test_a_node_that_cannot_load_the_new_version_keeps_the_old_one(fleet, packages):
    old, new = packages
    fleet.cannot_load.add(new.sha256)
    done = run_to_end(services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk))
    assert done.state == "rolled_back"
    assert done.reason == "switch: n1 could not load smol-q4_k_m:1: llama.cpp: bad magic"
    assert all(n.package == old and n.state == "up" for n in Node.objects.all())


def test_it_resumes_after_a_restart_without_asking_a_node_twice(fleet, packages):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"bake_s": 0, "no_traffic": "proceed"},
    )
    for _ in range(3):  # started, draining, switching: the node was asked once
        scrape()
        driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256)]
    row = Upgrade.objects.get(pk=upgrade.pk)
    row.nodes[0]["state"] = "draining"  # as if the loop died between asking and saving
    row.save()
    fleet.switches["n1"]["state"] = "loading"
    scrape()
    driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256)]
    assert run_to_end(upgrade).state == "succeeded"


def test_pause_promote_and_abort(fleet, packages):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 3600}
    )
    services.upgrade_pause(upgrade_id=upgrade.pk)
    scrape()
    assert driver.step(upgrade.pk).state == "paused"
    with pytest.raises(Conflict, match="is paused; it cannot pause now"):
        services.upgrade_pause(upgrade_id=upgrade.pk)
    services.upgrade_resume(upgrade_id=upgrade.pk)
    for _ in range(8):
        scrape()
        driver.step(upgrade.pk)
    row = Upgrade.objects.get(pk=upgrade.pk)
    assert row.phase == "baking batch 1" and row.state == "running"  # an hour of bake ahead
    with acting_as("alice"):
        services.upgrade_abort(upgrade_id=upgrade.pk, reason="drill")
    done = run_to_end(upgrade)
    assert done.state == "rolled_back" and done.reason == "aborted by alice: drill"
    assert all(n.package == old for n in Node.objects.all())
    promoted = services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 3600}
    )
    services.upgrade_promote(upgrade_id=promoted.pk)
    assert run_to_end(promoted).state == "succeeded"


def test_only_an_approved_version_can_be_rolled_out(fleet, packages):
    old, new = packages
    ModelPackage.objects.filter(pk=new.pk).update(status="rejected")
    with pytest.raises(Conflict, match="smol-q4_k_m:1 is rejected; only an approved version"):
        services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    ModelPackage.objects.filter(pk=new.pk).update(status="approved")
    with pytest.raises(Conflict, match="already what those nodes serve"):
        services.upgrade_start(from_package_id=old.pk, to_package_id=old.pk)
    with pytest.raises(Invalid, match="settings.canary_share: between 0 and 1"):
        services.upgrade_start(
            from_package_id=old.pk, to_package_id=new.pk, settings={"canary_share": 2}
        )
    services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    with pytest.raises(Conflict, match="An upgrade of 'smol-q4_1' is under way"):
        services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)


def test_a_standby_node_surges_onto_the_new_version_first_and_is_spare_again_after(fleet, packages):
    old, new = packages
    Node.objects.filter(node_id="n3").update(weight=0.0)  # spare capacity
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"bake_s": 0, "no_traffic": "proceed"},
    )
    assert [(s["node_id"], s["batch"], s["surge"]) for s in upgrade.nodes] == [
        ("n3", 0, True),
        ("n1", 1, False),
        ("n2", 2, False),
    ]
    assert "batch 1 (surge: standby nodes): n3" in upgrade.events.first().message
    weights = []
    for _ in range(60):
        scrape()
        driver.upgrades_tick()
        row = Upgrade.objects.get(pk=upgrade.pk)
        weights.append((row.nodes[1]["state"], Node.objects.get(node_id="n3").weight))
        if row.finished:
            break
    assert row.state == "succeeded" and fleet.asked[0] == ("n3", new.sha256)
    assert ("draining", 1.0) in weights  # n3 served while n1 was out
    assert (
        Node.objects.get(node_id="n3").weight == 0.0
        and Node.objects.get(node_id="n3").package == new
    )


def test_a_bake_that_finds_the_new_version_failing_more_rolls_back(fleet, packages):
    old, new = packages
    counters: dict[str, int] = {}

    def busy_scrape():
        """Traffic on every node; on the new version one request in three fails."""
        for node in Node.objects.all():
            n = counters[node.node_id] = counters.get(node.node_id, 0) + 6
            failing = fleet.serving[node.node_id] == new.sha256
            node.state = "up" if node.state == "unknown" else node.state
            node.last_probe_at = timezone.now()
            node.last_seen_load = {
                "active": 0,
                "queue": 0,
                "requests": n,
                "failed": n // 3 if failing else 0,
                "tool_parse_failures": 0,
                "ttft_p95": 0.4,
            }
            node.save()

    upgrade = services.upgrade_start(
        from_package_id=old.pk, to_package_id=new.pk, settings={"bake_s": 0}
    )
    for _ in range(100):
        busy_scrape()
        driver.upgrades_tick()
        row = Upgrade.objects.get(pk=upgrade.pk)
        if row.finished:
            break
    assert row.state == "rolled_back"
    assert row.reason.startswith("bake of batch 1: error rate 33.3% (new) against 0.0% (old)")
    failed = [g for g in row.gates if not g["passed"]]
    assert [g["gate"] for g in failed] == ["error_rate"]
    assert all(n.package == old for n in Node.objects.all())
    assert set(fleet.serving.values()) == {old.sha256}


def test_a_failure_found_while_an_operator_paused_still_rolls_back(fleet, packages, monkeypatch):
    old, new = packages
    fleet.broken.add(new.sha256)
    upgrade = services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    smoke = driver.smoke_test

    def paused_during_the_smoke_test(http):
        services.upgrade_pause(upgrade_id=upgrade.pk)
        return smoke(http)

    monkeypatch.setattr(driver, "smoke_test", paused_during_the_smoke_test)
    for _ in range(10):
        scrape()
        driver.upgrades_tick()
        row = Upgrade.objects.get(pk=upgrade.pk)
        if row.state != "running":
            break
    assert row.state == "rolling_back" and row.new_share == 0.0
    assert row.reason.startswith("smoke: n1")
    monkeypatch.setattr(driver, "smoke_test", smoke)
    assert run_to_end(upgrade).state == "rolled_back"


def test_a_down_node_is_named_before_anything_moves(fleet, packages):
    old, new = packages
    Node.objects.filter(node_id="n2").update(state="down")
    with pytest.raises(Conflict, match="n2 is down: bring it back or remove it"):
        services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
