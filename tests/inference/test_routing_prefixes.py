"""Prefix-aware placement (inference/agent_prefix.py, inference/routing.py): a new session of
an agent goes to a node that holds its prefix unless that node is loaded past the credit."""

from __future__ import annotations

from dataclasses import replace

from inference.agent_prefix import RecentAgents, agent_fingerprint
from inference.routing import PREFIX_CREDIT, Action, NodeView, SessionPin, route_session
from nodes.agent.metrics import prometheus_text
from nodes.metrics import load_from_metrics, parse_prometheus

M = "smollm2"
SYSTEM = {"role": "system", "content": "You are the stock agent. Tools: count, move."}
TOOLS = [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}]
AGENT = agent_fingerprint([SYSTEM, {"role": "user", "content": "hi"}], TOOLS)


def view(node_id: str, load: float, prefixes: tuple[str, ...] = ()) -> NodeView:
    return NodeView(node_id, "up", 1.0, load, M, prefixes=frozenset(prefixes))


def place(nodes: list[NodeView], prefix: str | None = AGENT):
    return route_session(nodes, model=M, pin=SessionPin(), idle_release_s=600, prefix=prefix)


def test_one_agent_has_one_fingerprint_whatever_its_users_say() -> None:
    other_turn = agent_fingerprint([SYSTEM, {"role": "user", "content": "count bolts"}], TOOLS)
    assert AGENT == other_turn and len(AGENT) == 16
    assert agent_fingerprint([SYSTEM], TOOLS[:0]) != AGENT  # other tools, another agent
    assert agent_fingerprint([{**SYSTEM, "content": "Another agent."}], TOOLS) != AGENT
    assert agent_fingerprint([{"role": "user", "content": "hi"}]) is None


def test_a_new_session_goes_where_its_agents_prefix_is_held() -> None:
    plan = place([view("node-01", 0.1), view("node-02", 0.4, (AGENT,))])
    assert plan.decision.node_id == "node-02" and plan.decision.action is Action.PLACED
    assert plan.decision.reason == (
        f"placed on node-02: holds this agent's prefix, load 0.40 - {PREFIX_CREDIT:.2f} "
        "of 2 candidates"
    )


def test_a_loaded_holder_loses_to_an_idle_node() -> None:
    plan = place([view("node-01", 0.1), view("node-02", 0.1 + PREFIX_CREDIT + 0.05, (AGENT,))])
    assert plan.decision.node_id == "node-01"
    assert "lowest load 0.10" in plan.decision.reason


def test_without_an_agent_or_a_holder_placement_is_by_load() -> None:
    nodes = [view("node-01", 0.1), view("node-02", 0.4, ("0" * 16,))]
    assert place(nodes).decision.node_id == "node-01"
    assert (
        place([replace(nodes[1], prefixes=frozenset({AGENT})), nodes[0]], None).decision.node_id
        == "node-01"
    )


def test_a_node_publishes_its_recent_agents_and_the_control_loop_reads_them() -> None:
    recent = RecentAgents(limit=2)
    for fingerprint in ("aaaa", "bbbb", "aaaa", "cccc", None):
        recent.note(fingerprint)
    assert recent.published() == ["aaaa", "cccc"]
    text = prometheus_text("node-01", {"agents": [*recent.published(), 'x"} 1\nevil']})
    assert 'phalanx_node_agent_prefix{node="node-01",agent="aaaa"} 1' in text
    assert "evil" not in text
    assert load_from_metrics(parse_prometheus(text))["prefixes"] == ["aaaa", "cccc"]
