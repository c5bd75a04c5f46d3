from __future__ import annotations

import pytest

from inference.routing import Action, NodeView, NoNodeAvailable, least_loaded, route_request

M = "smollm2"


def node(
    node_id: str,
    *,
    state: str = "up",
    weight: float = 1.0,
    load: float | None = 0.0,
    model: str | None = M,
    sessions: int = 0,
) -> NodeView:
    return NodeView(
        node_id=node_id, state=state, weight=weight, load=load, model=model, sessions=sessions
    )


def test_it_places_a_new_session_on_the_lowest_load():
    nodes = [node("node-01", load=0.5), node("node-02", load=0.31), node("node-03", load=0.9)]
    decision = route_request(nodes, model=M)
    assert decision.node_id == "node-02"
    assert decision.action is Action.PLACED
    assert decision.reason == "placed on node-02: lowest load 0.31 of 3 candidates"


def test_the_reason_breaks_down_a_load_that_counts_pinned_sessions():
    from dataclasses import replace

    nodes = [replace(node("node-01", sessions=2), total=4.0), replace(node("node-02", load=0.9))]
    decision = route_request(nodes, model=M)
    assert decision.node_id == "node-01"
    assert decision.reason == (
        "placed on node-01: lowest load 0.25 of 2 candidates (sequences 0.00 + 2 pinned 0.25)"
    )


def test_the_reason_shows_no_breakdown_for_terms_that_round_to_zero():
    from dataclasses import replace

    nearly_idle = replace(node("node-01"), total=8.0, kv_used=1.0, kv_capacity=4096.0)
    reason = route_request([nearly_idle], model=M).reason
    assert reason == "placed on node-01: lowest load 0.00 of 1 candidate"


def test_it_divides_load_by_weight():
    nodes = [node("node-01", load=0.4, weight=1), node("node-02", load=0.6, weight=3)]
    assert route_request(nodes, model=M).node_id == "node-02"


def test_it_never_takes_unknown_load_for_idle():
    nodes = [node("node-01", load=None), node("node-02", load=0.95)]
    assert route_request(nodes, model=M).node_id == "node-02"


def test_it_falls_back_to_unknown_load_when_nothing_else_is_left():
    decision = route_request([node("node-01", load=None), node("node-02", state="down")], model=M)
    assert decision.node_id == "node-01"
    assert "load unknown" in decision.reason


def test_it_breaks_ties_by_pinned_sessions_then_id():
    nodes = [node("node-01", sessions=2), node("node-02", sessions=1), node("node-03", sessions=1)]
    assert least_loaded(nodes).node_id == "node-02"


def test_it_skips_down_draining_unknown_and_other_models():
    nodes = [
        node("node-01", state="down"),
        node("node-02", state="draining"),
        node("node-03", state="unknown"),
        node("node-04", model="other"),
        node("node-05", load=0.99),
    ]
    assert route_request(nodes, model=M).node_id == "node-05"


def test_it_sticks_while_the_node_is_up():
    nodes = [node("node-01", load=0.99), node("node-02", load=0.0)]
    decision = route_request(nodes, model=M, pinned="node-01")
    assert decision.node_id == "node-01"
    assert decision.action is Action.STUCK
    assert not decision.pins


@pytest.mark.parametrize("state", ["down", "draining"])
def test_it_moves_a_session_off_a_failed_or_draining_node(state):
    nodes = [node("node-01"), node("node-02", state=state)]
    decision = route_request(nodes, model=M, pinned="node-02")
    assert decision.node_id == "node-01"
    assert decision.action is Action.MOVED
    assert decision.reason == f"moved to node-01: node-02 {state}"


def test_it_moves_a_session_off_a_node_that_failed_this_request():
    nodes = [node("node-01"), node("node-02")]
    decision = route_request(
        nodes, model=M, pinned="node-02", exclude={"node-02": "unreachable: ConnectError"}
    )
    assert decision.reason == "moved to node-01: node-02 unreachable: ConnectError"


def test_it_moves_a_session_whose_node_was_removed():
    decision = route_request([node("node-01")], model=M, pinned="node-09")
    assert decision.reason == "moved to node-01: node-09 removed"


def test_it_balances_requests_without_a_session_key():
    decision = route_request(
        [node("node-01", load=0.2), node("node-02", load=0.1)], model=M, session=False
    )
    assert decision.node_id == "node-02"
    assert decision.action is Action.BALANCED
    assert not decision.pins


def test_it_raises_when_no_node_is_healthy():
    with pytest.raises(NoNodeAvailable, match="node-01 down"):
        route_request([node("node-01", state="down")], model=M)


def test_it_raises_naming_a_model_no_node_serves():
    with pytest.raises(NoNodeAvailable, match="no node serves model 'x'"):
        route_request([node("node-01")], model="x")


# --- load, limits, hysteresis ----------------------------------------------------------------

from inference.routing import Limits, Saturated, node_score  # noqa: E402

REBALANCE = Limits(strategy="stick_and_rebalance", overload_threshold=1.5, rebalance_target=0.5)


def full_node(node_id: str, **kw) -> NodeView:
    return NodeView(node_id=node_id, state="up", weight=1.0, model=M, **kw)


def test_it_counts_pinned_sessions_and_kv_in_the_score():
    idle = full_node("node-01", load=0.0, total=4, sessions=4, kv_used=0, kv_capacity=1000)
    assert node_score(idle) == pytest.approx(0.5)  # every session slot pinned: half busy
    kv = full_node("node-02", load=0.0, total=4, sessions=0, kv_used=1000, kv_capacity=1000)
    assert node_score(kv) == pytest.approx(0.25)
    assert route_request([idle, kv], model=M).node_id == "node-02"


def test_it_counts_its_own_open_requests_when_metrics_lag():
    stale = full_node("node-01", load=0.0, total=4, inflight=4)
    fresh = full_node("node-02", load=0.5, total=4)
    assert route_request([stale, fresh], model=M).node_id == "node-02"


def test_it_sends_new_sessions_past_a_node_at_its_session_limit():
    nodes = [
        full_node("node-01", load=0.0, sessions=2, max_sessions=2),
        full_node("node-02", load=0.9),
    ]
    assert route_request(nodes, model=M).node_id == "node-02"


def test_it_refuses_when_every_node_is_full():
    nodes = [full_node("node-01", load=0.0, sessions=2, max_sessions=2)]
    with pytest.raises(Saturated, match="node-01 2/2 sessions"):
        route_request(nodes, model=M)


def test_it_refuses_a_pinned_session_whose_node_has_too_many_open_requests():
    nodes = [full_node("node-01", load=0.0, inflight=3), full_node("node-02", load=0.0)]
    with pytest.raises(Saturated):
        route_request(nodes, model=M, pinned="node-01", limits=Limits(max_inflight_per_node=3))


def test_it_keeps_a_pinned_session_on_an_overloaded_node_under_stick_and_redirect():
    nodes = [full_node("node-01", load=3.0), full_node("node-02", load=0.0)]
    assert route_request(nodes, model=M, pinned="node-01").action is Action.STUCK


def test_it_moves_a_pinned_session_off_an_overloaded_node_when_rebalancing():
    nodes = [full_node("node-01", load=2.0), full_node("node-02", load=0.1)]
    decision = route_request(nodes, model=M, pinned="node-01", limits=REBALANCE)
    assert decision.action is Action.MOVED and decision.for_load
    assert decision.reason.startswith("moved to node-02: node-01 overloaded (load 2.00 >= 1.5)")


@pytest.mark.parametrize(
    ("here", "there", "may_move"),
    [
        (1.4, 0.0, True),  # below the overload threshold: stay
        (2.0, 0.6, True),  # nowhere is below the rebalance target: stay
        (2.0, 0.0, False),  # moved for load recently (cooldown): stay
    ],
)
def test_it_does_not_bounce_sessions_between_nodes(here, there, may_move):
    nodes = [full_node("node-01", load=here), full_node("node-02", load=there)]
    decision = route_request(
        nodes, model=M, pinned="node-01", limits=REBALANCE, may_move_for_load=may_move
    )
    assert decision.action is Action.STUCK


def test_it_never_moves_to_a_node_with_unknown_load_for_rebalance():
    nodes = [full_node("node-01", load=2.0), full_node("node-02", load=None)]
    assert route_request(nodes, model=M, pinned="node-01", limits=REBALANCE).action is Action.STUCK


def test_it_routes_every_request_by_load_under_least_loaded():
    nodes = [full_node("node-01", load=0.9), full_node("node-02", load=0.1)]
    decision = route_request(
        nodes, model=M, pinned="node-01", limits=Limits(strategy="least_loaded")
    )
    assert decision.node_id == "node-02" and decision.action is Action.BALANCED
