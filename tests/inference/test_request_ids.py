"""One request id per chat turn (issue 31): kept from the client or minted at the proxy,
returned, sent to the node, kept by a migration, and on every log line of the turn."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from console.asgi import application
from console.lib import logs
from nodes.models import Node
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)


async def post(auth: dict, **headers) -> object:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = await AsyncClient().post(
        "/v1/chat/completions",
        json.dumps(body),
        content_type="application/json",
        headers={**auth, **headers},
    )
    if response.streaming:
        b"".join([c async for c in response.streaming_content])
    return response


@pytest.fixture
def records():
    """The JSON records every logger writes meanwhile (``console.lib.logs.formatter``)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter("json"))
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    root.removeHandler(handler)


async def test_a_turn_gets_an_id_returned_and_sent_to_the_node(fakes, auth, records):
    response = await post(auth, **{"X-Session-Id": "rid-1"})
    rid = response["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid)
    node = response["X-Phalanx-Node"]
    assert fakes[node].requests[-1]["request_id"] == rid
    closed = [r for r in records() if r["event"] == "answer closed"]
    assert closed[-1]["request_id"] == rid and closed[-1]["session_id"] == "rid-1"
    assert closed[-1]["node_id"] == node and closed[-1]["package"] == f"{MODEL}:1"
    assert closed[-1]["level"] == "info" and closed[-1]["time"]


async def test_a_clients_id_is_kept_and_a_bad_one_refused(fakes, auth):
    response = await post(auth, **{"X-Request-Id": "agent-7.turn:3"})
    assert response["X-Request-Id"] == "agent-7.turn:3"
    assert fakes[response["X-Phalanx-Node"]].requests[-1]["request_id"] == "agent-7.turn:3"
    bad = await post(auth, **{"X-Request-Id": "x" * 129})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Id"
    assert "1 to 128 letters" in bad.json()["error"]["message"]
    assert all(len(f.requests) == 1 for f in fakes.values() if f.requests)


async def test_a_migrated_answer_keeps_its_id_on_both_nodes(fakes, auth):
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(last_seen_load={"load": 0.9})
    fakes["node-01"].shape = "no_finish"
    response = await post(auth, **{"X-Request-Id": "cut-1", "X-Session-Id": "rid-cut"})
    assert [r["request_id"] for f in fakes.values() for r in f.requests] == ["cut-1", "cut-1"]
    assert fakes["node-02"].requests[-1]["body"]["continue_final_message"] is True
    assert response["X-Request-Id"] == "cut-1"


async def test_websocket_turns_name_their_request_id(fakes, token):
    comm = WebsocketCommunicator(application, f"/ws/sessions/rid-ws/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    done = []
    for message in ({"content": "hi", "request_id": "ws-turn-1"}, {"content": "again"}):
        await comm.send_json_to(message)
        events = [await comm.receive_json_from(timeout=10)]
        while events[-1]["type"] not in ("done", "error"):
            events.append(await comm.receive_json_from(timeout=10))
        done.append(events[-1])
    await comm.send_json_to({"content": "bad", "request_id": "has space"})
    error = await comm.receive_json_from(timeout=10)
    await comm.disconnect()
    assert [d["type"] for d in done] == ["done", "done"]
    assert done[0]["request_id"] == "ws-turn-1"
    assert re.fullmatch(r"[0-9a-f]{32}", done[1]["request_id"])
    sent = [r["request_id"] for f in fakes.values() for r in f.requests]
    assert sorted(sent) == sorted([d["request_id"] for d in done])
    assert error["type"] == "error" and error["param"] == "request_id"


@pytest.mark.parametrize("given", [0, False, [], {}, 5, "a b", "x" * 129, "é"])
def test_a_request_id_that_is_not_a_plain_token_is_refused(given):
    from inference.errors import BadRequest
    from inference.request_checks import request_id

    with pytest.raises(BadRequest, match="request_id must be 1 to 128"):
        request_id(given, where="request_id")
    assert request_id(None) != request_id("")  # absent or empty: a new one each time
