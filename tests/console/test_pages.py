"""The operator pages through Django's test client: login, roles, forms, /metrics, /health."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.test import Client

from inference.models import ModelPackage, RouteDecision, RoutingPolicy, SessionRoute
from nodes.models import Node

pytestmark = pytest.mark.django_db

PAGES = [
    "/",
    "/nodes/",
    "/nodes/node-01/",
    "/packages/",
    "/routing/",
    "/routing/table/",
    "/utilization/",
    "/playground/",
    "/config/",
    "/config/phalanx.yaml",
]


def test_it_answers_health_without_credentials():
    response = Client().get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", [*PAGES, "/tokens/", "/api/docs"])
def test_it_sends_anonymous_visitors_to_login(node, path):
    response = Client().get(path)
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_it_logs_in_with_a_password(users):
    client = Client()
    response = client.post("/login/", {"username": "viewer", "password": "pw-for-tests"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    assert Client().post("/login/", {"username": "viewer", "password": "no"}).status_code == 200


class _VisibleText(HTMLParser):
    """The text a browser draws: tag contents outside <script>, <style> and <head>."""

    HIDDEN = {"script", "style", "head", "title"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs) -> None:
        self.hidden += tag in self.HIDDEN

    def handle_endtag(self, tag) -> None:
        self.hidden -= tag in self.HIDDEN

    def handle_data(self, data) -> None:
        if not self.hidden:
            self.parts.append(data)


def visible_text(response) -> str:
    """The words a person reads on ``response`` (HTML), whitespace collapsed; plain text as is."""
    body = response.content.decode()
    if not response["Content-Type"].startswith("text/html"):
        return body
    parser = _VisibleText()
    parser.feed(body)
    return " ".join(" ".join(parser.parts).split())


# What each page exists to show, given node-01 (package smollm2-test, 127.0.0.1:9401) with the
# session s-shown pinned to it and the default routing policy.
PAGE_SHOWS = {
    "/": ["Overview", "1 nodes serving", "1 sessions", "node-01", "127.0.0.1:9401"],
    "/nodes/": ["node-01", "127.0.0.1:9401", "smollm2-test", "serving"],
    "/nodes/node-01/": ["node-01", "127.0.0.1:9401", "Sessions pinned here", "s-shown"],
    "/packages/": ["smollm2-test", "Q4_1", "2048"],
    "/routing/": ["Policy", "Routing table", "s-shown", "node-01"],
    "/routing/table/": ["s-shown", "node-01", "smollm2-test"],
    "/utilization/": ["Utilization", "waiting for the first sample"],
    "/playground/": ["Playground", "smollm2-test (1 up"],
    "/config/": ["Config as a file", "node-01", "127.0.0.1:9401"],
    "/config/phalanx.yaml": [
        "id: node-01",
        "address: '127.0.0.1:9401'",
        "package: 'smollm2-test:1'",
    ],
    "/audit/": ["Audit"],
}
assert set(PAGE_SHOWS) >= set(PAGES)


@pytest.mark.parametrize("path", PAGE_SHOWS)
def test_it_shows_every_page_to_a_viewer(login, node, path):
    SessionRoute.objects.create(session_id="s-shown", node=node, package=node.package, turns=3)
    response = login("viewer").get(path)
    assert response.status_code == 200
    text = visible_text(response)
    missing = [words for words in PAGE_SHOWS[path] if words not in text]
    assert not missing, f"{path} does not show {missing}: {text[:2000]}"


def test_the_node_page_shows_the_host_ram_kept_for_idle_sessions(login, node):
    assert "Host RAM for idle sessions —" in visible_text(login("viewer").get("/nodes/node-01/"))
    node.last_seen_load = {"load": 0.1, "host_ram": 50 * 2**20, "host_ram_budget": 3 * 2**30}
    node.save()
    text = visible_text(login("viewer").get("/nodes/node-01/"))
    assert "Host RAM for idle sessions 50.0 of 3072 MiB" in text


def test_it_shows_nothing_to_a_user_without_a_role(login, node):
    assert login("nobody").get("/").status_code == 403


def test_it_shows_a_session_and_its_decisions(login, node):
    route = SessionRoute.objects.create(session_id="s-1", node=node, turns=2)
    RouteDecision.objects.create(
        route=route,
        action="placed",
        node_id="node-01",
        reason="placed on node-01: lowest load 0 of 1 candidates",
    )
    page = login("viewer").get("/sessions/s-1/").content.decode()
    assert "lowest load 0 of 1 candidates" in page
    assert login("viewer").get("/sessions/nope/").status_code == 404
    assert login("viewer").post("/sessions/s-1/release/").status_code == 403
    assert login("operator").post("/sessions/s-1/release/").status_code == 302
    assert SessionRoute.objects.get(session_id="s-1").node is None


def test_it_hides_drain_from_a_viewer_and_refuses_it(login, node):
    page = login("viewer").get("/nodes/node-01/").content.decode()
    assert 'data-action="drain"' not in page
    assert login("viewer").post("/nodes/node-01/drain/").status_code == 403
    assert Node.objects.get(node_id="node-01").state == "up"


def test_it_drains_and_undrains_from_the_node_page(login, node):
    client = login("operator")
    assert 'data-action="drain"' in client.get("/nodes/node-01/").content.decode()
    assert client.post("/nodes/node-01/drain/").status_code == 302
    assert Node.objects.get(node_id="node-01").state == "draining"
    client.post("/nodes/node-01/undrain/", {"next": "/nodes/"})
    assert Node.objects.get(node_id="node-01").state == "unknown"


def test_it_adds_edits_and_removes_a_node_as_admin(login, package):
    client = login("admin")
    response = client.post(
        "/nodes/",
        {
            "add-node_id": "node-07",
            "add-address": "127.0.0.7:9407",
            "add-package": package.pk,
            "add-weight": "1",
            "add-threads": "1",
            "add-affinity": "on",
        },
    )
    assert response.status_code == 302 and response.url == "/nodes/node-07/"
    bad = client.post(
        "/nodes/",
        {"add-node_id": "node-08", "add-address": "nowhere", "add-weight": "1", "add-threads": "1"},
    )
    assert bad.status_code == 400 and "host:port" in bad.content.decode()
    client.post(
        "/nodes/node-07/edit/", {"address": "127.0.0.7:9408", "weight": "3", "threads": "1"}
    )
    assert Node.objects.get(node_id="node-07").weight == 3
    client.post("/nodes/node-07/remove/")
    assert not Node.objects.filter(node_id="node-07").exists()


def test_it_refuses_node_changes_below_admin(login, node):
    client = login("operator")
    assert (
        client.post("/nodes/", {"add-node_id": "n", "add-address": "1.1.1.1:1"}).status_code == 403
    )
    assert client.get("/nodes/node-01/edit/").status_code == 403
    assert client.post("/nodes/node-01/remove/").status_code == 403


def test_it_edits_the_policy_as_operator_only(login):
    from django.forms.models import model_to_dict

    current = model_to_dict(RoutingPolicy.load(), exclude=["id", "updated_at"])
    form = {**current, "session_header": "X-Agent-Session", "health_interval_s": "2"}
    assert login("viewer").post("/routing/", form).status_code == 403
    response = login("operator").post("/routing/", form)
    assert response.status_code == 302, response.context["form"].errors
    assert RoutingPolicy.load().session_header == "X-Agent-Session"
    bad = login("operator").post("/routing/", {**form, "health_interval_s": "0"})
    assert bad.status_code == 400


def test_it_creates_a_token_shown_once_and_revokes_it(login):
    client = login("admin")
    page = client.post("/tokens/", {"name": "ci", "role": "viewer"}).content.decode()
    assert 'id="new-token"' in page and "phx_" in page
    assert "phx_" not in client.get("/tokens/").content.decode().split("<table")[0]
    from inference.models import ApiToken

    token = ApiToken.objects.get(name="ci")
    client.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked
    assert login("operator").get("/tokens/").status_code == 403


def test_it_applies_a_config_upload_and_shows_errors(login):
    client = login("admin")
    ok = client.post("/config/", {"text": "pool:\n  nodes:\n    - {id: a, address: 127.0.0.1:1}\n"})
    assert ok.status_code == 200 and 'id="config-report"' in ok.content.decode()
    assert Node.objects.filter(node_id="a").exists()
    bad = client.post("/config/", {"text": "pool:\n  nodes:\n    - {id: b, address: x}\n"})
    assert bad.status_code == 422 and "line 3, pool.nodes[0].address" in bad.content.decode()
    assert login("operator").post("/config/", {"text": "pool: {}\n"}).status_code == 403


def test_it_shows_what_a_gguf_file_says(login, db):
    from tests.support.processes import bundled_model_path

    path = bundled_model_path()
    client = login("admin")
    response = client.post("/packages/", {"name": "smol", "version": "1", "gguf_path": str(path)})
    assert response.status_code == 302
    page = client.get(response.url).content.decode()
    assert "llama" in page and "Q4_1" in page and "135M" in page


def test_it_serves_prometheus_metrics_with_credentials(node, tokens, login):
    assert Client().get("/metrics").status_code == 401
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {tokens['viewer']}"})
    text = response.content.decode()
    assert response.status_code == 200
    assert 'phalanx_node_up{node="node-01"} 1' in text
    assert 'phalanx_routing_decisions_total{action="moved"} 0' in text
    assert "phalanx_proxy_retries_total 0" in text
    # bumped by the proxy and exposed too (they were bumped and never shown)
    assert "phalanx_proxy_node_request_errors_total 0" in text
    assert "phalanx_proxy_broken_answers_total 0" in text
    assert login("viewer").get("/metrics").status_code == 200


def test_it_serves_vendored_plotly(login):
    response = Client().get("/static/vendor/plotly.min.js")
    assert response.status_code == 200


def test_the_playground_counts_up_as_routing_does_one_family_over_its_versions(login, package):
    """Issue 28: a version's nodes count as up for the family they are served under, and only
    nodes that may take traffic count (a validating node is not up; the packages page agrees)."""
    newer = ModelPackage.objects.create(
        name="smollm2-test-q4_k_m", version="1", family="smollm2-test", gguf_path="x", sha256=""
    )
    for node_id, validation in (("node-01", "passed"), ("node-02", "validating")):
        Node.objects.create(
            node_id=node_id,
            address=f"127.0.0.1:94{node_id[-1]}0",
            package=newer,
            served_name=package.name,
            state=Node.State.UP,
            validation=validation,
        )
    text = visible_text(login("viewer").get("/playground/"))
    assert "smollm2-test (1 up: smollm2-test-q4_k_m:1 on 1)" in text
    assert "smollm2-test-q4_k_m (" not in text
    assert "New session for an answer to the question alone" in text
    packages = visible_text(login("viewer").get("/packages/"))
    assert "2 (1)" in packages  # nodes (up)


def test_the_packages_api_counts_up_as_the_playground_does(api, package):
    for node_id, validation in (("node-01", "passed"), ("node-02", "validating")):
        Node.objects.create(
            node_id=node_id,
            address=f"127.0.0.1:94{node_id[-1]}0",
            package=package,
            state=Node.State.UP,
            validation=validation,
        )
    [out] = api("viewer", "get", "/packages").json()
    assert (out["nodes"], out["up"]) == (2, 1)


def test_a_counter_nobody_registered_cannot_be_bumped():
    """A counter bumped but never exposed is a silent gap: the registry refuses it."""
    from console.lib.metrics import metric_inc

    with pytest.raises(KeyError, match="phalanx_no_such_total"):
        metric_inc("phalanx_no_such_total")
