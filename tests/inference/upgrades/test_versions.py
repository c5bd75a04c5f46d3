"""Sessions keep their package version while an upgrade mixes versions under one model name:
routing (pure) and the routing table (``route_plan`` + ``route_record``)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from inference import services
from inference.models import ModelPackage, RoutingPolicy, SessionRoute
from inference.node_table import nodes_for_routing
from inference.routing import NodeView, Rollout, route_request, version_for_new_session
from nodes.models import Node

M = "smol"


def view(node_id: str, package_id: int, load: float = 0.0) -> NodeView:
    return NodeView(
        node_id=node_id, state="up", weight=1.0, load=load, model=M, package_id=package_id
    )


def test_a_session_stays_on_its_version_while_a_node_of_it_is_up():
    nodes = [view("old-1", 1, load=0.9), view("new-1", 2, load=0.0)]
    assert route_request(nodes, model=M, version=1).node_id == "old-1"
    assert route_request(nodes, model=M, version=2).node_id == "new-1"
    assert route_request(nodes, model=M).node_id == "new-1"  # no version: the least loaded
    only_new = [view("new-1", 2)]
    assert route_request(only_new, model=M, version=1).node_id == "new-1"  # none left: moves


def test_new_sessions_split_by_the_rollouts_share_and_always_the_same_way():
    rollout = Rollout(old_package_id=1, new_package_id=2, new_share=0.25)
    picks = [version_for_new_session(f"s-{i}", rollout) for i in range(2000)]
    assert 0.2 < picks.count(2) / len(picks) < 0.3
    assert all(version_for_new_session(f"s-{i}", rollout) == picks[i] for i in range(50))
    assert {version_for_new_session(f"s-{i}", Rollout(1, 2, 0.0)) for i in range(50)} == {1}
    assert {version_for_new_session(f"s-{i}", Rollout(1, 2, 1.0)) for i in range(50)} == {2}


@pytest.mark.django_db
def test_the_routing_table_counts_a_turn_served_by_another_version():
    old = ModelPackage.objects.create(name=M, version="1", gguf_path="/o", sha256="a" * 64)
    new = ModelPackage.objects.create(name="smol-new", version="1", gguf_path="/n", sha256="b" * 64)
    now = timezone.now()
    a = Node.objects.create(
        validation="passed",
        node_id="a",
        address="127.0.0.1:1",
        package=old,
        state="up",
        last_probe_at=now,
    )
    Node.objects.create(
        validation="passed",
        node_id="b",
        address="127.0.0.1:2",
        package=new,
        served_name=M,
        state="up",
        last_probe_at=now,
    )
    policy = RoutingPolicy.load()

    def turn(session: str, rollout=None):
        row = services.route_read(session_id=session)
        table = nodes_for_routing(stale_after_s=60)
        target = services.route_plan(
            session_id=session, row=row, table=table, model=M, policy=policy, rollout=rollout
        )
        services.route_record(target.record)
        return target.node_id

    assert turn("s1", Rollout(old.pk, new.pk, 0.0)) == "a"  # the share sends it to old
    assert {turn("s1", Rollout(old.pk, new.pk, 1.0)) for _ in range(3)} == {"a"}  # and it stays
    a.state = "draining"
    a.save()
    before_move = timezone.now()
    assert turn("s1") == "b"  # its version has no node left: it moves, and it is counted
    route = SessionRoute.objects.get(session_id="s1")
    assert route.version_changes == 1 and route.package == new
    assert route.decisions.filter(action="version_changed").exists()
    assert turn("s2", Rollout(old.pk, new.pk, 1.0)) == "b"
    assert SessionRoute.objects.get(session_id="s2").version_changes == 0
    assert route.last_seen_at >= before_move  # the moved turn counts as the session's last


def test_a_version_whose_nodes_are_all_full_is_a_preference_not_a_wall():
    from dataclasses import replace

    full_old = replace(view("old-1", 1), sessions=2, max_sessions=2)
    nodes = [full_old, view("new-1", 2, load=0.5)]
    assert route_request(nodes, model=M, version=1).node_id == "new-1"
