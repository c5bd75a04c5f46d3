from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.errors import ArrayFull
from inference.models import RouteDecision, RoutingPolicy, SessionRoute
from inference.services import DECISION_LOG_LENGTH, route_resolve, routes_release_idle
from nodes.models import Node
from tests.inference.conftest import MODEL, add_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two(package, policy):
    return add_node("node-01", "127.0.0.1:1", package, load=0.1), add_node(
        "node-02", "127.0.0.1:2", package, load=0.2
    )


def test_it_releases_an_idle_pin_and_places_the_session_afresh(two):
    route_resolve(session_id="s", model=MODEL)
    SessionRoute.objects.update(last_seen_at=timezone.now() - timedelta(hours=1))
    Node.objects.filter(node_id="node-01").update(last_seen_load={"load": 0.9})
    target = route_resolve(session_id="s", model=MODEL)
    assert target.node_id == "node-02" and target.decision.action == "placed"
    actions = list(RouteDecision.objects.values_list("action", flat=True))
    assert actions == ["placed", "released", "placed"]


def test_the_control_loop_releases_idle_pins(two):
    route_resolve(session_id="s", model=MODEL)
    SessionRoute.objects.update(last_seen_at=timezone.now() - timedelta(hours=1))
    assert routes_release_idle(idle_s=60) == 1
    assert SessionRoute.objects.get().node is None


def test_it_keeps_the_decision_log_short(two):
    for i in range(DECISION_LOG_LENGTH + 5):
        Node.objects.filter(node_id="node-01").update(state="down" if i % 2 else "up")
        Node.objects.filter(node_id="node-02").update(state="up" if i % 2 else "down")
        route_resolve(session_id="s", model=MODEL)
    assert RouteDecision.objects.count() == DECISION_LOG_LENGTH
    assert SessionRoute.objects.get().moves == DECISION_LOG_LENGTH + 4


def test_it_moves_for_load_once_then_cools_down(two):
    policy = RoutingPolicy.load()
    policy.failover_strategy = "stick_and_rebalance"
    policy.save()
    route_resolve(session_id="s", model=MODEL)  # node-01
    Node.objects.filter(node_id="node-01").update(last_seen_load={"load": 3.0})
    Node.objects.filter(node_id="node-02").update(last_seen_load={"load": 0.0})
    assert route_resolve(session_id="s", model=MODEL).node_id == "node-02"
    Node.objects.filter(node_id="node-02").update(last_seen_load={"load": 3.0})
    Node.objects.filter(node_id="node-01").update(last_seen_load={"load": 0.0})
    assert route_resolve(session_id="s", model=MODEL).node_id == "node-02"  # cooldown holds
    assert SessionRoute.objects.get().moves == 1


def test_it_answers_429_when_every_node_is_at_its_session_limit(two):
    Node.objects.update(max_sessions=1)
    route_resolve(session_id="a", model=MODEL)
    route_resolve(session_id="b", model=MODEL)
    with pytest.raises(ArrayFull) as caught:
        route_resolve(session_id="c", model=MODEL)
    assert caught.value.status == 429 and caught.value.retry_after == 1
