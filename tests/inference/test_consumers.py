from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from console.asgi import application
from inference.models import SessionRoute
from nodes.models import Node
from tests.inference.conftest import MODEL
from tests.support.logins import login_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def connect(session: str, token: str | None = None, headers=None) -> WebsocketCommunicator:
    path = f"/ws/sessions/{session}/" + (f"?token={token}" if token else "")
    return WebsocketCommunicator(application, path, headers=headers or [])


async def turn(comm: WebsocketCommunicator, message: dict) -> list[dict]:
    await comm.send_json_to(message)
    events = []
    while True:
        event = await comm.receive_json_from(timeout=10)
        events.append(event)
        if event["type"] in ("done", "error"):
            return events


async def test_it_streams_deltas_then_done_with_node_usage_and_timings(fakes, token):
    comm = connect("ws-1", token)
    connected, _ = await comm.connect(timeout=10)
    assert connected
    events = await turn(comm, {"type": "user", "content": "hi", "max_tokens": 8, "seed": 1})
    await comm.disconnect()
    assert [e["content"] for e in events if e["type"] == "delta"] == ["Hel", "lo", "!"]
    done = events[-1]
    assert done["type"] == "done" and done["node"] in fakes
    assert done["usage"]["completion_tokens"] == 3
    assert done["timings"] == {"ttft_ms": 1.0}
    sent = fakes[done["node"]].requests[0]
    assert sent["session"] == "ws-1"
    assert sent["body"]["max_tokens"] == 8 and sent["body"]["stream"] is True


async def test_it_keeps_the_transcript_so_the_client_sends_only_the_new_message(fakes, token):
    comm = connect("ws-2", token)
    await comm.connect(timeout=10)
    first = (await turn(comm, {"message": "one"}))[-1]["node"]
    second = (await turn(comm, {"content": "two"}))[-1]["node"]
    await comm.disconnect()
    assert first == second
    messages = fakes[first].requests[1]["body"]["messages"]
    assert [m["content"] for m in messages] == ["one", "Hello!", "two"]
    route = await SessionRoute.objects.aget(session_id="ws-2")
    assert len(route.transcript) == 4 and route.turns == 2


async def test_it_shares_the_pin_with_rest(fakes, token):
    comm = connect("shared", token)
    await comm.connect(timeout=10)
    node = (await turn(comm, {"content": "hi"}))[-1]["node"]
    await comm.disconnect()
    response = await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "X-Session-Id": "shared"},
    )
    assert response["X-Phalanx-Node"] == node
    assert await SessionRoute.objects.filter(session_id="shared").acount() == 1


async def test_it_accepts_a_bearer_header(fakes, token):
    comm = connect("hdr", headers=[(b"authorization", f"Bearer {token}".encode())])
    assert (await comm.connect(timeout=10))[0]
    assert (await turn(comm, {"content": "hi"}))[-1]["type"] == "done"
    await comm.disconnect()


async def test_it_rejects_a_missing_token_with_an_error_event(fakes):
    comm = connect("noauth")
    await comm.connect(timeout=10)
    event = await comm.receive_json_from()
    assert event["type"] == "error" and "API token" in event["message"]
    assert (await comm.receive_output())["type"] == "websocket.close"
    await comm.disconnect()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("{oops", "not valid JSON"),
        (json.dumps({"content": ""}), "must not be empty"),
        (json.dumps({"content": 3}), "must be a string"),
        (json.dumps({"type": "ping"}), "Unknown message type"),
        (json.dumps([1]), "JSON object"),
        (json.dumps({"content": "x", "max_tokens": -1}), "max_tokens must be between 1"),
        (json.dumps({"content": "x", "model": "nope"}), "'nope'"),
        (json.dumps({"type": "tool", "content": "4C"}), "tool_call_id must name"),
        (
            json.dumps({"content": "x", "tools": [{"type": "function", "function": {}}]}),
            "tools[0].function.name is required",
        ),
        (json.dumps({"content": "x", "tool_choice": 5}), "tool_choice must be"),
    ],
)
async def test_it_answers_bad_messages_with_an_error_event(fakes, token, raw, needle):
    comm = connect("bad", token)
    await comm.connect(timeout=10)
    await comm.send_to(text_data=raw)
    event = await comm.receive_json_from(timeout=5)
    assert event["type"] == "error" and needle in event["message"]
    await comm.disconnect()


async def test_it_sends_an_error_event_when_no_node_is_up(fakes, token):
    await sync_to_async(Node.objects.update)(state=Node.State.DOWN)
    comm = connect("down", token)
    await comm.connect(timeout=10)
    events = await turn(comm, {"content": "hi"})
    await comm.disconnect()
    assert events[-1]["type"] == "error" and "no healthy node" in events[-1]["message"]
    assert events[-1]["retry_after"] >= 1


async def test_it_sends_an_error_event_when_the_stream_and_its_continuation_break(fakes, token):
    for fake in fakes.values():
        fake.break_after = 1  # one token, then the connection drops
    comm = connect("broken", token)
    await comm.connect(timeout=10)
    events = await turn(comm, {"content": "hi"})
    await comm.disconnect()
    # the first node's "Hel", the second node's "lo" (it went on), then no third try
    assert [(e["type"], e.get("content")) for e in events[:2]] == [
        ("delta", "Hel"),
        ("delta", "lo"),
    ]
    assert [e["type"] for e in events[2:]] == ["error"]
    assert "broke off the stream" in events[-1]["message"]
    assert "its continuation on node-0" in events[-1]["message"]
    assert (await SessionRoute.objects.aget(session_id="broken")).transcript == []


async def test_it_refuses_a_second_turn_while_one_runs(fakes, token):
    for fake in fakes.values():
        fake.tokens, fake.token_delay = ["x"] * 20, 0.02
    comm = connect("busy", token)
    await comm.connect(timeout=10)
    await comm.send_json_to({"content": "one"})
    await comm.send_json_to({"content": "two"})
    events = []
    while not events or events[-1]["type"] != "done":
        events.append(await comm.receive_json_from(timeout=10))
    await comm.disconnect()
    assert any(e["type"] == "error" and "already running" in e["message"] for e in events)


async def test_it_cancels_the_upstream_when_the_client_disconnects(fakes, token):
    for fake in fakes.values():
        fake.tokens, fake.token_delay = ["x"] * 500, 0.01
    comm = connect("gone", token)
    await comm.connect(timeout=10)
    await comm.send_json_to({"content": "hi"})
    assert (await comm.receive_json_from(timeout=10))["type"] == "delta"
    await comm.disconnect()
    for _ in range(300):
        if sum(f.disconnects for f in fakes.values()) == 1:
            break
        await asyncio.sleep(0.02)
    assert sum(f.disconnects for f in fakes.values()) == 1


async def test_it_stops_an_open_connection_whose_token_was_revoked(fakes, token):
    from inference.models import ApiToken
    from inference.tokens import token_revoke

    comm = connect("revoked", headers=[(b"authorization", f"Bearer {token}".encode())])
    assert (await comm.connect(timeout=10))[0]
    assert (await turn(comm, {"content": "hi"}))[-1]["type"] == "done"
    token_id = await ApiToken.objects.values_list("pk", flat=True).aget()
    await sync_to_async(token_revoke)(token_id=token_id)
    await comm.send_json_to({"type": "user", "content": "again"})
    event = await comm.receive_json_from()
    assert event["type"] == "error" and "revoked" in event["message"]
    assert (await comm.receive_output())["type"] == "websocket.close"


async def test_a_refused_turns_tools_do_not_stick_to_the_connection(fakes, token):
    comm = connect("sticky", token)
    await comm.connect(timeout=10)
    bad = await turn(comm, {"content": "hi", "tools": [{"type": "function", "function": {}}]})
    assert bad[-1]["type"] == "error" and bad[-1]["param"] == "tools[0].function.name"
    fine = await turn(comm, {"content": "hi"})
    await comm.disconnect()
    assert fine[-1]["type"] == "done"


async def test_a_tool_result_must_answer_an_open_call(fakes, token):
    comm = connect("tool-ids", token)
    await comm.connect(timeout=10)
    events = await turn(comm, {"type": "tool", "tool_call_id": "call_nope", "content": "4C"})
    await comm.disconnect()
    assert events[-1]["type"] == "error" and events[-1]["code"] == "unknown_tool_call"
    assert "open: none" in events[-1]["message"]
    assert sum(len(f.requests) for f in fakes.values()) == 0


@pytest.mark.parametrize(("path", "ok"), [("team%2Fagent-7", True), ("a/b", True), ("%20", False)])
async def test_websocket_session_ids_follow_the_rest_rules(fakes, token, path, ok):
    comm = WebsocketCommunicator(application, f"/ws/sessions/{path}/?token={token}")
    connected, _ = await comm.connect(timeout=10)
    assert connected
    if ok:
        assert (await turn(comm, {"content": "hi"}))[-1]["type"] == "done"
    else:
        event = await comm.receive_json_from(timeout=5)
        assert event["code"] == "invalid_session_id"
    await comm.disconnect()


async def test_a_logged_in_user_in_no_role_is_refused_and_no_node_is_asked(fakes):
    comm = connect("norole", headers=await login_cookie(None))
    await comm.connect(timeout=10)
    event = await comm.receive_json_from(timeout=10)
    assert event == {
        "type": "error",
        "message": "Your account has no role; an admin must give it one.",
        "code": "no_role",
    }
    closed = await comm.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()
    assert [f.requests for f in fakes.values()] == [[], []]


async def test_a_logged_in_viewer_chats_on_the_session_socket(fakes):
    from console.models import Role

    comm = connect("viewer-chat", headers=await login_cookie(Role.VIEWER))
    assert (await comm.connect(timeout=10))[0]
    assert (await turn(comm, {"content": "hi"}))[-1]["type"] == "done"
    await comm.disconnect()
