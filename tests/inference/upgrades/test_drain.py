"""The drain wait (``driver._drained``): a draining node is switched only once it runs and
queues no request (by metrics scraped after the drain began) and no session active in the
last ``RECENT_S`` is pinned there, or after ``drain_timeout_s``; the same wait before a
rollback switches a node back. Nodes simulated at the client seam (``fakes.FakeNodes``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import SessionRoute, Upgrade
from inference.upgrades import driver, services
from nodes.models import Node
from tests.inference.upgrades.fakes import scrape

pytestmark = pytest.mark.django_db


def step_of(upgrade: Upgrade, node_id: str) -> dict:
    row = Upgrade.objects.get(pk=upgrade.pk)
    return next(s for s in row.nodes if s["node_id"] == node_id)


def seen(node_id: str, *, active: int = 0, queue: int = 0) -> None:
    """A health-loop scrape of every node, ``node_id`` with ``active`` requests running and
    ``queue`` waiting."""
    scrape()
    Node.objects.filter(node_id=node_id).update(
        last_seen_load={"active": active, "queue": queue, "requests": 0}
    )


def draining_n1(packages, **settings) -> Upgrade:
    """An upgrade started and its first node, n1, draining (its drain began after the last
    scrape)."""
    old, new = packages
    upgrade = services.upgrade_start(
        from_package_id=old.pk,
        to_package_id=new.pk,
        settings={"bake_s": 0, "drain_timeout_s": 3600, **settings},
    )
    scrape()
    driver.step(upgrade.pk)  # started
    scrape()
    driver.step(upgrade.pk)  # n1 drained
    assert step_of(upgrade, "n1")["state"] == "draining"
    assert Node.objects.get(node_id="n1").state == "draining"
    return upgrade


@pytest.mark.parametrize("load", [{"active": 1}, {"queue": 2}], ids=["open stream", "queued"])
def test_a_node_with_a_request_running_or_waiting_is_not_switched_until_it_ends(
    fleet, packages, load
):
    _, new = packages
    upgrade = draining_n1(packages)
    for _ in range(3):
        seen("n1", **load)
        driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "draining"
    assert fleet.asked == []  # nobody asked n1 to switch while its stream ran
    seen("n1")  # the stream ended
    driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "switching"
    assert fleet.asked == [("n1", new.sha256)]


def test_a_node_whose_metrics_predate_the_drain_is_not_switched(fleet, packages):
    _, new = packages
    upgrade = draining_n1(packages)
    for _ in range(3):  # no scrape since the drain: what it ran then is unknown
        driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "draining" and fleet.asked == []
    seen("n1")
    driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256)]


def test_a_recently_active_session_pinned_to_the_node_holds_the_switch(fleet, packages):
    old, new = packages
    upgrade = draining_n1(packages)
    n1, n2 = Node.objects.get(node_id="n1"), Node.objects.get(node_id="n2")
    SessionRoute.objects.create(session_id="agent-7", node=n1, package=old)  # seen just now
    for _ in range(3):
        seen("n1")
        driver.step(upgrade.pk)
    s = step_of(upgrade, "n1")
    assert s["state"] == "draining" and fleet.asked == []
    assert s["detail"] == "draining: 1 recently active sessions still pinned"
    SessionRoute.objects.filter(session_id="agent-7").update(node=n2)  # its next turn moved it
    seen("n1")
    driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "switching"
    assert fleet.asked == [("n1", new.sha256)]


def test_a_session_idle_longer_than_the_window_does_not_hold_the_switch(fleet, packages):
    old, new = packages
    upgrade = draining_n1(packages)
    n1 = Node.objects.get(node_id="n1")
    SessionRoute.objects.create(session_id="agent-8", node=n1, package=old)
    SessionRoute.objects.filter(session_id="agent-8").update(
        last_seen_at=timezone.now() - timedelta(seconds=driver.RECENT_S - 5)
    )
    seen("n1")
    driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "draining" and fleet.asked == []
    SessionRoute.objects.filter(session_id="agent-8").update(
        last_seen_at=timezone.now() - timedelta(seconds=driver.RECENT_S + 5)
    )
    seen("n1")
    driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256)]


def test_past_the_drain_timeout_a_running_stream_no_longer_holds_the_switch(fleet, packages):
    _, new = packages
    upgrade = draining_n1(packages, drain_timeout_s=0)
    seen("n1", active=1)
    driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "switching"
    assert fleet.asked == [("n1", new.sha256)]


def test_a_rollback_waits_for_the_nodes_streams_before_switching_it_back(fleet, packages):
    old, new = packages
    upgrade = draining_n1(packages, bake_s=3600)
    for _ in range(4):  # switching, checking, done, baking
        seen("n1")
        driver.step(upgrade.pk)
    assert step_of(upgrade, "n1")["state"] == "done"
    services.upgrade_abort(upgrade_id=upgrade.pk, reason="drill")
    seen("n1")
    driver.step(upgrade.pk)  # n1 drained to go back
    assert step_of(upgrade, "n1").get("revert") == "draining"
    for _ in range(3):
        seen("n1", active=1)
        driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256)]  # not yet asked to go back
    seen("n1")
    driver.step(upgrade.pk)
    assert fleet.asked == [("n1", new.sha256), ("n1", old.sha256)]
