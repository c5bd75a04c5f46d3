"""Every answer ends honestly, against fake nodes that misbehave the ways sick nodes do."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from console.asgi import application
from inference.models import RouteDecision, RoutingPolicy, SessionRoute
from nodes.control import ControlLoop
from nodes.models import Node, NodeEvent
from tests.fakenode import HungListener
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
TRUNCATIONS = ["no_finish", "close_delimited", "malformed"]


async def post(auth: dict, session: str | None = None, content: str = "hi", **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    headers = {**auth, **({"X-Session-Id": session} if session else {})}
    return await AsyncClient().post(
        CHAT, json.dumps(body), content_type="application/json", headers=headers
    )


async def text_of(response) -> str:
    return b"".join([c async for c in response.streaming_content]).decode()


def data_events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def only_node_01_serves(fakes) -> None:
    """node-02 looks busy, so new sessions land on node-01."""
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(last_seen_load={"load": 0.9})


async def no_other_node(fakes) -> None:
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(state=Node.State.DOWN)


def content_of(chunks: list[dict]) -> str:
    deltas = (c.get("delta") or {} for chunk in chunks for c in chunk.get("choices") or [])
    return "".join(d.get("content") or "" for d in deltas)


RELAYED_BEFORE_THE_CUT = {"no_finish": "Hello!", "close_delimited": "Hello!", "malformed": "Hel"}


@pytest.mark.parametrize("shape", TRUNCATIONS)
async def test_a_dishonest_stream_goes_on_on_the_other_node_as_one_stream(fakes, auth, shape):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = shape
    response = await post(auth, "trunc", stream=True)
    assert response.status_code == 200 and response["X-Phalanx-Node"] == "node-01"
    events = data_events(await text_of(response))
    assert events[-1] == "[DONE]" and all("oops" not in e for e in events)
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c for c in chunks if "error" in c] == []
    assert content_of(chunks) == "Hello!"  # nothing lost, nothing written twice
    ends = [c for c in chunks if "migrated" in c]
    assert ends and all(c["migrated"] == {"from": "node-01", "to": "node-02"} for c in ends)
    continuation = fakes["node-02"].requests[-1]["body"]
    assert continuation["continue_final_message"] is True
    assert continuation["messages"][-1] == {
        "role": "assistant",
        "content": RELAYED_BEFORE_THE_CUT[shape],
    }
    node = await Node.objects.aget(node_id="node-01")
    assert node.consecutive_failures == 1 and "broke mid-answer" in node.last_probe_error


@pytest.mark.parametrize("shape", TRUNCATIONS)
async def test_a_dishonest_stream_with_no_node_to_go_on_ends_with_an_error_event(
    fakes, auth, shape
):
    await no_other_node(fakes)
    fakes["node-01"].shape = shape
    response = await post(auth, "trunc", stream=True)
    assert response.status_code == 200 and response["X-Phalanx-Node"] == "node-01"
    events = data_events(await text_of(response))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["message"].startswith("node-01 ")
    assert "no other node could continue it" in error["message"]
    assert all("oops" not in e for e in events)  # a malformed event is never relayed
    node = await Node.objects.aget(node_id="node-01")
    assert node.consecutive_failures == 1 and "broke mid-answer" in node.last_probe_error


async def test_a_turn_whose_migration_failed_still_sends_the_next_turn_elsewhere(fakes, auth):
    await no_other_node(fakes)
    fakes["node-01"].shape = "no_finish"
    first = await post(auth, "cut-twice", stream=True)
    assert "no other node could continue it" in await text_of(first)
    fakes["node-01"].shape = "ok"
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(state=Node.State.UP)
    second = await post(auth, "cut-twice", stream=True)
    assert second["X-Phalanx-Node"] == "node-02" and "error" not in await text_of(second)
    route = await SessionRoute.objects.aget(session_id="cut-twice")
    reasons = [d.reason async for d in RouteDecision.objects.filter(route=route)]
    assert "moved to node-02: node-01 broke the session's last turn" in reasons


async def test_nothing_a_node_sends_after_done_reaches_the_client(fakes, auth):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = "after_done"
    events = data_events(await text_of(await post(auth, "after", stream=True)))
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert all("error" not in e and "more" not in e for e in events)
    assert (await Node.objects.aget(node_id="node-01")).consecutive_failures == 0


@pytest.mark.parametrize("shape", ["ok", "after_done"])
async def test_turns_after_a_whole_answer_reuse_the_connection_to_the_node(fakes, auth, shape):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = shape
    for turn in range(3):
        response = await post(auth, "reusing", stream=True, content=f"turn {turn}")
        assert data_events(await text_of(response))[-1] == "[DONE]"
    assert len(fakes["node-01"].requests) == 3 and fakes["node-01"].connections == 1


async def test_a_cut_answer_moves_its_session_and_the_next_turn_stays(fakes, auth):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = "no_finish"
    first = await post(auth, "moving", stream=True)
    assert first["X-Phalanx-Node"] == "node-01" and '"error"' not in await text_of(first)
    fakes["node-01"].shape = "ok"
    second = await post(auth, "moving", stream=True)
    assert second["X-Phalanx-Node"] == "node-02"
    assert "error" not in await text_of(second)
    route = await SessionRoute.objects.select_related("node").aget(session_id="moving")
    assert route.node.node_id == "node-02"
    reasons = [d.reason async for d in RouteDecision.objects.filter(route=route)]
    assert "moved to node-02: node-01 cut this answer" in reasons


@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_200_is_answered_by_the_other_node(fakes, auth, stream):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = "empty_200"
    response = await post(auth, "empty", stream=stream)
    assert response.status_code == 200 and response["X-Phalanx-Node"] == "node-02"
    assert response["X-Phalanx-Migrated-From"] == "node-01"
    if stream:  # node-02 streams what node-01 did not
        chunks = [json.loads(e) for e in data_events(await text_of(response))[:-1]]
        assert content_of(chunks) == "Hello!"
    else:
        assert json.loads(response.content)["choices"][0]["message"]["content"] == "Hello!"
    assert (await Node.objects.aget(node_id="node-01")).consecutive_failures == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_200_with_no_other_node_is_a_502(fakes, auth, stream):
    await no_other_node(fakes)
    fakes["node-01"].shape = "empty_200"
    response = await post(auth, stream=stream)
    assert response.status_code == 502
    message = json.loads(response.content)["error"]["message"]
    assert message.startswith("node-01 answered 200 with an empty body")
    assert "no other node could answer" in message
    assert (await Node.objects.aget(node_id="node-01")).consecutive_failures == 1


async def ws_turn(token: str, session: str) -> list[dict]:
    comm = WebsocketCommunicator(application, f"/ws/sessions/{session}/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    await comm.send_json_to({"type": "user", "content": "hi"})
    events = []
    while not events or events[-1]["type"] not in ("done", "error"):
        events.append(await comm.receive_json_from(timeout=10))
    await comm.disconnect()
    return events


@pytest.mark.parametrize("shape", ["no_finish", "malformed"])
async def test_a_cut_websocket_turn_goes_on_and_its_whole_answer_is_kept(fakes, token, shape):
    await only_node_01_serves(fakes)
    fakes["node-01"].shape = shape
    events = await ws_turn(token, "ws-trunc")
    assert "".join(e["content"] for e in events if e["type"] == "delta") == "Hello!"
    done = events[-1]
    assert done["type"] == "done" and done["content"] == "Hello!"
    assert done["migrated"] == {"from": "node-01", "to": "node-02"}
    assert done["node"] == "node-02"
    route = await SessionRoute.objects.aget(session_id="ws-trunc")
    assert route.transcript[-1] == {"role": "assistant", "content": "Hello!"}


@pytest.mark.parametrize("shape", ["no_finish", "malformed"])
async def test_a_broken_websocket_turn_is_an_error_and_stays_out_of_the_transcript(
    fakes, token, shape
):
    await no_other_node(fakes)
    fakes["node-01"].shape = shape
    events = await ws_turn(token, "ws-trunc")
    assert events[-1]["type"] == "error" and events[-1]["message"].startswith("node-01 ")
    assert all("oops" not in e.get("content", "") for e in events)
    route = await SessionRoute.objects.aget(session_id="ws-trunc")
    assert route.transcript == []


async def test_a_silent_node_is_left_at_the_first_byte_deadline(fakes, auth):
    policy = await sync_to_async(RoutingPolicy.load)()
    policy.first_byte_floor_s = 1.0
    await sync_to_async(policy.save)()
    silent = HungListener()
    try:
        await sync_to_async(Node.objects.filter(node_id="node-01").update)(address=silent.address)
        await only_node_01_serves(fakes)
        response = await post(auth, "deadline", stream=True)
        assert response.status_code == 200 and response["X-Phalanx-Node"] == "node-02"
        assert "error" not in await text_of(response)
    finally:
        silent.close()
    route = await SessionRoute.objects.aget(session_id="deadline")
    reasons = [d.reason async for d in RouteDecision.objects.filter(route=route)]
    assert any("node-01 no first byte within 1.0 s" in r for r in reasons), reasons


async def test_a_node_failing_every_request_behind_a_green_health_stays_out(fakes, auth):
    policy = await sync_to_async(RoutingPolicy.load)()
    policy.recovery_threshold = 1
    await sync_to_async(policy.save)()
    await only_node_01_serves(fakes)
    fakes["node-01"].chat_status = 500
    for i in range(3):
        assert (await post(auth, content=f"question {i}")).status_code == 502
    assert (await Node.objects.aget(node_id="node-01")).state == Node.State.DOWN
    await sync_to_async(ControlLoop().tick)()  # /health is 200, the canary gets a 500
    assert (await Node.objects.aget(node_id="node-01")).state == Node.State.DOWN
    fakes["node-01"].chat_status = 200
    await sync_to_async(ControlLoop().tick)()
    assert (await Node.objects.aget(node_id="node-01")).state == Node.State.UP
    back = await NodeEvent.objects.aget(node__node_id="node-01", kind=NodeEvent.Kind.CAME_BACK)
    assert "canary completion" in back.message
