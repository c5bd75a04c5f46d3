"""The Prefixes page and ``/api/prefixes``: what a viewer reads (a registered prefix and the
nodes holding it), what an operator registers and removes, and what either refuses."""

from __future__ import annotations

import pytest

from console.models import AuditEntry
from inference.agent_prefix import agent_fingerprint
from inference.models import SharedPrefix
from nodes.models import Node

pytestmark = pytest.mark.django_db

TOOLS = [{"type": "function", "function": {"name": "ticket_open", "parameters": {}}}]
BODY = {"name": "support", "system": "You are the support agent.", "tools": TOOLS}


def test_an_operator_registers_over_the_api_and_a_viewer_sees_the_node_holding_it(
    api, node
) -> None:
    made = api("operator", "post", "/prefixes", json=BODY)
    assert made.status_code == 201, made.content
    agent = made.json()["agent"]
    assert agent == agent_fingerprint([{"role": "system", "content": BODY["system"]}], TOOLS)
    listed = api("viewer", "get", "/prefixes").json()
    assert listed[0]["waiting"] == ["node-01"] and listed[0]["held_by"] == []
    Node.objects.filter(node_id="node-01").update(last_seen_load={"prefixes": [agent]})
    assert api("viewer", "get", "/prefixes").json()[0]["held_by"] == ["node-01"]
    assert AuditEntry.objects.filter(action="prefix.register", target="support").exists()
    assert api("operator", "delete", "/prefixes/support").status_code == 204
    assert api("operator", "delete", "/prefixes/support").status_code == 404
    assert not SharedPrefix.objects.exists()


@pytest.mark.parametrize(
    "body, status, says",
    [
        ({**BODY, "tools": [{"type": "function"}]}, 422, "tools"),
        ({**BODY, "system": ""}, 422, "system"),
        ({**BODY, "name": "not a slug"}, 422, "name"),
        ({**BODY, "model": "nope"}, 422, "does not exist"),
        ({**BODY, "sytem": "typo"}, 422, "sytem"),
    ],
)
def test_the_api_refuses_bad_input_by_name(api, body, status, says) -> None:
    answer = api("operator", "post", "/prefixes", json=body)
    assert answer.status_code == status and says in answer.json()["detail"]


def test_a_viewer_cannot_register_or_remove(api, login) -> None:
    assert api("viewer", "post", "/prefixes", json=BODY).status_code == 403
    page = login("viewer").get("/prefixes/").content.decode()
    assert 'id="prefix-form"' not in page and "No prefix registered." in page
    assert login("viewer").post("/prefixes/register/", BODY).status_code == 403


def test_the_page_registers_and_shows_what_it_refused(login, node) -> None:
    operator = login("operator")
    bad = operator.post("/prefixes/register/", {**BODY, "tools": '{"not": "a list"}'})
    assert bad.status_code == 400 and "Tools must be a JSON list" in bad.content.decode()
    done = operator.post(
        "/prefixes/register/",
        {**BODY, "tools": '[{"type": "function", "function": {"name": "t"}}]'},
    )
    assert done.status_code == 302
    page = operator.get("/prefixes/").content.decode()
    assert 'data-prefix="support"' in page and "node-01" in page and "none yet" in page
    twice = operator.post("/prefixes/register/", {**BODY, "tools": "[]"})
    assert twice.status_code == 400 and "registered already" in twice.content.decode()
    operator.post("/prefixes/support/remove/")
    assert "No prefix registered." in operator.get("/prefixes/").content.decode()
