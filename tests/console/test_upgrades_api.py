"""REST tests of ``/api/upgrades``: who may do what, what a start answers (and why it is
refused), the operator's actions and the state after each, the event log and traffic samples,
a settings-only roll driven to its end (nodes simulated at the client seam)."""

from __future__ import annotations

import pytest

from inference.models import ModelPackage, Upgrade
from inference.upgrades import driver
from nodes.models import Node
from tests.inference.upgrades.fakes import FakeNodes, run_to_end

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
            address=f"127.0.0.1:{9600 + i}",
            package=old,
            state="up",
        )
    return old, new


def start(api, versions, role: str = "operator", **extra):
    old, new = versions
    body = {"from_package_id": old.pk, "to_package_id": new.pk, **extra}
    return api(role, "post", "/upgrades", body)


def test_an_operator_starts_an_upgrade_and_a_viewer_reads_it(api, versions):
    response = start(api, versions, settings={"bake_s": 5, "max_unavailable": 2})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["state"], body["model"], body["from_package"], body["to_package"]) == (
        "pending",
        "smol",
        "smol:1",
        "smol:2",
    )
    assert body["settings"]["bake_s"] == 5 and body["settings"]["canary_share"] == 0.25
    assert [(s["node_id"], s["batch"], s["state"]) for s in body["nodes"]] == [
        ("n1", 0, "waiting"),
        ("n2", 0, "waiting"),
    ]
    assert body["created_by"] == "token:t-operator" and body["new_share"] == 0.0
    shown = api("viewer", "get", f"/upgrades/{body['id']}")
    assert shown.status_code == 200 and shown.json()["state"] == "pending"
    listed = api("viewer", "get", "/upgrades")
    assert [u["id"] for u in listed.json()] == [body["id"]]
    events = api("viewer", "get", f"/upgrades/{body['id']}/events").json()
    assert [e["kind"] for e in events] == ["planned"]
    assert events[0]["message"] == (
        "smol: smol:1 \u2192 smol:2; batch 1: n1, n2; canary 25% of new sessions, bake 5 s per "
        "batch; a bake that compares nothing: pause"
    )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/upgrades", {"from_package_id": 1, "to_package_id": 2}),
        ("post", "/upgrades/1/pause", None),
        ("post", "/upgrades/1/resume", None),
        ("post", "/upgrades/1/promote", None),
        ("post", "/upgrades/1/abort", {"reason": "x"}),
    ],
)
def test_a_viewer_may_not_act_on_upgrades(api, versions, method, path, body):
    response = api("viewer", method, path, body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert not Upgrade.objects.exists()


@pytest.mark.parametrize(
    "path", ["/upgrades", "/upgrades/1", "/upgrades/1/events", "/upgrades/1/samples"]
)
def test_reading_upgrades_needs_a_credential_and_a_role(api, login, versions, path):
    assert api(None, "get", path).status_code == 401
    assert login("nobody").get(f"/api{path}").status_code == 403


def test_an_admin_may_do_what_an_operator_does(api, versions):
    response = start(api, versions, role="admin")
    assert response.status_code == 201
    assert api("admin", "post", f"/upgrades/{response.json()['id']}/pause").status_code == 200


@pytest.mark.parametrize(
    ("extra", "field", "detail"),
    [
        ({"settings": {"canary_share": 2}}, "settings.canary_share", "between 0 and 1"),
        ({"settings": {"bake_secs": 5}}, "settings.bake_secs", "not a setting"),
        ({"settings": {"bake_s": 10**6}}, "settings.bake_s", "between 0 and 86400"),
        ({"settings": {"no_traffic": "go"}}, "settings.no_traffic", "one of pause, proceed"),
        ({"settings": {"bake_s": "five"}}, "settings.bake_s", "a number"),
        (
            {"node_settings": {"threads": 100_000}},
            "node_settings.threads",
            "node_settings.threads: a whole number from 1 to 256",
        ),
        (
            {"node_settings": {"sequences": 257}},
            "node_settings.sequences",
            "node_settings.sequences: a whole number from 1 to 256",
        ),
        (
            {"node_settings": {"ctx_per_seq": 8192}},
            "node_settings.ctx_per_seq",
            "node_settings.ctx_per_seq: a whole number from 256 to 4096 (the package's "
            "trained context)",
        ),
        (
            {"node_settings": {"host_ram_mib": 2**31}},
            "node_settings.host_ram_mib",
            "node_settings.host_ram_mib: a whole number from 1 to 1048576",
        ),
        ({"node_settings": {"kv_type": 8}}, "node_settings.kv_type", "not a setting"),
        ({"node_settings": {"threads": "4"}}, "node_settings.threads", "valid integer"),
        ({"node_settings": {"threads": 2.5}}, "node_settings.threads", "valid integer"),
    ],
)
def test_a_bad_setting_is_a_422_naming_it_and_nothing_is_planned(
    api, versions, extra, field, detail
):
    response = start(api, versions, **extra)
    assert response.status_code == 422, response.json()
    body = response.json()
    assert body["field"] == field and detail in body["detail"], body
    assert not Upgrade.objects.exists()


def test_a_start_the_array_cannot_take_is_a_409_saying_why(api, versions):
    old, new = versions
    ModelPackage.objects.filter(pk=new.pk).update(status="rejected")
    refused = start(api, versions)
    assert refused.status_code == 409
    assert refused.json()["code"] == "package_not_approved"
    assert refused.json()["field"] == "to_package_id"
    assert refused.json()["detail"].startswith("smol:2 is rejected; only an approved version")
    ModelPackage.objects.filter(pk=new.pk).update(status="approved")
    same = api(
        "operator", "post", "/upgrades", {"from_package_id": old.pk, "to_package_id": old.pk}
    )
    assert same.status_code == 409 and same.json()["code"] == "same_package"
    assert start(api, versions).status_code == 201
    again = start(api, versions)
    assert again.status_code == 409
    assert again.json()["detail"] == "An upgrade of 'smol' is under way."
    missing = api(
        "operator", "post", "/upgrades", {"from_package_id": old.pk, "to_package_id": 999}
    )
    assert missing.status_code == 404


def test_pause_resume_promote_and_abort_answer_the_state_they_leave(api, versions):
    upgrade_id = start(api, versions).json()["id"]

    def act(action: str, body=None):
        return api("operator", "post", f"/upgrades/{upgrade_id}/{action}", body)

    assert act("pause").json()["state"] == "paused"
    twice = act("pause")
    assert twice.status_code == 409 and twice.json()["code"] == "upgrade_state"
    assert twice.json()["detail"] == f"Upgrade {upgrade_id} is paused; it cannot pause now."
    assert act("resume").json()["state"] == "pending"  # where it was paused
    assert act("resume").status_code == 409
    promoted = act("promote").json()
    assert promoted["promote"] is True and promoted["state"] == "pending"
    aborted = act("abort", {"reason": "wrong version"}).json()
    assert aborted["state"] == "rolling_back" and aborted["new_share"] == 0.0
    assert aborted["reason"] == "aborted by token:t-operator: wrong version"
    assert act("abort", {}).status_code == 409
    events = api("viewer", "get", f"/upgrades/{upgrade_id}/events").json()
    assert [e["kind"] for e in events] == ["planned", "pause", "resume", "promote", "abort"]
    assert events[-1]["message"] == "aborted by token:t-operator: wrong version"
    nothing = api("operator", "post", "/upgrades/999/pause")
    assert nothing.status_code == 404 and nothing.json()["code"] == "upgrade_not_found"


def test_samples_give_the_traffic_split_oldest_first(api, versions):
    upgrade_id = start(api, versions).json()["id"]
    upgrade = Upgrade.objects.get(pk=upgrade_id)
    driver.sample(upgrade)
    upgrade.new_share = 0.25
    driver.sample(upgrade)
    samples = api("viewer", "get", f"/upgrades/{upgrade_id}/samples").json()
    assert [(s["new_share"], s["old_nodes"], s["new_nodes"]) for s in samples] == [
        (0.0, 2, 0),
        (0.25, 2, 0),
    ]
    assert api("viewer", "get", "/upgrades/999/samples").status_code == 404


@pytest.fixture
def simulated(versions, monkeypatch) -> FakeNodes:
    """n1 and n2 answer the driver as nodes would (``FakeNodes``), the smoke test passes."""
    from inference.packages.evaluation.smoke import SmokeResult

    fake = FakeNodes()
    for node_id in ("n1", "n2"):
        fake.serving[node_id] = versions[0].sha256
        fake.settings[node_id] = {"threads": 1}
    for name in ("package_switch", "package_state", "probe"):
        monkeypatch.setattr(driver.node_client, name, getattr(fake, name))

    class Http:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(driver.node_client, "node_http", lambda *a, **k: Http())
    monkeypatch.setattr(
        driver, "smoke_test", lambda http: SmokeResult(True, "", [{"name": "tool_call"}])
    )
    return fake


def test_a_settings_only_roll_reloads_each_node_with_the_new_settings(api, versions, simulated):
    old, _ = versions
    response = api(
        "operator",
        "post",
        "/upgrades",
        {
            "from_package_id": old.pk,
            "to_package_id": old.pk,
            "node_settings": {"threads": 2, "sequences": 16},
            "settings": {"bake_s": 0, "no_traffic": "proceed"},
        },
    )
    assert response.status_code == 201, response.json()
    assert response.json()["node_settings"] == {"threads": 2, "sequences": 16}
    done = run_to_end(Upgrade.objects.get(pk=response.json()["id"]))
    assert done.state == "succeeded", done.reason
    assert simulated.asked_settings == [
        ("n1", {"threads": 2, "sequences": 16}),
        ("n2", {"threads": 2, "sequences": 16}),
    ]
    for node in Node.objects.all():
        assert (node.package, node.threads, node.engine_settings) == (old, 2, {"sequences": 16})
    shown = api("viewer", "get", f"/upgrades/{done.pk}").json()
    assert shown["state"] == "succeeded"
    assert {s["state"] for s in shown["nodes"]} == {"done"}
    assert shown["reason"] == "every node serves the new version"


def test_a_bake_that_compared_nothing_reads_skipped_with_the_decision(api, versions, simulated):
    """``GET /api/upgrades/{id}``: the bake's gate says ``skipped`` (never ``passed``) and
    how the upgrade went on; its events say so too."""
    body = start(api, versions, settings={"bake_s": 0, "no_traffic": "proceed"}).json()
    assert body["settings"]["no_traffic"] == "proceed"
    run_to_end(Upgrade.objects.get(pk=body["id"]))
    shown = api("viewer", "get", f"/upgrades/{body['id']}").json()
    bake = [g for g in shown["gates"] if g["gate"] == "bake"][0]
    assert (bake["verdict"], bake["passed"]) == ("skipped", False)
    assert bake["detail"].startswith("skipped: too little traffic to compare (0 requests")
    assert bake["detail"].endswith("went on by the upgrade's rule (no_traffic: proceed)")
    events = api("viewer", "get", f"/upgrades/{body['id']}/events").json()
    assert any(e["message"].startswith("bake skipped: ") for e in events)
