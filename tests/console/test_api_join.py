"""Nodes joining from other hosts (issue 30): join tokens, the join endpoint, revoking a
node's credential, and the control plane's check that a node proves itself."""

from __future__ import annotations

import os
import stat
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.models import AuditEntry
from nodes.agent.joining import Joined, write_credential_file
from nodes.credentials import (
    PREFIX,
    PREFIX_EPOCH,
    credential_for,
    node_auth_headers,
    node_credential,
    node_keys,
    node_secret,
    proof_key_for,
)
from nodes.models import Node, NodeEvent, NodeJoinToken

pytestmark = pytest.mark.django_db


def mint(api, **body) -> dict:
    response = api("admin", "post", "/nodes/join-tokens", {"ttl_s": 600, **body})
    assert response.status_code == 201, response.content
    return response.json()


def join(token: str, node_id: str = "remote-1", **extra):
    body = {"join_token": token, "node_id": node_id, "address": "198.18.0.2:9401", **extra}
    return Client().post("/api/nodes/join", data=body, content_type="application/json")


def test_it_keeps_the_old_derivation_for_epoch_zero_and_another_per_epoch() -> None:
    secret = "s3cret"
    assert credential_for(secret, "n1").startswith(PREFIX)
    assert credential_for(secret, "n1", "") == credential_for(secret, "n1")
    first, second = credential_for(secret, "n1", "a1"), credential_for(secret, "n1", "b2")
    assert first.startswith(PREFIX_EPOCH) and second.startswith(PREFIX_EPOCH)
    assert len({first, second, credential_for(secret, "n1")}) == 3
    assert proof_key_for(secret, "n1", "a1") not in first  # the proof key is never sent


def test_it_mints_a_join_token_shown_once_and_keeps_only_its_hash(api) -> None:
    minted = mint(api, note="rack 4")
    token = minted["token"]
    assert token.startswith("phxj_") and minted["state"] == "unused"
    assert minted["command"].startswith(f"PHALANX_JOIN_TOKEN={token} python manage.py runnode")
    assert (
        "--join http://testserver " in minted["command"] and "--join-token" not in minted["command"]
    )
    row = NodeJoinToken.objects.get()
    assert token not in (row.token_hash, row.prefix) and row.note == "rack 4"
    listed = api("admin", "get", "/nodes/join-tokens").json()
    assert [t["prefix"] for t in listed] == [row.prefix] and "token" not in listed[0]
    assert AuditEntry.objects.filter(action="node.join_token_mint").count() == 1
    assert api("operator", "post", "/nodes/join-tokens", {}).status_code == 403
    assert api("admin", "post", "/nodes/join-tokens", {"ttl_s": 5}).json()["field"] == "ttl_s"


def test_it_joins_a_node_once_with_a_token(api) -> None:
    token = mint(api)["token"]
    response = join(token)
    assert response.status_code == 201, response.content
    grant = response.json()
    node = Node.objects.get(node_id="remote-1")
    assert node.kind == "phalanx" and node.address == "198.18.0.2:9401"
    assert node.credential_epoch and grant["epoch"] == node.credential_epoch
    assert grant["credential"] == node_credential("remote-1")
    assert grant["proof_key"] == node_keys("remote-1").proof_key
    assert node.events.filter(kind=NodeEvent.Kind.JOINED).exists()
    assert AuditEntry.objects.filter(action="node.join", target="remote-1").exists()
    again = join(token, node_id="remote-2")
    assert again.status_code == 403 and again.json()["code"] == "join_token_used"
    assert "remote-1" in again.json()["detail"]
    assert not Node.objects.filter(node_id="remote-2").exists()


def test_it_refuses_an_expired_or_unknown_token(api) -> None:
    token = mint(api)["token"]
    NodeJoinToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = join(token)
    assert expired.status_code == 403 and expired.json()["code"] == "join_token_expired"
    unknown = join("phxj_not-a-token")
    assert unknown.status_code == 401 and unknown.json()["code"] == "join_token_invalid"
    assert unknown.json()["field"] == "join_token"
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("extra", "field", "status"),
    [
        ({"node_id": "Not A Slug!"}, "node_id", 422),
        ({"address": "nowhere"}, "address", 422),
        ({"address": 7}, "address", 422),
        ({"package": "no-such-package:1"}, "package", 422),
    ],
)
def test_it_names_the_field_of_bad_join_input_and_keeps_the_token(api, extra, field, status):
    token = mint(api)["token"]
    response = join(token, **extra)
    assert response.status_code == status, response.content
    assert response.json()["field"] == field
    assert NodeJoinToken.objects.get().used_at is None
    assert join(token).status_code == 201  # the token was not spent


def test_it_refuses_a_join_as_an_existing_node_or_without_a_body(api, node) -> None:
    token = mint(api)["token"]
    taken = join(token, node_id="node-01")
    assert taken.status_code == 409 and taken.json()["field"] == "node_id"
    missing = Client().post("/api/nodes/join", data="{}", content_type="application/json")
    assert missing.status_code == 422
    broken = Client().post("/api/nodes/join", data="{", content_type="application/json")
    assert broken.status_code == 400


def test_it_revokes_a_credential_at_once(api) -> None:
    grant = join(mint(api)["token"]).json()
    Node.objects.filter(node_id="remote-1").update(state=Node.State.UP, validation="passed")
    old = {"Authorization": f"Bearer {grant['credential']}"}
    me = Client().get("/api/nodes/self?node_id=remote-1", headers=old)
    assert me.status_code == 200 and me.json()["state"] == "up"
    assert api("operator", "post", "/nodes/remote-1/revoke").status_code == 403
    revoked = api("admin", "post", "/nodes/remote-1/revoke")
    assert revoked.status_code == 200 and revoked.json()["state"] == "down"
    refused = Client().get("/api/nodes/self?node_id=remote-1", headers=old)
    assert refused.status_code == 401 and refused.json()["code"] == "node_credential_refused"
    assert node_credential("remote-1") != grant["credential"]  # no longer presented
    node = Node.objects.get(node_id="remote-1")
    assert node.events.filter(kind=NodeEvent.Kind.REVOKED).exists()
    assert AuditEntry.objects.filter(action="node.revoke_credential").exists()
    from inference.node_table import nodes_for_routing

    view = nodes_for_routing(stale_after_s=60).views[0]
    assert view.node_id == "remote-1" and view.state == "down"
    assert api("admin", "post", "/nodes/nobody/revoke").status_code == 404


def test_it_presents_the_current_epoch_without_a_query_per_call(
    api, django_assert_num_queries
) -> None:
    join(mint(api)["token"])
    from inference.node_table import nodes_for_routing

    nodes_for_routing(stale_after_s=60)  # routing's read feeds the epochs
    with django_assert_num_queries(0):
        for _ in range(20):
            headers = node_auth_headers("remote-1")
    epoch = Node.objects.get(node_id="remote-1").credential_epoch
    assert headers["Authorization"] == f"Bearer {credential_for(node_secret(), 'remote-1', epoch)}"
    assert len(headers["X-Phalanx-Challenge"]) == 32


def test_it_writes_the_credential_file_for_its_owner_only(tmp_path) -> None:
    path = tmp_path / "node.credential"
    write_credential_file(path, Joined("phx2.abc", "f00d", "0123456789abcdef"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    from nodes.agent.auth import CredentialCheck

    check = CredentialCheck(file=path)
    grant = check.grant("Bearer phx2.abc")
    assert grant is not None and grant.proof_key == "f00d"


# --- the console pages ------------------------------------------------------------------------


def test_the_page_mints_a_join_token_shown_once_with_its_command_line(login) -> None:
    admin = login("admin")
    assert 'href="/join-tokens/"' in admin.get("/nodes/").content.decode()
    page = admin.post("/join-tokens/", {"ttl_minutes": 30, "note": "rack 7"}).content.decode()
    row = NodeJoinToken.objects.get()
    assert row.note == "rack 7" and row.created_by == "admin"
    token = page.split('id="join-token">', 1)[1].split("<", 1)[0]
    assert token.startswith("phxj_") and row.token_hash not in page
    assert f"PHALANX_JOIN_TOKEN={token} python manage.py runnode --join http://testserver" in page
    again = admin.get("/join-tokens/").content.decode()
    assert token not in again and row.prefix in again  # shown once only
    assert login("operator").get("/join-tokens/").status_code == 403


def test_the_node_page_revokes_its_credential(login, api) -> None:
    join(mint(api)["token"])
    admin = login("admin")
    assert 'id="revoke-button"' in admin.get("/nodes/remote-1/").content.decode()
    before = Node.objects.get(node_id="remote-1").credential_epoch
    assert login("operator").post("/nodes/remote-1/revoke/").status_code == 403
    response = admin.post("/nodes/remote-1/revoke/", follow=True)
    node = Node.objects.get(node_id="remote-1")
    assert node.credential_epoch != before and node.state == Node.State.DOWN
    assert "refused until it joins again" in response.content.decode()


def test_a_wrong_join_token_learns_nothing_of_the_arrays_packages(package) -> None:
    for name in (package.name, "no-such-package"):
        answer = join("phxj_wrong", package=name)
        assert answer.status_code == 401, answer.content
        assert answer.json()["code"] == "join_token_invalid"
