"""REST tests of the admin API: every endpoint, its permissions and its bad inputs."""

from __future__ import annotations

import pytest
import yaml
from django.test import Client

from console.models import TokenRole
from inference.models import ApiToken, ModelPackage
from nodes.models import Node, NodeEvent

pytestmark = pytest.mark.django_db

NEW_NODE = {"node_id": "node-09", "address": "127.0.0.9:9409", "weight": 2, "affinity": False}


# --- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/nodes", "/packages", "/tokens", "/config", "/me", "/utilization", "/nodes/node-01/events"],
)
def test_it_refuses_calls_without_credentials(api, node, path):
    response = api(None, "get", path)
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/nodes"),
        ("post", "/api/nodes/node-01/drain"),
        ("put", "/api/routing/policy"),
        ("post", "/api/config"),
        ("delete", "/api/tokens/1"),
    ],
)
def test_it_answers_401_not_csrf_403_to_an_anonymous_change(node, method, path):
    client = Client(enforce_csrf_checks=True)
    response = getattr(client, method)(path, data="{}", content_type="application/json")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_checks_the_role_before_the_body(api, package):
    bad = {"node_id": "Not A Slug!", "address": "nowhere"}
    for role in ("viewer", "operator"):
        response = api(role, "post", "/nodes", bad)
        assert response.status_code == 403, role
        assert response.json()["code"] == "forbidden"
    assert api("admin", "post", "/nodes", bad).status_code == 422


def test_it_serves_the_openapi_schema_and_docs_to_a_token(api, tokens):
    bearer = {"Authorization": f"Bearer {tokens['viewer']}"}
    schema = Client().get("/api/openapi.json", headers=bearer)
    assert schema.status_code == 200 and "/api/nodes" in schema.json()["paths"]
    docs = Client().get("/api/docs", headers=bearer)
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    assert b"cdn.jsdelivr.net" not in docs.content and b"/static/ninja/" in docs.content
    wrong = Client().get("/api/openapi.json", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert Client().get("/api/openapi.json").status_code == 302  # a browser: to the login form


def test_it_names_each_operation_by_its_function_once(api, tokens):
    bearer = {"Authorization": f"Bearer {tokens['viewer']}"}
    paths = Client().get("/api/openapi.json", headers=bearer).json()["paths"]
    ids = [op["operationId"] for methods in paths.values() for op in methods.values()]
    assert len(ids) == len(set(ids))  # a client generator needs each one unique
    assert paths["/api/nodes"]["get"]["operationId"] == "nodes_list"  # no module path in it
    assert not [i for i in ids if i.startswith(("inference_", "console_", "nodes_api"))]


@pytest.mark.parametrize("path", ["/api/docs", "/api/openapi.json"])
def test_it_serves_the_docs_to_a_logged_in_role_and_refuses_a_user_in_none(login, path):
    assert login("viewer").get(path).status_code == 200
    assert login("nobody").get(path).status_code == 403


def test_it_refuses_a_revoked_token(api, tokens):
    ApiToken.objects.filter(name="t-admin").update(revoked=True)
    assert api("admin", "get", "/nodes").status_code == 401


def test_it_says_who_is_calling(api, login):
    assert api("operator", "get", "/me").json() == {"name": "token:t-operator", "role": "operator"}
    assert login("viewer").get("/api/me").json() == {"name": "viewer", "role": "viewer"}


def test_it_gives_a_token_without_a_role_row_the_operator_role(api, tokens):
    TokenRole.objects.filter(token__name="t-viewer").delete()
    assert api("viewer", "get", "/me").json()["role"] == "operator"


def test_it_treats_the_environment_token_as_admin(monkeypatch, db):
    monkeypatch.setenv("PHALANX_API_TOKEN", "env-secret")
    response = Client().get("/api/me", headers={"Authorization": "Bearer env-secret"})
    assert response.json()["role"] == "admin"


@pytest.mark.parametrize("path", ["/api/nodes", "/api/me", "/metrics"])
def test_it_refuses_a_user_without_a_role(login, path):
    assert login("nobody").get(path).status_code == 403


def test_it_checks_csrf_for_a_logged_in_user(users, node):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["admin"])
    assert client.post("/api/nodes/node-01/drain").status_code == 403
    assert Node.objects.get(node_id="node-01").state == Node.State.UP


# --- nodes ----------------------------------------------------------------------------------


def test_it_lists_and_shows_nodes(api, node):
    listed = api("viewer", "get", "/nodes").json()
    assert [n["node_id"] for n in listed] == ["node-01"]
    assert listed[0]["package"] == "smollm2-test:1"
    shown = api("viewer", "get", "/nodes/node-01").json()
    assert shown["address"] == "127.0.0.1:9401" and shown["state"] == "up"


def test_it_answers_404_for_an_unknown_node(api, db):
    response = api("viewer", "get", "/nodes/nope")
    assert response.status_code == 404 and response.json()["code"] == "node_not_found"


def test_it_registers_a_node_as_admin(api, package):
    response = api("admin", "post", "/nodes", {**NEW_NODE, "package": "smollm2-test"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "unknown" and body["weight"] == 2 and body["affinity"] is False
    assert body["package"] == "smollm2-test:1"
    assert NodeEvent.objects.filter(node__node_id="node-09", kind="registered").exists()


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_it_forbids_registering_a_node_below_admin(api, role):
    response = api(role, "post", "/nodes", NEW_NODE)
    assert response.status_code == 403 and response.json()["code"] == "forbidden"
    assert not Node.objects.filter(node_id="node-09").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"address": "not an address"}, "address"),
        ({"weight": -1}, "weight"),
        ({"cpu_set": "0-a"}, "cpu_set"),
        ({"node_id": "has space"}, "node_id"),
        ({"package": "nope:1"}, "package"),
        ({"package_id": 999}, "package_id"),
        ({"weight": "heavy"}, "weight"),
    ],
)
def test_it_names_the_bad_field_of_a_new_node(api, package, change, field):
    response = api("admin", "post", "/nodes", {**NEW_NODE, **change})
    assert response.status_code == 422, response.content
    assert response.json()["field"] == field


def test_it_refuses_a_duplicate_node(api, node):
    response = api("admin", "post", "/nodes", {**NEW_NODE, "node_id": "node-01"})
    assert response.status_code == 409 and response.json()["code"] == "node_exists"


def test_it_puts_a_node_idempotently(api, package):
    first = api("admin", "put", "/nodes/node-09", NEW_NODE)
    second = api("admin", "put", "/nodes/node-09", NEW_NODE)
    assert (first.status_code, second.status_code) == (201, 200)
    assert Node.objects.filter(node_id="node-09").count() == 1
    mismatch = api("admin", "put", "/nodes/node-08", NEW_NODE)
    assert mismatch.status_code == 422 and mismatch.json()["field"] == "node_id"


def test_it_patches_a_node(api, node):
    response = api("admin", "patch", "/nodes/node-01", {"weight": 5, "affinity": False})
    assert response.status_code == 200
    node.refresh_from_db()
    assert (node.weight, node.affinity, node.state) == (5, False, "up")
    moved = api("admin", "patch", "/nodes/node-01", {"address": "127.0.0.2:9401"}).json()
    assert moved["state"] == "unknown"
    assert api("operator", "patch", "/nodes/node-01", {"weight": 1}).status_code == 403
    assert api("admin", "patch", "/nodes/node-01", {"address": "x"}).status_code == 422
    assert api("admin", "patch", "/nodes/nope", {"weight": 1}).status_code == 404


def test_it_removes_a_node(api, node):
    assert api("operator", "delete", "/nodes/node-01").status_code == 403
    assert api("admin", "delete", "/nodes/node-01").status_code == 204
    assert not Node.objects.exists()
    assert api("admin", "delete", "/nodes/node-01").status_code == 404


def test_it_drains_and_undrains_as_operator(api, node):
    assert api("viewer", "post", "/nodes/node-01/drain").status_code == 403
    drained = api("operator", "post", "/nodes/node-01/drain")
    assert drained.status_code == 200 and drained.json()["state"] == "draining"
    undrained = api("operator", "post", "/nodes/node-01/undrain")
    assert undrained.json()["state"] == "unknown"
    kinds = [e["kind"] for e in api("viewer", "get", "/nodes/node-01/events").json()]
    assert kinds[:2] == ["undrained", "drained"]
    assert api("operator", "post", "/nodes/nope/drain").status_code == 404


def test_it_limits_the_event_list(api, node):
    assert api("viewer", "get", "/nodes/node-01/events?limit=0").status_code == 422
    assert api("viewer", "get", "/nodes/node-01/events?limit=x").status_code == 422
    assert api("viewer", "get", "/nodes/nope/events").status_code == 404


# --- packages -------------------------------------------------------------------------------


def test_it_lists_and_shows_packages(api, node, package):
    listed = api("viewer", "get", "/packages").json()
    assert listed[0]["key"] == "smollm2-test:1" and listed[0]["nodes"] == 1
    shown = api("viewer", "get", f"/packages/{package.pk}").json()
    assert shown["gguf"]["exists"] is False and "not on this host" in shown["gguf"]["error"]
    assert api("viewer", "get", "/packages/999").status_code == 404


@pytest.mark.model
def test_it_registers_a_gguf_file(api, tmp_path, settings):
    from inference.packages.gguf_files import write_with_chat_template
    from tests.support.processes import bundled_model_path

    settings.VAR_DIR = tmp_path / "home"
    missing = api(
        "admin",
        "post",
        "/packages",
        {"name": "m", "version": "1", "gguf_path": str(tmp_path / "x.gguf")},
    )
    assert missing.status_code == 422 and missing.json()["field"] == "gguf_path"
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"not really gguf")
    body = {"name": "tiny", "version": "1", "gguf_path": str(path)}
    not_gguf = api("admin", "post", "/packages", body)
    assert not_gguf.status_code == 400 and not_gguf.json()["code"] == "not_gguf"
    body["gguf_path"] = str(bundled_model_path())
    assert api("operator", "post", "/packages", body).status_code == 403
    assert api("admin", "post", "/packages", body).status_code == 201
    assert api("admin", "post", "/packages", body).status_code == 200
    write_with_chat_template(bundled_model_path(), path, "{{ messages }}")
    conflict = api("admin", "post", "/packages", {**body, "gguf_path": str(path)})
    assert conflict.status_code == 409 and conflict.json()["code"] == "package_conflict"
    bad = api("admin", "post", "/packages", {**body, "name": "no spaces allowed"})
    assert bad.status_code == 422 and bad.json()["field"] == "name"


def test_it_removes_only_unused_packages(api, node, package):
    in_use = api("admin", "delete", f"/packages/{package.pk}")
    assert in_use.status_code == 409 and in_use.json()["code"] == "package_in_use"
    node.delete()
    assert api("operator", "delete", f"/packages/{package.pk}").status_code == 403
    assert api("admin", "delete", f"/packages/{package.pk}").status_code == 204
    assert not ModelPackage.objects.exists()


# --- tokens ---------------------------------------------------------------------------------


def test_it_creates_a_token_shown_once_with_its_role(api):
    created = api("admin", "post", "/tokens", {"name": "ci", "role": "viewer"})
    assert created.status_code == 201
    body = created.json()
    assert body["token"].startswith("phx_") and body["role"] == "viewer"
    listed = api("admin", "get", "/tokens").json()
    assert all("token" not in t for t in listed)
    assert {"name": "ci", "role": "viewer"}.items() <= next(
        t for t in listed if t["name"] == "ci"
    ).items()
    as_new = Client().get("/api/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert as_new.json()["role"] == "viewer"


def test_it_revokes_a_token(api):
    body = api("admin", "post", "/tokens", {"name": "ci", "role": "admin"}).json()
    revoked = api("admin", "delete", f"/tokens/{body['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    again = Client().get("/api/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert again.status_code == 401
    assert api("admin", "delete", "/tokens/999").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"name": "", "role": "viewer"},
        {"name": "x", "role": "root"},
        {"role": "viewer"},
        {"name": "x" * 101},
    ],
)
def test_it_refuses_a_bad_token_request(api, body):
    assert api("admin", "post", "/tokens", body).status_code == 422


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_it_keeps_tokens_to_admins(api, role):
    assert api(role, "get", "/tokens").status_code == 403
    assert api(role, "post", "/tokens", {"name": "x", "role": "admin"}).status_code == 403
    assert api(role, "delete", "/tokens/1").status_code == 403


# --- config, utilization --------------------------------------------------------------------

CONFIG = """\
server: {listen: 127.0.0.1:9391, routing_key_header: X-Session-Id}
pool:
  nodes:
    - {id: node-01, address: 127.0.0.11:9391, weight: 10, affinity: true}
  health_check_interval_ms: 5000
  failover_strategy: stick_and_redirect
"""


def test_it_applies_and_exports_config(api):
    applied = api("admin", "post", "/config", data=CONFIG, content_type="application/yaml")
    assert applied.status_code == 200, applied.content
    assert applied.json()["created"] == ["node-01"]
    again = api("admin", "post", "/config", {"yaml": CONFIG})
    assert again.json()["changed"] is False and again.json()["unchanged"] == ["node-01"]
    exported = api("viewer", "get", "/config").json()["yaml"]
    written = yaml.safe_load(exported)["pool"]["nodes"]
    for node, given in zip(written, yaml.safe_load(CONFIG)["pool"]["nodes"], strict=True):
        assert node | given == node  # the file's keys, same values (and every other setting)
    raw = api("viewer", "get", "/config?format=yaml")
    assert raw["Content-Type"].startswith("application/yaml") and raw.content.decode() == exported


def test_it_dry_runs_config(api):
    report = api("admin", "post", "/config?dry_run=true", {"yaml": CONFIG}).json()
    assert report["dry_run"] is True and report["created"] == ["node-01"]
    assert not Node.objects.exists()


def test_it_names_line_and_field_of_a_config_error(api):
    bad = CONFIG.replace("127.0.0.11:9391", "nowhere")
    response = api("admin", "post", "/config", {"yaml": bad})
    assert response.status_code == 422
    assert response.json()["line"] == 4 and response.json()["field"] == "pool.nodes[0].address"
    assert "line 4, pool.nodes[0].address" in response.json()["detail"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"json": {"nope": 1}},
        {"data": "{", "content_type": "application/json"},
        {"data": "x", "content_type": "image/png"},
    ],
)
def test_it_refuses_a_malformed_config_body(api, kwargs):
    assert api("admin", "post", "/config", **kwargs).status_code == 422


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_it_keeps_config_apply_to_admins(api, role):
    assert api(role, "post", "/config", {"yaml": CONFIG}).status_code == 403


def test_it_serves_the_utilization_history(api):
    assert api("viewer", "get", "/utilization").json() == {"snapshots": []}


@pytest.mark.parametrize(
    ("path", "raw", "status"),
    [
        ("/api/tokens", '{"name": "\\ud800", "role": "viewer"}', 400),
        ("/api/tokens", '{"name": "x", "role": "viewer", "n": NaN}', 400),
        ("/api/config", '{"yaml": "' + "[" * 5000 + '"}', 422),
        ("/api/config", "[" * 5000, 422),
    ],
)
def test_it_answers_a_hostile_body_with_a_4xx_not_a_500(api, tokens, path, raw, status):
    content_type = "application/yaml" if raw.startswith("[") else "application/json"
    response = Client().post(
        path,
        raw,
        content_type=content_type,
        headers={"Authorization": f"Bearer {tokens['admin']}"},
    )
    assert response.status_code == status, response.content


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        ('{"health_interval_s": 1e309}', 400, None),  # took the whole array down once
        ('{"health_interval_s": 1e9}', 422, "health_interval_s"),
        ('{"session_header": "Host"}', 422, "session_header"),
    ],
)
def test_it_keeps_the_policy_within_bounds(tokens, raw, status, field):
    response = Client().put(
        "/api/routing/policy",
        raw,
        content_type="application/json",
        headers={"Authorization": f"Bearer {tokens['operator']}"},
    )
    assert response.status_code == status, response.content
    assert response.json().get("field") == field
    from inference.models import RoutingPolicy

    policy = RoutingPolicy.load()
    assert policy.health_interval_s == 5.0 and policy.session_header == "X-Session-Id"


def test_every_change_leaves_a_record_of_who_and_what(api, node, tokens):
    assert api("operator", "post", "/nodes/node-01/drain").status_code == 200
    assert api("operator", "put", "/routing/policy", {"max_attempts": 4}).status_code == 200
    assert api("admin", "patch", "/nodes/node-01", {"weight": 3}).status_code == 200
    entries = api("viewer", "get", "/audit").json()
    seen = [(e["actor"], e["action"], e["target"]) for e in entries]
    assert ("token:t-operator", "node.drain", "node-01") in seen
    assert ("token:t-admin", "node.update", "node-01") in seen
    policy = next(e for e in entries if e["action"] == "policy.update")
    assert policy["actor"] == "token:t-operator" and policy["changes"] == [
        "max_attempts: 3 \u2192 4"
    ]
    update = next(e for e in entries if e["action"] == "node.update")
    assert "weight: 1.0 \u2192 3.0" in update["changes"]
    assert api("viewer", "get", "/audit?action=policy.").json()[0]["action"] == "policy.update"


def test_the_django_admin_shows_but_does_not_change(node):
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    page = client.get(f"/admin/nodes/node/{node.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert client.post(f"/admin/nodes/node/{node.pk}/change/", {"weight": 9}).status_code == 403
    assert client.get("/admin/nodes/node/add/").status_code == 403


def test_it_registers_an_external_node_with_its_model_and_its_validation_waived(api):
    bare = {"node_id": "gpu-1", "kind": "external", "address": "127.0.0.1:9701"}
    refused = api("admin", "put", "/nodes/gpu-1", bare)
    assert refused.status_code == 422 and refused.json()["field"] == "served_name"
    created = api("admin", "put", "/nodes/gpu-1", {**bare, "served_name": "llama-70b"})
    assert created.status_code == 201, created.content
    node = created.json()
    assert (node["kind"], node["served_name"], node["validation"]) == (
        "external",
        "llama-70b",
        "waived",
    )
    assert "not Phalanx's to validate" in node["validation_reason"]
    wrong = api("admin", "patch", "/nodes/gpu-1", {"kind": "gpu"})
    assert wrong.status_code == 422 and wrong.json()["field"] == "kind"
