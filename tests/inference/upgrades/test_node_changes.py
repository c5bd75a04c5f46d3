"""What an upgrade changes on a node goes through the node services (``nodes.services``): each
switch and weight change leaves an audit entry by the upgrade and tells open console pages
(the live ``node.status`` message), as an operator's change does."""

from __future__ import annotations

import pytest

from console.models import AuditEntry
from inference.upgrades import services
from nodes import live
from nodes.models import Node
from tests.inference.upgrades.fakes import run_to_end

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """The live messages sent to open console pages."""
    messages: list[dict] = []
    monkeypatch.setattr(live, "live_send", messages.append)
    return messages


def test_it_audits_a_switch_by_an_upgrade_and_tells_open_pages(
    fleet, packages, sent, django_capture_on_commit_callbacks
):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"max_unavailable": 3, "bake_s": 0, "no_traffic": "proceed"},
    )
    with django_capture_on_commit_callbacks(execute=True):
        done = run_to_end(upgrade)
    assert done.state == "succeeded"
    by = f"upgrade {upgrade.pk}"
    entry = AuditEntry.objects.get(action="node.switch", target="n1")
    assert entry.actor == by
    assert f"package: {old.key} \u2192 {new.key}" in entry.changes
    assert "served_name: (none) \u2192 smol-q4_1" in entry.changes
    switched = [
        m
        for m in sent
        if m["type"] == "node.status" and m.get("event", {}).get("kind") == "switched"
    ]
    assert sorted(m["node"]["node_id"] for m in switched) == ["n1", "n2", "n3"]
    assert all(m["node"]["package"] == new.key for m in switched)
    assert {m["event"]["actor"] for m in switched} == {by}


def test_it_audits_the_weight_of_a_surge_node_and_tells_open_pages(
    fleet, packages, sent, django_capture_on_commit_callbacks
):
    old, new = packages
    Node.objects.filter(node_id="n3").update(weight=0.0)  # spare capacity
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"bake_s": 0, "no_traffic": "proceed"},
    )
    with django_capture_on_commit_callbacks(execute=True):
        done = run_to_end(upgrade)
    assert done.state == "succeeded"
    weights = AuditEntry.objects.filter(action="node.update", target="n3").order_by("id")
    assert [(e.actor, e.changes) for e in weights] == [
        (f"upgrade {upgrade.pk}", ["weight: 0.0 \u2192 1.0"]),
        (f"upgrade {upgrade.pk}", ["weight: 1.0 \u2192 0.0"]),
    ]
    # a weight change logs no node event: its live messages are the ones without one
    told = [m for m in sent if m.get("node", {}).get("node_id") == "n3" and "event" not in m]
    assert len(told) == 2 and told[-1]["node"]["weight"] == 0.0


def test_it_audits_the_drain_and_undrain_of_each_node_by_the_upgrade(fleet, packages):
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"max_unavailable": 3, "bake_s": 0, "no_traffic": "proceed"},
    )
    assert run_to_end(upgrade).state == "succeeded"
    by = f"upgrade {upgrade.pk}"
    for node_id in ("n1", "n2", "n3"):
        entries = AuditEntry.objects.filter(
            target=node_id, action__in=["node.drain", "node.undrain"]
        )
        assert [(e.action, e.actor) for e in entries.order_by("id")] == [
            ("node.drain", by),
            ("node.undrain", by),
        ]
        assert entries.get(action="node.drain").changes == ["state: up \u2192 draining"]
