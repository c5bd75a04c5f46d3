"""Hypothesis against a real node: no request body, valid by the OpenAI schema or not, gets a
500, and the node answers an ordinary request afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.chat_schema import ChatBody, ChatMessage
from tests.support.processes import start_node

pytestmark = [pytest.mark.model, pytest.mark.e2e]
PACKAGE = "smollm2-135m-instruct-q4_1"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
# messages whose fields hold any JSON at all, under the names the schema knows
loose_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "function", "x"])},
    optional={k: json_values for k in ("content", "tool_calls", "tool_call_id", "name")},
)
bodies = st.one_of(
    st.from_type(ChatBody),
    st.builds(lambda m: {"messages": m}, st.lists(st.from_type(ChatMessage), max_size=4)),
    st.builds(lambda m: {"messages": m}, st.lists(loose_message, min_size=1, max_size=4)),
    st.dictionaries(st.sampled_from(["messages", "tools", "tool_choice", "stop"]), json_values),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = start_node(
        "node-fuzz",
        tmp_path_factory.mktemp("fuzz"),
        threads=2,
        extra_args=["--sequences", "2", "--ctx-per-seq", "1024"],
    )
    yield proc
    proc.stop()


def post(node, body: dict) -> httpx.Response:
    """POST ``body`` as Python writes JSON (NaN and Infinity included: ``json.loads`` on the
    node reads them, so they are inputs too)."""
    return httpx.post(
        f"{node.url}/v1/chat/completions",
        content=json.dumps(body, default=repr),  # the SDK types allow any object here and there
        headers={**node.headers, "Content-Type": "application/json"},
        timeout=120,
    )


def test_no_body_gets_a_500(node) -> None:
    seen: dict[int, int] = {}

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies, stream=st.booleans())
    def probe(body: dict, stream: bool) -> None:
        body = {**body, "model": PACKAGE, "max_tokens": 2, "stream": stream}
        response = post(node, body)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (body, response.text[:500])
        if response.status_code == 200 and stream:
            assert response.text.rstrip().endswith("data: [DONE]")
            assert '"error"' not in response.text, (body, response.text[:500])
        elif response.status_code == 200:
            assert "choices" in response.json()
        else:
            error = response.json()["error"]
            assert error["message"], body

    probe()
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen  # both kinds were exercised
    ordinary = post(node, {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
    assert ordinary.status_code == 200
    assert json.loads(ordinary.text)["choices"][0]["message"]["content"]
