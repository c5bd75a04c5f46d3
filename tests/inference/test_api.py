from __future__ import annotations

import json

import pytest
from django.test import Client

from inference.models import RouteDecision, RoutingPolicy, SessionRoute
from inference.services import route_resolve
from tests.inference.conftest import MODEL, add_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin(monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("PHALANX_API_TOKEN", "env-secret")
    return {"Authorization": "Bearer env-secret"}


@pytest.fixture
def routed(package, policy):
    add_node("node-01", "127.0.0.1:1", package, load=0.5)
    add_node("node-02", "127.0.0.1:2", package, load=0.31)
    route_resolve(session_id="agent-1", model=MODEL)
    return SessionRoute.objects.get(session_id="agent-1")


def test_it_shows_a_session_with_its_decision_log(routed, admin):
    response = Client().get("/api/sessions/agent-1", headers=admin)
    assert response.status_code == 200
    data = response.json()
    assert data["node"] == "node-02" and data["turns"] == 1
    assert data["decisions"][0]["reason"] == "placed on node-02: lowest load 0.31 of 2 candidates"


def test_it_lists_sessions_filtered_by_node(routed, admin):
    assert Client().get("/api/sessions?node=node-02", headers=admin).json()["count"] == 1
    assert Client().get("/api/sessions?node=node-01", headers=admin).json()["count"] == 0


def test_it_answers_404_for_an_unknown_session(routed, admin):
    response = Client().get("/api/sessions/nope", headers=admin)
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


def test_it_releases_a_pin_and_logs_it(routed, admin):
    response = Client().post("/api/sessions/agent-1/release", headers=admin)
    assert response.status_code == 200
    assert response.json()["released"] is True
    route = SessionRoute.objects.get()
    assert route.node is None
    assert RouteDecision.objects.filter(route=route, action="released").exists()


def test_it_requires_credentials(routed):
    assert Client().get("/api/sessions").status_code == 401


def test_it_changes_the_policy_without_a_restart(routed, admin):
    response = Client().put(
        "/api/routing/policy",
        json.dumps({"failover_strategy": "stick_and_rebalance", "session_header": "X-Agent"}),
        content_type="application/json",
        headers=admin,
    )
    assert response.status_code == 200, response.content
    assert RoutingPolicy.load().failover_strategy == "stick_and_rebalance"
    assert Client().get("/api/routing/policy", headers=admin).json()["session_header"] == "X-Agent"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"failover_strategy": "sideways"}, "failover_strategy"),
        ({"rebalance_target": 5.0}, "rebalance_target"),
        ({"health_interval_s": 0}, "health_interval_s"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_it_refuses_a_bad_policy_naming_the_field(routed, admin, change, field):
    response = Client().put(
        "/api/routing/policy", json.dumps(change), content_type="application/json", headers=admin
    )
    assert response.status_code in (400, 422)
    assert field in json.dumps(response.json())


def test_it_shows_and_releases_a_session_whose_id_holds_a_slash(routed, admin):
    route_resolve(session_id="user/42", model=MODEL)
    shown = Client().get("/api/sessions/user%2F42", headers=admin)
    assert shown.status_code == 200 and shown.json()["session_id"] == "user/42"
    released = Client().post("/api/sessions/user%2F42/release", headers=admin)
    assert released.status_code == 200
    assert SessionRoute.objects.get(session_id="user/42").node is None
