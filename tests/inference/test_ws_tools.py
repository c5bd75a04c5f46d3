"""The session websocket against the real bundled model behind the proxy: tools, limits."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from console.asgi import application
from inference.models import SessionRoute
from tests.inference.conftest import inventory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.model]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


async def turn(comm: WebsocketCommunicator, message: dict) -> list[dict]:
    await comm.send_json_to(message)
    events = []
    while not events or events[-1]["type"] not in ("done", "error"):
        events.append(await comm.receive_json_from(timeout=120))
    return events


async def test_a_websocket_session_calls_a_tool_and_continues_with_its_result(steady):
    token = await inventory(steady[0])
    comm = WebsocketCommunicator(application, f"/ws/sessions/ws-tools/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    asked = await turn(
        comm,
        {
            "type": "user",
            "content": "What is the weather in Oslo?",
            "tools": [WEATHER],
            "tool_choice": "required",
            "temperature": 0,
            "max_tokens": 64,
        },
    )
    calls = [e for e in asked if e["type"] == "tool_call"]
    done = asked[-1]
    assert done["type"] == "done", done
    assert done["finish_reason"] == "tool_calls"
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str)
    assert done["tool_calls"] == [{k: c[k] for k in ("id", "name", "arguments")} for c in calls]

    answered = await turn(
        comm,
        {
            "type": "tool",
            "tool_call_id": calls[0]["id"],
            "content": "4 C and raining",
            "tool_choice": "none",  # the tools stay; this turn answers in words
        },
    )
    await comm.disconnect()
    final = answered[-1]
    assert final["type"] == "done", final
    assert final["finish_reason"] in ("stop", "length") and final["content"]

    route = await SessionRoute.objects.aget(session_id="ws-tools")
    roles = [m["role"] for m in route.transcript]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert route.transcript[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert route.transcript[2]["tool_call_id"] == calls[0]["id"]
    # the second turn's prompt held the call and its result: the node saw the whole exchange
    assert final["usage"]["prompt_tokens"] > done["usage"]["prompt_tokens"]


async def test_a_tool_result_for_an_unknown_call_is_still_validated(steady):
    token = await inventory(steady[0])
    comm = WebsocketCommunicator(application, f"/ws/sessions/ws-bad-tool/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    events = await turn(comm, {"type": "tool", "tool_call_id": "", "content": "x"})
    await comm.disconnect()
    assert events[-1]["type"] == "error" and events[-1]["param"] == "tool_call_id"


async def test_an_over_long_websocket_turn_gets_the_rest_error_before_any_delta(steady):
    token = await inventory(steady[0])
    comm = WebsocketCommunicator(application, f"/ws/sessions/ws-long/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    events = await turn(comm, {"type": "user", "content": "word " * 3000, "max_tokens": 4})
    await comm.disconnect()
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["code"] == "context_length_exceeded"
    assert "per-sequence context" in events[0]["message"]
