"""What the overview, the nodes table and a node's page say of nodes that do not take
traffic (validating, starting, restarting, down), their last error, the actor of each event,
the edit form's package note, Restart by node kind and the paged pinned sessions (issue 28)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.templatetags.console_format import when_text
from inference.models import SessionRoute
from nodes.models import Node, NodeEvent
from nodes.services import node_record_restart
from tests.console.test_pages import visible_text

pytestmark = pytest.mark.django_db


def test_a_validating_node_is_not_counted_up(login, node):
    Node.objects.filter(pk=node.pk).update(validation="validating")
    text = visible_text(login("viewer").get("/"))
    assert "0 nodes serving 1 not serving yet 0 down" in text
    assert "node-01 127.0.0.1:9401 validating" in text
    assert "node-01 127.0.0.1:9401 validating" in visible_text(login("viewer").get("/nodes/"))


def test_a_serving_node_is_counted_and_weight_zero_is_standby(login, node, package):
    Node.objects.create(
        node_id="node-02", address="127.0.0.1:9402", package=package, state="up",
        validation="passed", weight=0,
    )  # fmt: skip
    text = visible_text(login("viewer").get("/"))
    assert "1 nodes serving 1 not serving yet" in text
    assert "node-01 127.0.0.1:9401 serving" in text and "node-02 127.0.0.1:9402 standby" in text


def test_a_killed_agent_shows_restarting_and_its_last_error(login, node):
    node_record_restart(
        node_id="node-01", message="node agent exited with status -9 after 40 s; restarting in 1 s"
    )
    at = NodeEvent.objects.get(kind="restarted").created_at
    text = visible_text(login("viewer").get("/"))
    assert "1 nodes with errors (last hour)" in text
    assert "node-01 127.0.0.1:9401 restarting" in text
    assert (
        "Restarted: node agent exited with status -9 after 40 s; "
        f"restarting in 1 s {when_text(at)}" in text
    )
    assert "by up" in text  # the event's actor: the embedded array's supervisor
    # back and validated: serving again, the error still its last one, no longer counted
    NodeEvent.objects.filter(kind="restarted").update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    NodeEvent.objects.create(node=node, kind="validation", message="validation 2 passed")
    text = visible_text(login("viewer").get("/"))
    assert "node-01 127.0.0.1:9401 serving" in text
    assert "0 nodes with errors (last hour)" in text
    assert "node agent exited with status -9" in text


def test_a_failing_probe_is_the_last_error_now(login, node):
    Node.objects.filter(pk=node.pk).update(
        last_probe_error="connection refused", last_probe_at=timezone.now()
    )
    text = visible_text(login("viewer").get("/nodes/node-01/"))
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.search(rf"Last error Probe failed: connection refused {stamp}", text), text


def test_node_events_name_their_actor(login, node):
    client = login("operator")
    client.post("/nodes/node-01/drain/")
    text = visible_text(client.get("/nodes/node-01/"))
    assert "Drained drained by operator by operator" in text
    assert NodeEvent.objects.get(kind="drained").actor == "operator"


def test_the_edit_form_says_the_package_is_only_recorded(login, node):
    text = visible_text(login("admin").get("/nodes/node-01/edit/"))
    assert (
        "Records the package only: it does not switch the model the node's agent has loaded" in text
    )
    assert "start an upgrade" in text
    page = login("admin").get("/nodes/node-01/edit/").content.decode()
    assert 'href="/upgrades/"' in page


def test_restart_is_offered_only_for_nodes_this_array_started(login, node, package):
    text = visible_text(login("operator").get("/nodes/node-01/"))
    assert "Restart" not in text.replace("No Restart", "")
    assert "No Restart: this array's up did not start this node's agent" in text
    Node.objects.filter(pk=node.pk).update(supervisor="up, pid 1 on here")
    page = login("operator").get("/nodes/node-01/").content.decode()
    assert 'id="restart-button"' in page and "No Restart" not in page
    assert 'id="restart-button"' not in login("viewer").get("/nodes/node-01/").content.decode()


def test_restart_drains_first_and_an_external_node_is_refused(login, node):
    client = login("operator")
    response = client.post("/nodes/node-01/restart/", follow=True)
    assert "was not started by this array's `up`: restart it where it runs" in visible_text(
        response
    )
    assert Node.objects.get(pk=node.pk).state == "up"
    Node.objects.filter(pk=node.pk).update(supervisor="up, pid 1 on here")
    response = client.post("/nodes/node-01/restart/", follow=True)
    text = visible_text(response)
    assert "Restarting node-01: drained now; its agent restarts once no stream is in flight" in text
    assert "node-01 restarting" in text
    after = Node.objects.get(pk=node.pk)
    assert (after.state, after.restart_requested_by) == ("draining", "operator")
    assert "drained by operator to restart it" in text


def test_the_pinned_sessions_are_paged_newest_first(login, node):
    now = timezone.now()
    for i in range(30):
        route = SessionRoute.objects.create(
            session_id=f"s-{i:02d}", node=node, package=node.package
        )
        SessionRoute.objects.filter(pk=route.pk).update(last_seen_at=now - timedelta(minutes=i))
    client = login("viewer")
    first = visible_text(client.get("/nodes/node-01/"))
    assert "Sessions pinned here 30, most recently seen first" in first
    assert "page 1 of 2 (1–25)" in first and "older →" in first
    assert "s-00" in first and "s-24" in first and "s-25" not in first
    second = visible_text(client.get("/nodes/node-01/?page=2"))
    assert "page 2 of 2 (26–30)" in second and "← newer" in second
    assert "s-25" in second and "s-29" in second and "s-24" not in second
