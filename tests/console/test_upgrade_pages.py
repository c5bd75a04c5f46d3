"""The Upgrades pages with Django's test client: the history and start form (operators), a
refusal shown at its field, one upgrade's page, the Pause / Resume / Promote / Abort buttons
and what a person reads after each; viewers read and cannot act."""

from __future__ import annotations

import html
import json
import re

import pytest

from inference.models import ModelPackage, Upgrade
from inference.upgrades import services
from nodes.models import Node
from tests.console.test_pages import visible_text

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(db) -> tuple[ModelPackage, ModelPackage]:
    """smol:1 served by n1 and n2, and the approved smol:2 (trained context 4096)."""
    old = ModelPackage.objects.create(
        name="smol", version="1", gguf_path="/x/1", sha256="a" * 64, status="approved"
    )
    new = ModelPackage.objects.create(
        name="smol",
        version="2",
        gguf_path="/x/2",
        sha256="b" * 64,
        status="approved",
        context_window=4096,
    )
    for i in (1, 2):
        Node.objects.create(
            validation="passed",
            node_id=f"n{i}",
            address=f"127.0.0.1:{9700 + i}",
            package=old,
            state="up",
        )
    return old, new


def form(old: ModelPackage, new: ModelPackage, **fields) -> dict:
    data = {
        "from_package": old.pk,
        "to_package": new.pk,
        "max_unavailable": 1,
        "canary_share": 0.25,
        "bake_s": 30,
        "drain_timeout_s": 120,
        **fields,
    }
    return {f"upgrade-{k}": v for k, v in data.items()}


def test_an_operator_starts_an_upgrade_from_the_form(login, versions):
    old, new = versions
    client = login("operator")
    page = visible_text(client.get("/upgrades/"))
    assert "Start an upgrade" in page and "No upgrades yet." in page
    response = client.post("/upgrades/", form(old, new, canary_share=0.5), follow=True)
    upgrade = Upgrade.objects.get()
    assert response.redirect_chain == [(f"/upgrades/{upgrade.pk}/", 302)]
    text = visible_text(response)
    assert f"Upgrade {upgrade.pk} planned; the control loop runs it." in text
    assert f"Upgrade {upgrade.pk}: smol" in text and "smol:1 → smol:2" in text
    assert "canary 0.5" in text
    assert (upgrade.state, upgrade.settings["canary_share"]) == ("pending", 0.5)
    history = visible_text(client.get("/upgrades/"))
    assert f"{upgrade.pk} smol smol:1 smol:2 Pending" in history


def test_a_viewer_reads_the_pages_but_has_no_form_and_no_buttons(login, versions):
    old, new = versions
    upgrade = services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    viewer = login("viewer")
    history = viewer.get("/upgrades/")
    assert history.status_code == 200 and "Start an upgrade" not in visible_text(history)
    page = viewer.get(f"/upgrades/{upgrade.pk}/")
    assert page.status_code == 200
    assert 'data-action="pause"' not in page.content.decode()
    assert viewer.post("/upgrades/", form(old, new)).status_code == 403
    for action in ("pause", "resume", "promote", "abort"):
        assert viewer.post(f"/upgrades/{upgrade.pk}/{action}/").status_code == 403
    assert Upgrade.objects.get().state == "pending" and Upgrade.objects.count() == 1
    assert login("nobody").get("/upgrades/").status_code == 403


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"threads": 100_000}, 400, "Ensure this value is less than or equal to 256."),
        ({"sequences": 0}, 400, "Ensure this value is greater than or equal to 1."),
        (
            {"ctx_per_seq": 8192},
            422,
            "node_settings.ctx_per_seq: a whole number from 256 to 4096 (the package's trained "
            "context)",
        ),
        ({"bake_s": 10**6}, 422, "settings.bake_s: between 0 and 86400"),
        ({"canary_share": 2}, 400, "Ensure this value is less than or equal to 1.0."),
    ],
)
def test_a_bad_field_is_refused_at_that_field_and_nothing_is_planned(
    login, versions, fields, status, says
):
    old, new = versions
    response = login("operator").post("/upgrades/", form(old, new, **fields))
    assert response.status_code == status
    label = {
        "threads": "Threads (node setting)",
        "sequences": "Sequences (node setting)",
        "ctx_per_seq": "Context per sequence (node setting)",
        "bake_s": "Bake (s)",
        "canary_share": "Canary share",
    }[next(iter(fields))]
    at_field = re.search(f"<label>{re.escape(label)} (.*?)</label>", response.content.decode())
    assert at_field and says in html.unescape(at_field.group(1)), visible_text(response)
    assert not Upgrade.objects.exists()


def test_a_settings_only_roll_from_the_form(login, versions):
    old, _ = versions
    client = login("operator")
    same = client.post("/upgrades/", form(old, old))
    assert same.status_code == 409
    assert "smol:1 is already what those nodes serve" in visible_text(same)
    response = client.post("/upgrades/", form(old, old, threads=2, ctx_per_seq=1024))
    assert response.status_code == 302
    upgrade = Upgrade.objects.get()
    assert upgrade.node_settings == {"threads": 2, "ctx_per_seq": 1024}
    text = visible_text(client.get(f"/upgrades/{upgrade.pk}/"))
    assert "smol:1 → smol:1" in text and "threads 2, ctx_per_seq 1024" in text


def test_a_second_upgrade_of_the_model_is_refused_with_the_reason(login, versions):
    old, new = versions
    services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    response = login("operator").post("/upgrades/", form(old, new))
    assert response.status_code == 409
    assert "An upgrade of 'smol' is under way." in visible_text(response)
    assert Upgrade.objects.count() == 1


def test_the_buttons_pause_resume_promote_and_abort(login, versions):
    old, new = versions
    upgrade = services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    client = login("operator")
    url = f"/upgrades/{upgrade.pk}/"
    page = client.get(url).content.decode()
    for action in ("pause", "resume", "promote", "abort"):
        assert f'action="{url}{action}/"' in page

    def press(action: str) -> str:
        response = client.post(f"{url}{action}/", follow=True)
        assert response.redirect_chain == [(url, 302)]
        return visible_text(response)

    text = press("pause")
    assert f"Upgrade {upgrade.pk}: pause done." in text and "Paused" in text
    assert f"Upgrade {upgrade.pk} is paused; it cannot pause now." in press("pause")
    assert "Pending" in press("resume")
    press("promote")
    assert Upgrade.objects.get().promote is True
    text = press("abort")
    assert "Rolling back" in text and "aborted by operator: from the Upgrades page" in text
    assert f"Upgrade {upgrade.pk} is rolling_back; it cannot resume now." in press("resume")
    script = re.search(
        r'<script id="upgrade-events-data" type="application/json">(.*?)</script>',
        client.get(url).content.decode(),
    )
    events = json.loads(script.group(1))
    assert [e["kind"] for e in events] == ["planned", "pause", "resume", "promote", "abort"]


def test_an_unknown_upgrade_or_action_is_a_404(login, versions):
    old, new = versions
    upgrade = services.upgrade_start(from_package_id=old.pk, to_package_id=new.pk)
    client = login("operator")
    assert client.get("/upgrades/999/").status_code == 404
    assert client.post("/upgrades/999/pause/").status_code == 404
    assert client.post(f"/upgrades/{upgrade.pk}/explode/").status_code == 404
    assert client.get(f"/upgrades/{upgrade.pk}/pause/").status_code == 405
    assert Upgrade.objects.get().state == "pending"


def test_versions_not_approved_are_listed_with_their_verdict_and_the_way_to_approve(
    login, versions
):
    """Issue 28: "To (approved)" alone was a dead end; the versions that cannot be rolled
    out yet are listed with their gate's verdict and a link to the package page's approve
    form (with a reason when the gate has not passed)."""
    rejected = ModelPackage.objects.create(
        name="smol",
        version="3",
        gguf_path="/x/3",
        sha256="c" * 64,
        status="rejected",
        gate={"passed": False, "summary": "failed: tool_accuracy 0.31 < 0.50"},
    )
    ModelPackage.objects.create(name="smol", version="4", gguf_path="/x/4", sha256="d" * 64)
    response = login("operator").get("/upgrades/")
    text = visible_text(response)
    assert "Versions not approved yet" in text
    assert "smol:3 Rejected failed: tool_accuracy 0.31 < 0.50 Approve with a reason →" in text
    assert "smol:4 Draft not evaluated Approve with a reason →" in text
    assert f'href="/packages/{rejected.pk}/#approve-form"' in response.content.decode()


def test_an_upgrade_to_an_overridden_version_says_so_and_takes_the_no_traffic_rule(login, versions):
    old, new = versions
    ModelPackage.objects.filter(pk=new.pk).update(
        status_reason="override: tool calls checked by hand",
        gate={"passed": False, "summary": "failed: perplexity +12%"},
    )
    client = login("operator")
    response = client.post("/upgrades/", form(old, new, no_traffic="proceed"), follow=True)
    upgrade = Upgrade.objects.get()
    assert upgrade.settings["no_traffic"] == "proceed"
    text = visible_text(response)
    assert (
        "smol:2 was approved over its gate (failed: perplexity +12%): override “tool calls "
        "checked by hand”." in text
    )
    assert "a bake that compares nothing: proceed" in text
