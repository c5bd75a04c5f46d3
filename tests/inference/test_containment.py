"""No request takes the array down: bad bodies stop at the proxy, a node's 500 for one request
stays that request's failure, and only distinct failing requests take a node out."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from inference.request_breaker import RequestBreaker
from nodes.credentials import node_credential
from nodes.models import Node, NodeEvent
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
POISON_TOOL_CALLS = ["{", ["{"], [{"id": "c", "type": "function"}]]


def chat_body(content: str = "hi", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def post(body: dict, auth: dict, **headers):
    return await AsyncClient().post(
        CHAT, json.dumps(body), content_type="application/json", headers={**auth, **headers}
    )


def sent(fakes) -> int:
    return sum(len(f.requests) for f in fakes.values())


@pytest.mark.parametrize("tool_calls", POISON_TOOL_CALLS)
async def test_it_refuses_a_poison_body_before_any_node_sees_it(fakes, auth, tool_calls):
    body = chat_body()
    body["messages"] = [
        {"role": "user", "content": "Echo hello."},
        {"role": "assistant", "content": None, "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        {"role": "user", "content": "Now say goodbye."},
    ]
    for _ in range(3):
        response = await post(body, auth)
        assert response.status_code == 400
        error = json.loads(response.content)["error"]
        assert error["param"].startswith("messages[1].tool_calls")
        assert error["message"].startswith(error["param"] + " ")
    assert sent(fakes) == 0
    states = {n.state async for n in Node.objects.all()}
    assert states == {Node.State.UP}
    assert (await post(chat_body(), auth)).status_code == 200


async def test_it_returns_a_node_500_to_its_client_without_retrying_it(fakes, auth):
    for fake in fakes.values():
        fake.chat_status = 500
    response = await post(chat_body(), auth)
    assert response.status_code == 502
    error = json.loads(response.content)["error"]
    assert error["code"] == "node_error" and "engine failed" in error["message"]
    assert sent(fakes) == 1  # not retried on the other node
    failed_on = error["message"].split()[0]
    assert failed_on in fakes and len(fakes[failed_on].requests) == 1
    async for node in Node.objects.all():
        assert node.state == Node.State.UP and node.consecutive_failures == 0


async def test_one_body_failing_again_and_again_never_takes_a_node_out(fakes, auth):
    await sync_to_async(Node.objects.filter(node_id="node-02").delete)()
    fakes["node-01"].chat_status = 500
    for _ in range(8):
        assert (await post(chat_body("the same poison"), auth)).status_code == 502
    node = await Node.objects.aget(node_id="node-01")
    assert node.state == Node.State.UP
    assert not await NodeEvent.objects.filter(kind=NodeEvent.Kind.WENT_DOWN).aexists()


async def test_a_node_whose_distinct_requests_keep_failing_is_taken_out(fakes, auth):
    fakes["node-01"].chat_status = 500
    # node-02 looks busier, so new requests go to node-01 until it is taken out
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(last_seen_load={"load": 0.9})
    statuses = [(await post(chat_body(f"question {i}"), auth)).status_code for i in range(4)]
    assert statuses[:3] == [502, 502, 502]
    assert statuses[3] == 200  # node-01 is out; node-02 answers
    node = await Node.objects.aget(node_id="node-01")
    assert node.state == Node.State.DOWN
    event = await NodeEvent.objects.aget(node=node, kind=NodeEvent.Kind.WENT_DOWN)
    assert "3 different requests failed" in event.message


async def test_the_proxy_presents_each_node_its_own_credential(fakes, auth):
    await sync_to_async(Node.objects.filter(node_id="node-02").delete)()
    assert (await post(chat_body(), auth)).status_code == 200
    presented = fakes["node-01"].requests[-1]["authorization"]
    assert presented == f"Bearer {node_credential('node-01')}"
    assert node_credential("node-01") != node_credential("node-02")


def test_the_breaker_counts_a_body_failing_on_two_nodes_against_neither() -> None:
    breaker = RequestBreaker(window_s=60, min_distinct=2)
    assert breaker.failure("a", "p1", "x", now=0) is None
    assert breaker.failure("b", "p1", "x", now=1) is None  # the same body fails elsewhere too
    assert breaker.failure("a", "p2", "x", now=2) is None  # p1 is the request's fault
    trip = breaker.failure("a", "p3", "x", now=3)
    assert trip is not None and trip.distinct_failures == 2


def test_the_breaker_spares_a_node_that_mostly_succeeds_and_forgets_old_failures() -> None:
    breaker = RequestBreaker(window_s=10, min_distinct=3, min_failure_share=0.5)
    for t in range(4):
        breaker.success("a", now=t)
    assert breaker.failure("a", "p1", "x", now=5) is None
    assert breaker.failure("a", "p2", "x", now=6) is None
    assert breaker.failure("a", "p3", "x", now=7) is None  # 3 of 7 answers: not half
    assert breaker.failure("a", "p4", "x", now=30) is None  # the rest aged out of the window


async def test_a_body_that_fails_on_two_nodes_is_not_carried_further(fakes, auth):
    for fake in fakes.values():
        fake.shape = "reset"  # each node takes the request and drops the connection
    response = await post(chat_body("the query of death"), auth)
    assert response.status_code == 502
    assert "failed on node-01 and node-02" in json.loads(response.content)["error"]["message"]
    assert sent(fakes) == 2
    again = await post(chat_body("the query of death"), auth)
    assert again.status_code == 422
    assert json.loads(again.content)["error"]["code"] == "request_quarantined"
    assert sent(fakes) == 2  # refused before any node saw it
    for fake in fakes.values():
        fake.shape = "ok"
    assert (await post(chat_body("an ordinary question"), auth)).status_code == 200


@pytest.mark.parametrize(
    ("headers", "raw"),
    [
        ({"X-Session-Id": "caf\u00e9"}, json.dumps(chat_body())),  # header bytes read as latin-1
        ({}, json.dumps(chat_body(x=float("nan")))),  # Python writes NaN; JSON has none
    ],
)
async def test_it_refuses_what_cannot_be_forwarded_with_a_400(fakes, auth, headers, raw):
    response = await AsyncClient().post(
        CHAT, raw, content_type="application/json", headers={**auth, **headers}
    )
    assert response.status_code == 400
    assert sent(fakes) == 0


async def test_a_websocket_session_id_with_a_control_character_is_refused(fakes, token):
    from channels.testing import WebsocketCommunicator

    from console.asgi import application

    comm = WebsocketCommunicator(application, f"/ws/sessions/a%0Ab/?token={token}")
    await comm.connect(timeout=10)
    event = await comm.receive_json_from(timeout=5)
    assert event["type"] == "error" and event["code"] == "invalid_session_id"
    await comm.disconnect()
    assert sent(fakes) == 0
    async for node in Node.objects.all():
        assert node.consecutive_failures == 0
