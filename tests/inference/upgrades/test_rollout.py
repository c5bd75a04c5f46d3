"""Live routing during an upgrade: new sessions land on the new version at the upgrade's share
(``lookups.rollout_for`` read by ``services.route_resolve`` and by the proxy), existing
sessions keep the version they started on. The split is a stable hash of the session key
(``routing.version_for_new_session``), so which sessions go where is known exactly."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from inference import lookups, services
from inference.models import ModelPackage, SessionRoute, Upgrade
from inference.routing import Rollout, version_for_new_session
from nodes.models import Node

M = "smol"
SESSIONS = [f"agent-{i}" for i in range(400)]


def up(node_id: str, package: ModelPackage, port: int, **fields) -> Node:
    row = {
        "validation": "passed",
        "node_id": node_id,
        "address": f"127.0.0.1:{port}",
        "package": package,
        "served_name": M,
        "state": "up",
        "last_probe_at": timezone.now(),
        "last_seen_load": {"load": 0.0, "active": 0, "queue": 0},
    }
    return Node.objects.create(**{**row, **fields})


def running(old: ModelPackage, new: ModelPackage, share: float) -> Upgrade:
    """An upgrade of ``M`` under way, sending ``share`` of new sessions to ``new``."""
    upgrade = Upgrade.objects.filter(model=M).first()
    if upgrade is None:
        upgrade = Upgrade(model=M, from_package=old, to_package=new, nodes=[])
    upgrade.state, upgrade.new_share = Upgrade.State.RUNNING, share
    upgrade.save()
    return upgrade


def node_of(session_id: str) -> str:
    return services.route_resolve(session_id=session_id, model=M).node_id


@pytest.fixture
def versions(db):
    old = ModelPackage.objects.create(name=M, version="1", gguf_path="/o", sha256="a" * 64)
    new = ModelPackage.objects.create(name=M, version="2", gguf_path="/n", sha256="b" * 64)
    return old, new


@pytest.mark.django_db
def test_new_sessions_during_a_canary_land_on_the_new_version_at_its_share(versions):
    old, new = versions
    up("old-1", old, 9501)
    up("new-1", new, 9502)
    running(old, new, 0.25)
    landed = {sid: node_of(sid) for sid in SESSIONS}
    on_new = {sid for sid, node in landed.items() if node == "new-1"}
    chosen = {
        s for s in SESSIONS if version_for_new_session(s, Rollout(old.pk, new.pk, 0.25)) == new.pk
    }
    assert on_new == chosen  # each session where its hash bucket puts it
    assert set(landed.values()) == {"old-1", "new-1"}
    # 400 sha256 buckets against 0.25: 100 expected, 3 sigma is 26
    assert 74 <= len(on_new) <= 126, len(on_new)
    routes = SessionRoute.objects.filter(session_id__in=on_new)
    assert {r.package_id for r in routes} == {new.pk}


@pytest.mark.django_db
def test_existing_sessions_keep_their_version_whatever_the_share(versions):
    old, new = versions
    old_1 = up("old-1", old, 9501)
    up("new-1", new, 9502, state="draining")  # being switched: takes no new session
    before = [f"before-{i}" for i in range(40)]
    assert {node_of(sid) for sid in before} == {"old-1"}
    Node.objects.filter(node_id="new-1").update(state="up", last_seen_load={"load": 0.9})
    for share in (0.25, 1.0):
        running(old, new, share)
        assert {node_of(sid) for sid in before} == {"old-1"}, share
    # promoted: every new session goes to the new version, though its node is the busier
    assert {node_of(f"after-{i}") for i in range(20)} == {"new-1"}
    routes = SessionRoute.objects.filter(session_id__in=before)
    assert {(r.node_id, r.package_id, r.version_changes) for r in routes} == {(old_1.pk, old.pk, 0)}


@pytest.mark.django_db
def test_a_rollback_sends_every_new_session_to_the_old_version(versions):
    old, new = versions
    up("old-1", old, 9501)
    up("new-1", new, 9502)
    running(old, new, 0.25)
    canaries = [s for s in SESSIONS[:80] if node_of(s) == "new-1"]
    assert canaries  # some sessions started on the new version
    upgrade = running(old, new, 0.0)
    upgrade.state = Upgrade.State.ROLLING_BACK
    upgrade.save()
    lookups.clear()
    assert {node_of(s) for s in SESSIONS[80:160]} == {"old-1"}
    assert {node_of(s) for s in canaries} == {"new-1"}  # while its node serves, it stays


@pytest.mark.django_db
def test_without_an_upgrade_under_way_new_sessions_go_by_load_alone(versions):
    old, new = versions
    up("old-1", old, 9501, weight=1.0)
    up("new-1", new, 9502)
    Node.objects.filter(node_id="old-1").update(last_seen_load={"load": 0.9})
    Upgrade.objects.create(
        model=M, from_package=old, to_package=new, nodes=[], state=Upgrade.State.SUCCEEDED
    )
    assert {node_of(s) for s in SESSIONS[:10]} == {"new-1"}  # the least loaded, any version


@pytest.mark.django_db(transaction=True)
async def test_the_proxy_places_new_sessions_by_the_upgrades_share(fakes, package, auth):
    """Through ``/v1/chat/completions``: node-02 serves the new version under the same name."""
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    from tests.inference.conftest import MODEL

    @sync_to_async
    def upgrade_under_way() -> Rollout:
        new = ModelPackage.objects.create(
            name=MODEL, version="2", gguf_path="/tmp/y.gguf", sha256="1" * 64
        )
        Node.objects.filter(node_id="node-02").update(package=new, served_name=MODEL)
        Upgrade.objects.create(
            model=MODEL,
            from_package=package,
            to_package=new,
            nodes=[],
            state=Upgrade.State.RUNNING,
            new_share=0.5,
        )
        lookups.clear()
        return Rollout(package.pk, new.pk, 0.5)

    rollout = await upgrade_under_way()
    client, landed = AsyncClient(), {}
    for sid in SESSIONS[:24]:
        response = await client.post(
            "/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
            content_type="application/json",
            headers={**auth, "X-Session-Id": sid},
        )
        assert response.status_code == 200
        landed[sid] = response["X-Phalanx-Node"]
    expected = {
        sid: "node-02"
        if version_for_new_session(sid, rollout) == rollout.new_package_id
        else "node-01"
        for sid in landed
    }
    assert landed == expected
    assert set(landed.values()) == {"node-01", "node-02"}
