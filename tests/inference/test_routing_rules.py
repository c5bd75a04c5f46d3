"""The routing rules at their boundaries, and the decision log's exact sentences (pure)."""

from __future__ import annotations

import pytest

from inference.routing import (
    LEAST_LOADED,
    STICK_AND_REBALANCE,
    Action,
    Limits,
    NodeView,
    NoNodeAvailable,
    Saturated,
    SessionPin,
    candidates,
    full_for_session,
    least_loaded,
    node_score,
    route_request,
    route_session,
    score_parts,
)

M = "smollm2"
REBALANCE = Limits(strategy=STICK_AND_REBALANCE, overload_threshold=1.5, rebalance_target=0.5)


def node(node_id: str, **fields) -> NodeView:
    fields = {"state": "up", "weight": 1.0, "load": 0.0, "model": M, **fields}
    return NodeView(node_id=node_id, **fields)


def test_a_candidate_is_up_serves_the_model_has_weight_and_is_not_excluded() -> None:
    nodes = [
        node("a"),
        node("b", state="draining"),
        node("c", model="other"),
        node("d", weight=0.0),
        node("e"),
        node("f", weight=0.01),
    ]
    assert [n.node_id for n in candidates(nodes, model=M, exclude={"e": "x"})] == ["a", "f"]


def test_the_score_adds_sequences_pins_and_kv() -> None:
    n = node(
        "a", load=0.2, total=4, inflight=2, sessions=2, max_sessions=8, kv_used=50, kv_budget=100
    )
    assert score_parts(n) == (0.5, 0.5 * 2 / 8, 0.25 * 50 / 100)  # inflight 2/4 beats load 0.2
    assert node_score(n) == pytest.approx(0.5 + 0.125 + 0.125)
    # capacity falls back to the sequences, the budget to the KV capacity; unknown counts 0
    n = node("b", load=0.1, total=4, sessions=1, kv_used=10, kv_capacity=40)
    assert score_parts(n) == (0.1, 0.5 * 1 / 4, 0.25 * 10 / 40)
    assert score_parts(node("c", load=0.3, sessions=5, kv_used=9)) == (0.3, 0.0, 0.0)
    assert score_parts(node("d", load=None)) is None and node_score(node("d", load=None)) is None


def test_least_loaded_goes_by_score_per_weight_then_sessions_per_weight_then_id() -> None:
    assert least_loaded([node("a", load=0.6, weight=2.0), node("b", load=0.4)]).node_id == "a"
    tie = [node("b", sessions=3, weight=1.0), node("a", sessions=4, weight=2.0)]
    assert least_loaded(tie).node_id == "a"  # 4/2 sessions per weight beats 3/1
    assert least_loaded([node("b"), node("a")]).node_id == "a"
    unknown = [node("a", load=None), node("b", load=0.9)]
    assert least_loaded(unknown).node_id == "b"  # unknown load goes last
    assert least_loaded([node("b", load=None), node("a", load=None)]).node_id == "a"


def test_a_node_is_full_at_its_session_or_kv_limit() -> None:
    limits = Limits()
    assert full_for_session(node("a", sessions=2, max_sessions=3), limits) is None
    assert full_for_session(node("a", sessions=3, max_sessions=3), limits) == "3/3 sessions"
    assert full_for_session(node("a", kv_used=99, kv_budget=100), limits) is None
    assert full_for_session(node("a", kv_used=100, kv_budget=100), limits) == "KV 100/100 tokens"
    assert full_for_session(node("a", kv_used=None, kv_budget=100), limits) is None
    busy = Limits(max_inflight_per_node=2)
    assert full_for_session(node("a", inflight=1), busy) is None
    assert full_for_session(node("a", inflight=2), busy) == "2/2 requests open"


def test_placement_sentences() -> None:
    d = route_request([node("a", load=0.25), node("b", load=0.5)], model=M)
    assert (d.node_id, d.action, d.previous) == ("a", Action.PLACED, None)
    assert d.reason == "placed on a: lowest load 0.25 of 2 candidates"
    d = route_request([node("a", load=None)], model=M, session=False)
    assert d.action == Action.BALANCED
    assert d.reason == "sent to a: load unknown on every candidate of 1 candidate"
    d = route_request(
        [node("a", load=0.1, total=4, sessions=2, kv_used=10, kv_budget=100)], model=M
    )
    assert d.reason == (
        "placed on a: lowest load 0.38 of 1 candidate (sequences 0.10 + 2 pinned 0.25 + KV 0.03)"
    )
    d = route_request([node("a", load=0.1, total=4, sessions=1)], model=M)
    assert (
        d.reason == "placed on a: lowest load 0.23 of 1 candidate (sequences 0.10 + 1 pinned 0.12)"
    )
    tiny = node("a", load=0.1, total=1000, sessions=1)  # 0.0005 pinned: shown as 0.00, left out
    assert route_request([tiny], model=M).reason == "placed on a: lowest load 0.10 of 1 candidate"


def test_a_session_sticks_and_moves_with_the_reason() -> None:
    d = route_request([node("a"), node("b")], model=M, pinned="b")
    assert (d.node_id, d.action, d.reason) == ("b", Action.STUCK, "stuck on b")
    d = route_request([node("a"), node("b", model="other")], model=M, pinned="b")
    assert (d.node_id, d.action, d.previous) == ("a", Action.MOVED, "b")
    assert d.reason == f"moved to a: b does not serve {M}"
    d = route_request([node("a"), node("b", weight=0.0)], model=M, pinned="b")
    assert d.reason == "moved to a: b has weight 0"
    d = route_request([node("a"), node("b", state="down")], model=M, pinned="b")
    assert d.reason == "moved to a: b down"


def test_a_pinned_node_at_its_request_limit_is_saturated_not_left() -> None:
    limits = Limits(max_inflight_per_node=1)
    with pytest.raises(Saturated) as caught:
        route_request([node("a"), node("b", inflight=1)], model=M, pinned="b", limits=limits)
    assert str(caught.value) == "b, where the session is pinned, has 1/1 requests open"


def test_every_node_full_names_each() -> None:
    nodes = [node("a", sessions=1, max_sessions=1), node("b", inflight=3)]
    with pytest.raises(Saturated) as caught:
        route_request(nodes, model=M, limits=Limits(max_inflight_per_node=3))
    assert (
        str(caught.value)
        == f"every node serving {M!r} is full (a 1/1 sessions, b 3/3 requests open)"
    )
    # a request without a session ignores the session limit
    d = route_request(nodes, model=M, session=False, limits=Limits(max_inflight_per_node=3))
    assert d.node_id == "a"


def test_no_node_messages_list_each_node_sorted() -> None:
    with pytest.raises(NoNodeAvailable) as caught:
        route_request([node("a", model="other")], model=M)
    assert str(caught.value) == f"no node serves model {M!r}"
    nodes = [node("c", state="down"), node("a", state="draining"), node("b")]
    with pytest.raises(NoNodeAvailable) as caught:
        route_request(nodes, model=M, exclude={"b": "unreachable: ConnectError"})
    assert str(caught.value) == (
        f"no healthy node serves model {M!r} (a draining, b unreachable: ConnectError, c down)"
    )


def test_rebalance_moves_at_the_threshold_to_a_node_at_the_target() -> None:
    pool = [node("hot", load=1.5), node("cool", load=0.5), node("warm", load=0.6)]
    d = route_request(pool, model=M, pinned="hot", limits=REBALANCE)
    assert (d.node_id, d.action, d.for_load, d.previous) == ("cool", Action.MOVED, True, "hot")
    assert d.reason == "moved to cool: hot overloaded (load 1.50 >= 1.5), cool at 0.50"
    below = [node("hot", load=1.49), node("cool", load=0.0)]
    assert route_request(below, model=M, pinned="hot", limits=REBALANCE).action == Action.STUCK
    none_cool = [node("hot", load=3.0), node("warm", load=0.51), node("dark", load=None)]
    assert route_request(none_cool, model=M, pinned="hot", limits=REBALANCE).action == Action.STUCK
    full = [node("hot", load=3.0), node("cool", load=0.0, sessions=1, max_sessions=1)]
    assert route_request(full, model=M, pinned="hot", limits=REBALANCE).action == Action.STUCK
    # no move while the session's cooldown runs, nor under the other strategies
    assert (
        route_request(pool, model=M, pinned="hot", limits=REBALANCE, may_move_for_load=False).action
        == Action.STUCK
    )
    assert route_request(pool, model=M, pinned="hot").action == Action.STUCK


def test_least_loaded_never_pins() -> None:
    d = route_request(
        [node("a", load=0.9), node("b", load=0.1)],
        model=M,
        pinned="a",
        limits=Limits(strategy=LEAST_LOADED),
    )
    assert (d.node_id, d.action) == ("b", Action.BALANCED)


def test_route_session_releases_an_idle_pin_first() -> None:
    nodes = [node("a", load=0.9), node("b", load=0.1)]
    kept = route_session(nodes, model=M, pin=SessionPin("a", idle_s=60.0), idle_release_s=60.0)
    assert kept.released is None and kept.decision.reason == "stuck on a"
    gone = route_session(nodes, model=M, pin=SessionPin("a", idle_s=60.4), idle_release_s=60.0)
    assert gone.released == "released from a: idle 60 s"
    assert (gone.decision.node_id, gone.decision.action) == ("b", Action.PLACED)
    new = route_session(nodes, model=M, pin=SessionPin(None, idle_s=1e9), idle_release_s=1.0)
    assert new.released is None and new.decision.action == Action.PLACED


def test_route_session_passes_its_exclusions_limits_and_cooldown() -> None:
    hot = [node("a", load=2.0), node("b", load=0.0)]
    cooling = route_session(
        hot, model=M, pin=SessionPin("a", cooling=True), idle_release_s=60, limits=REBALANCE
    )
    assert cooling.decision.action == Action.STUCK
    free = route_session(hot, model=M, pin=SessionPin("a"), idle_release_s=60, limits=REBALANCE)
    assert (free.decision.node_id, free.decision.action) == ("b", Action.MOVED)
    failed = route_session(
        hot,
        model=M,
        pin=SessionPin("a"),
        idle_release_s=60,
        exclude={"a": "unreachable: ConnectError"},
    )
    assert failed.decision.reason == "moved to b: a unreachable: ConnectError"
    assert failed.decision.previous == "a"
