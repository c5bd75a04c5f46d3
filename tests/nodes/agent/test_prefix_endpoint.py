"""``POST /prefixes`` on a real node with the bundled model: a registered agent opening is
prefilled before its first session, kept on the shelf, and a restarted node serves that
agent's first turn from the saved KV."""

from __future__ import annotations

import httpx
import pytest

from inference.agent_prefix import agent_fingerprint
from tests.support.processes import start_node

pytestmark = [pytest.mark.model, pytest.mark.e2e]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"inventory_{verb}",
            "description": f"{verb.title()} items of the warehouse inventory by part number.",
            "parameters": {
                "type": "object",
                "properties": {"part": {"type": "string"}, "count": {"type": "integer"}},
                "required": ["part"],
            },
        },
    }
    for verb in ("find", "count", "reserve", "release", "move")
]
SYSTEM = [{"role": "system", "content": "You are the warehouse agent. Answer in one line."}]


def _start(node_id: str, log_dir, prefix_dir):
    log_dir.mkdir(parents=True, exist_ok=True)
    args = ["--sequences", "4", "--ctx-per-seq", "2048", "--prefix-dir", str(prefix_dir)]
    return start_node(node_id, log_dir, threads=2, extra_args=args)


def _push(node, body) -> httpx.Response:
    return httpx.post(f"{node.url}/prefixes", json=body, headers=node.headers, timeout=120)


def _first_turn_cached(node, question: str) -> int:
    body = {
        "messages": [*SYSTEM, {"role": "user", "content": question}],
        "tools": TOOLS,
        "max_tokens": 2,
        "temperature": 0,
    }
    answer = httpx.post(
        f"{node.url}/v1/chat/completions", json=body, headers=node.headers, timeout=120
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_registered_opening_is_warm_before_its_agents_first_turn_and_after_a_restart(
    tmp_path,
) -> None:
    prefix_dir = tmp_path / "shelf"
    node = _start("node-p1", tmp_path / "a", prefix_dir)
    try:
        pushed = _push(node, {"prefixes": [{"messages": SYSTEM, "tools": TOOLS}]})
        assert pushed.status_code == 200, pushed.text
        [held] = pushed.json()["prefixes"]
        assert held["state"] == "prefilled" and held["tokens"] > 64
        assert held["agent"] == agent_fingerprint(SYSTEM, TOOLS)
        metrics = httpx.get(f"{node.url}/metrics", headers=node.headers).text
        assert f'agent="{held["agent"]}"' in metrics  # placement can prefer this node now
        again = _push(node, {"prefixes": [{"messages": SYSTEM, "tools": TOOLS}]})
        assert again.json()["prefixes"][0]["state"] == "held"
        assert _first_turn_cached(node, "Where is part A-113?") >= held["tokens"]
    finally:
        node.stop()
    restarted = _start("node-p1", tmp_path / "b", prefix_dir)
    try:
        health = httpx.get(f"{restarted.url}/health").json()
        assert health["warm"]["prefixes_loaded"] >= 1
        assert _first_turn_cached(restarted, "Reserve two of part B-7.") >= held["tokens"]
    finally:
        restarted.stop()


@pytest.mark.parametrize(
    "body, says",
    [
        ({}, "'prefixes' must be a non-empty list"),
        ({"prefixes": [{"messages": []}]}, "prefixes[0].messages must be a non-empty list"),
        (
            {"prefixes": [{"messages": [{"role": "user", "content": "hi"}]}]},
            "only system or developer messages",
        ),
        ({"prefixes": [{"messages": SYSTEM}] * 9}, "at most 8 prefixes"),
        ({"prefixes": [{"messages": SYSTEM, "tools": {"a": 1}}]}, "prefixes[0].tools must be"),
        ({"prefixes": [{"messages": SYSTEM, "tools": [{"type": "nope"}]}]}, "prefixes[0]: tools"),
    ],
)
def test_a_bad_body_is_a_400_that_names_the_field(plain_node, body, says) -> None:
    answer = _push(plain_node, body)
    assert answer.status_code == 400 and says in answer.json()["error"]["message"]


@pytest.fixture(scope="module")
def plain_node(tmp_path_factory):
    node = _start("node-p2", tmp_path_factory.mktemp("p2"), "")
    yield node
    node.stop()
