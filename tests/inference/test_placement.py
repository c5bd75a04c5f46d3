"""A session is placed exactly once by several control-plane replicas (``inference.placement``):
the replica that claims the pin change first wins, another that decided otherwise for the same
turn follows the winner's node. Here both "replicas" share this process's cache; two real
replicas on PostgreSQL and Redis: tests/e2e/test_replicas.py."""

from __future__ import annotations

import functools
import uuid

import pytest

from inference import placement, proxy, services
from inference.models import RoutingPolicy
from inference.node_table import nodes_for_routing
from nodes.models import Node
from tests.inference.conftest import MODEL, add_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replicas(package, policy, settings):
    """Two nodes; ``REDIS_URL`` set, so replicas claim their placements (the cache here is the
    process's own, standing for the Redis they would share)."""
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    add_node("node-01", "127.0.0.1:1", package, load=0.1)
    add_node("node-02", "127.0.0.1:2", package, load=0.2)


def decide(session_id: str) -> services.RouteTarget:
    """One replica's decision for a session it has no route for (it read before any write)."""
    table = nodes_for_routing(stale_after_s=60)
    plan = functools.partial(
        services.route_plan,
        session_id=session_id,
        table=table,
        model=MODEL,
        policy=RoutingPolicy.load(),
    )
    return proxy._claimed(plan, None, {}, plan(row=None), table)


def test_a_second_replica_that_decided_another_node_follows_the_first(replicas):
    session = f"s-{uuid.uuid4()}"
    first = decide(session)
    Node.objects.filter(node_id="node-01").update(last_seen_load={"load": 0.9})  # its view
    second = decide(session)
    assert (first.node_id, first.decision.action) == ("node-01", "placed")
    assert (second.node_id, second.decision.action) == ("node-01", "placed")  # the same change
    assert second.record.package_id == first.record.package_id  # and the same route written
    another = decide(f"s-{uuid.uuid4()}")  # a session of its own goes where its view says
    assert (another.node_id, another.decision.action) == ("node-02", "placed")


def test_a_move_is_claimed_too(replicas):
    session = f"s-{uuid.uuid4()}"
    assert decide(session).node_id == "node-01"
    row = services.RouteRow("node-01", services.timezone.now(), None, None)
    Node.objects.filter(node_id="node-01").update(state=Node.State.DOWN)
    add = functools.partial(services.route_plan, session_id=session, model=MODEL)
    table = nodes_for_routing(stale_after_s=60)
    plan = functools.partial(add, table=table, policy=RoutingPolicy.load())
    moved = proxy._claimed(plan, row, {}, plan(row=row), table)
    assert (moved.node_id, moved.decision.action) == ("node-02", "moved")
    pin = placement.pin_version(row)
    won = placement.claim_pin(session_id=session, pin=pin, node_id="node-03")
    assert won == "node-02"  # a replica moving it elsewhere at the same time follows
    later = services.RouteRow("node-02", services.timezone.now(), None, None)
    fresh = placement.claim_pin(session_id=session, pin=placement.pin_version(later), node_id="n9")
    assert fresh == "n9"  # a later change of the same session is a claim of its own


def test_one_replica_claims_nothing(package, policy, settings):
    settings.REDIS_URL = None
    add_node("node-01", "127.0.0.1:1", package, load=0.1)
    session = f"s-{uuid.uuid4()}"
    assert decide(session).node_id == "node-01"
    assert placement.cache.get(placement._key(session, "new")) is None  # nothing claimed


def test_a_claim_that_cannot_reach_redis_goes_on_with_its_own_decision(replicas, monkeypatch):
    def down(*args, **kwargs):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(placement, "_failed_at", [float("-inf")])  # this test's own
    with monkeypatch.context() as patched:
        patched.setattr(placement.cache, "add", down)
        assert decide(f"s-{uuid.uuid4()}").node_id == "node-01"
    assert placement.claim_pin(session_id="s", pin="new", node_id="n7") == "n7"  # skips a while
    assert placement.cache.get(placement._key("s", "new")) is None


def test_a_token_revoked_on_another_replica_is_refused_here_within_a_check(
    transactional_db, settings, monkeypatch
):
    from inference import lookups
    from inference.errors import AuthError
    from inference.models import ApiToken
    from inference.tokens import token_create

    settings.REDIS_URL = "redis://127.0.0.1:6379/0"  # the cache here stands for the shared one
    monkeypatch.setattr(lookups, "GENERATION_CHECK_S", 0.0)
    raw = token_create(name="agent")[1]
    assert lookups.caller_for_token(raw).name == "agent"
    ApiToken.objects.update(revoked=True)  # another replica's write: no signal in this process
    assert lookups.caller_for_token(raw).name == "agent"  # still cached here
    lookups._new_generation()  # what that replica's signal does once its change commits
    with pytest.raises(AuthError):
        lookups.caller_for_token(raw)
