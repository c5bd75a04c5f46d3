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
