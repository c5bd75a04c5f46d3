"""Reads compiled once and run raw give what the ORM gives."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.lib.compiled_sql import CompiledQuery, as_datetime
from inference.models import ModelPackage, SessionRoute
from inference.node_table import nodes_for_routing, pinned_counts
from inference.services import route_read
from nodes.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def node() -> Node:
    package = ModelPackage.objects.create(name="m", version="1", gguf_path="x", sha256="")
    return Node.objects.create(
        validation="passed",
        node_id="n1",
        address="127.0.0.1:9",
        package=package,
        state="up",
        weight=2.0,
        affinity=False,
        last_probe_at=timezone.now(),
        last_seen_load={"load": 0.25, "total": 4, "kv_used": 10, "kv_capacity": 100},
    )


def test_the_node_table_matches_the_inventory(node):
    SessionRoute.objects.create(session_id="a", node=node)
    (view,) = nodes_for_routing(stale_after_s=10).views
    assert (view.node_id, view.state, view.weight, view.affinity) == ("n1", "up", 2.0, False)
    assert (view.load, view.total, view.kv_used, view.kv_capacity) == (0.25, 4, 10, 100)
    assert (view.model, view.sessions) == ("m", 1)
    assert pinned_counts().counts == {"n1": 1}


def test_a_stale_probe_reads_as_unknown_load(node):
    Node.objects.update(last_probe_at=timezone.now() - timedelta(seconds=60))
    (view,) = nodes_for_routing(stale_after_s=10).views
    assert view.load is None and view.total is None


def test_a_route_reads_back_with_aware_times(node):
    moved = timezone.now() - timedelta(minutes=3)
    route = SessionRoute.objects.create(session_id="s", node=node, moved_for_load_at=moved)
    row = route_read(session_id="s")
    assert row is not None and row.node_id == "n1"
    assert row.last_seen_at == route.last_seen_at and row.moved_for_load_at == moved
    assert route_read(session_id="nobody") is None


def test_it_refuses_a_query_whose_parameters_are_not_its_arguments(node):
    query = CompiledQuery(lambda: Node.objects.filter(weight__gt=1).values_list("node_id"))
    with pytest.raises(ValueError, match="not the arguments"):
        query.rows()


def test_as_datetime_reads_text_as_utc():
    assert as_datetime("2026-01-02 03:04:05.000006").utcoffset() == timedelta(0)
    assert as_datetime(None) is None
