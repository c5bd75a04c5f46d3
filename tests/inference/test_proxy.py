from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from inference.models import ApiToken, SessionRoute
from inference.services import policy_update
from nodes.models import Node
from tests.fakenode import refused_address
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"


def body(**extra) -> str:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra})


async def post(client: AsyncClient, data: str, headers: dict[str, str]):
    return await client.post(CHAT, data, content_type="application/json", headers=headers)


async def read_stream(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def error_of(response) -> dict:
    return json.loads(response.content)["error"]


async def test_it_rejects_a_missing_token(fakes):
    response = await post(AsyncClient(), body(), {})
    assert response.status_code == 401
    assert "Missing API token" in error_of(response)["message"]


async def test_it_rejects_a_wrong_token(fakes):
    response = await post(AsyncClient(), body(), {"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert error_of(response)["type"] == "authentication_error"


async def test_it_rejects_a_revoked_token(fakes, token, auth):
    await sync_to_async(ApiToken.objects.update)(revoked=True)
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 401
    assert "revoked" in error_of(response)["message"]


async def test_it_accepts_the_environment_token(fakes, monkeypatch):
    monkeypatch.setenv("PHALANX_API_TOKEN", "env-secret")
    response = await post(AsyncClient(), body(), {"Authorization": "Bearer env-secret"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("data", "status", "needle"),
    [
        ("{not json", 400, "not valid JSON"),
        ("[1, 2]", 400, "JSON object"),
        (json.dumps({"model": MODEL}), 400, "messages is required"),
        (json.dumps({"model": MODEL, "messages": []}), 400, "must not be empty"),
        (json.dumps({"model": MODEL, "messages": "hi"}), 400, "must be a list"),
        (
            json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}),
            400,
            "messages[0].content",
        ),
        (
            json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), 400, "model is required"),
        (body(max_tokens="ten"), 400, "max_tokens must be an integer"),
        (body(stream="yes"), 400, "stream must be a boolean"),
        (
            json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "'gpt-9'",
        ),
    ],
)
async def test_it_names_the_problem_with_bad_input(fakes, auth, data, status, needle):
    response = await post(AsyncClient(), data, auth)
    assert response.status_code == status
    assert needle in error_of(response)["message"]


async def test_it_answers_405_for_get_on_chat(fakes, auth):
    response = await AsyncClient().get(CHAT, headers=auth)
    assert response.status_code == 405


async def test_it_proxies_a_completion_and_names_the_node(fakes, auth):
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 200
    node = response["X-Phalanx-Node"]
    assert node in fakes
    assert json.loads(response.content)["choices"][0]["message"]["content"] == "Hello!"
    assert fakes[node].requests[0]["body"]["model"] == MODEL


async def test_it_pins_a_session_and_forwards_its_key(fakes, auth):
    client = AsyncClient()
    headers = {**auth, "X-Session-Id": "sess-1"}
    first = await post(client, body(), headers)
    second = await post(client, body(), headers)
    assert first["X-Phalanx-Node"] == second["X-Phalanx-Node"]
    node = fakes[first["X-Phalanx-Node"]]
    assert [r["session"] for r in node.requests] == ["sess-1", "sess-1"]
    route = await SessionRoute.objects.select_related("node").aget(session_id="sess-1")
    assert route.node.node_id == first["X-Phalanx-Node"]
    assert route.turns == 2
    decisions = [d.reason async for d in route.decisions.all()]
    assert len(decisions) == 1 and decisions[0].startswith("placed on ")


async def test_it_accepts_a_session_header_alias(fakes, auth):
    await post(AsyncClient(), body(), {**auth, "X-Session-Affinity": "alias-1"})
    assert await SessionRoute.objects.filter(session_id="alias-1").aexists()


async def test_it_spreads_new_sessions_over_idle_nodes(fakes, auth):
    client = AsyncClient()
    nodes = {
        (await post(client, body(), {**auth, "X-Session-Id": f"s{i}"}))["X-Phalanx-Node"]
        for i in range(4)
    }
    assert nodes == {"node-01", "node-02"}


async def test_it_does_not_pin_requests_without_a_session_key(fakes, auth):
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 200
    assert not await SessionRoute.objects.aexists()
    assert fakes[response["X-Phalanx-Node"]].requests[0]["session"] is None


async def test_it_streams_sse_through(fakes, auth):
    response = await post(AsyncClient(), body(stream=True), {**auth, "X-Session-Id": "st"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["X-Phalanx-Node"] in fakes
    text = (await read_stream(response)).decode()
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:3]]
    assert deltas == ["Hel", "lo", "!"]
    assert events[-1] == "[DONE]"


async def test_it_retries_on_another_node_before_the_first_byte(fakes, auth):
    await sync_to_async(Node.objects.filter(node_id="node-01").update)(address=refused_address())
    await sync_to_async(Node.objects.filter(node_id="node-02").update)(last_seen_load={"load": 0.9})
    response = await post(AsyncClient(), body(stream=True), {**auth, "X-Session-Id": "retry"})
    assert response.status_code == 200
    assert response["X-Phalanx-Node"] == "node-02"
    assert b"[DONE]" in await read_stream(response)
    failed = await Node.objects.aget(node_id="node-01")
    assert failed.consecutive_failures == 1
    route = await SessionRoute.objects.aget(session_id="retry")
    reasons = [d.reason async for d in route.decisions.all()]
    assert reasons[-1].startswith("moved to node-02: node-01 unreachable")
    assert route.moves == 1 and route.turns == 1


async def test_it_moves_a_session_when_its_node_goes_down(fakes, auth):
    client = AsyncClient()
    headers = {**auth, "X-Session-Id": "failover"}
    first = (await post(client, body(), headers))["X-Phalanx-Node"]
    await sync_to_async(Node.objects.filter(node_id=first).update)(state=Node.State.DOWN)
    second = (await post(client, body(), headers))["X-Phalanx-Node"]
    assert second != first
    route = await SessionRoute.objects.aget(session_id="failover")
    reasons = [d.reason async for d in route.decisions.all()]
    assert reasons[-1] == f"moved to {second}: {first} down"


async def test_it_ends_a_broken_stream_with_an_error_event(fakes, auth):
    for fake in fakes.values():
        fake.break_after = 1
    response = await post(AsyncClient(), body(stream=True), auth)
    assert response.status_code == 200
    text = (await read_stream(response)).decode()
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hel"
    assert "broke off the stream" in json.loads(events[-2])["error"]["message"]
    assert events[-1] == "[DONE]"


async def test_it_answers_503_with_retry_after_when_no_node_is_up(fakes, auth):
    await sync_to_async(Node.objects.update)(state=Node.State.DOWN)
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert "no healthy node" in error_of(response)["message"]


async def test_it_answers_503_when_every_node_is_busy(fakes, auth):
    for fake in fakes.values():
        fake.chat_status = 503
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 503
    assert "Retry-After" in response
    assert "answered 503" in error_of(response)["message"]


async def test_it_passes_a_node_4xx_through(fakes, auth):
    for fake in fakes.values():
        fake.chat_status = 400
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 400
    assert response["X-Phalanx-Node"] in fakes


async def test_it_lists_the_models_of_healthy_nodes(fakes, auth):
    response = await AsyncClient().get("/v1/models", headers=auth)
    assert response.status_code == 200
    data = json.loads(response.content)
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == [MODEL]
    await sync_to_async(Node.objects.update)(state=Node.State.DOWN)
    data = json.loads((await AsyncClient().get("/v1/models", headers=auth)).content)
    assert data["data"] == []


async def test_it_requires_a_token_for_models(fakes):
    response = await AsyncClient().get("/v1/models")
    assert response.status_code == 401


async def asgi_call(path: str, data: bytes, headers: dict[str, str], *, leave_after_first=False):
    """One HTTP request through the production ASGI app (``console.asgi.application``: the body
    limit, the ``/v1/`` bare handler, daphne's view of Django), as daphne would drive it.

    Returns ``(status, headers, body)``; with ``leave_after_first`` the client disconnects as
    soon as the first body bytes arrive."""
    import asyncio

    from console.asgi import application

    gone = asyncio.Event()
    sent_request = False
    started: dict = {}
    chunks: list[bytes] = []

    async def receive():
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": data, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if leave_after_first and message.get("body"):
                gone.set()
            if not message.get("more_body"):
                gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await asyncio.wait_for(application(scope, receive, send), timeout=30)
    response_headers = {k.decode().lower(): v.decode() for k, v in started.get("headers", [])}
    return started.get("status"), response_headers, b"".join(chunks)


JSON = {"Content-Type": "application/json"}


async def test_the_production_app_streams_a_chat_through_the_bare_handler(fakes, auth):
    for fake in fakes.values():
        fake.tokens = ["Hel", "lo"]
    status, headers, data = await asgi_call(
        CHAT, body(stream=True).encode(), {**auth, **JSON, "X-Session-Id": "prod-1"}
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-phalanx-node"] in fakes
    events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        (c.get("delta") or {}).get("content") or ""
        for e in events[:-1]
        for c in json.loads(e)["choices"]
    )
    assert text == "Hello"


async def test_the_production_app_refuses_without_a_token_and_past_the_body_limit(fakes, auth):
    status, _, data = await asgi_call(CHAT, body().encode(), JSON)
    assert status == 401 and b"Missing API token" in data
    huge = body(stop=["x" * (9 << 20)]).encode()
    status, _, data = await asgi_call(CHAT, huge, {**auth, **JSON})
    assert status == 413 and b"over the limit" in data
    status, _, data = await asgi_call(CHAT, b"{not json", {**auth, **JSON})
    assert status == 400 and json.loads(data)["error"]["code"] == "invalid_json"


async def test_it_closes_the_upstream_when_the_client_goes_away(fakes, auth):
    import asyncio

    for fake in fakes.values():
        fake.tokens, fake.token_delay = ["x"] * 500, 0.01
    status, _, _ = await asgi_call(
        CHAT, body(stream=True).encode(), {**auth, **JSON}, leave_after_first=True
    )
    assert status == 200
    for _ in range(300):
        if sum(f.disconnects for f in fakes.values()) == 1:
            break
        await asyncio.sleep(0.02)
    assert sum(f.disconnects for f in fakes.values()) == 1


async def test_a_burst_of_new_sessions_spreads_before_any_route_is_written(fakes, auth):
    import asyncio

    for fake in fakes.values():
        fake.tokens, fake.token_delay = ["x"] * 5, 0.05
    client = AsyncClient()
    responses = await asyncio.gather(
        *(post(client, body(), {**auth, "X-Session-Id": f"burst-{i}"}) for i in range(8))
    )
    placed = [r["X-Phalanx-Node"] for r in responses]
    assert sorted(placed.count(node) for node in fakes) == [4, 4]
    pinned = await sync_to_async(
        lambda: sorted(
            SessionRoute.objects.filter(session_id__startswith="burst-").values_list(
                "node__node_id", flat=True
            )
        )
    )()
    assert pinned == sorted(placed)


async def test_a_revoked_token_stops_working_at_the_next_request(fakes, token, auth):
    from inference.tokens import token_revoke

    assert (await post(AsyncClient(), body(), auth)).status_code == 200
    token_id = await ApiToken.objects.values_list("pk", flat=True).aget()
    await sync_to_async(token_revoke)(token_id=token_id)
    response = await post(AsyncClient(), body(), auth)
    assert response.status_code == 401
    assert "revoked" in error_of(response)["message"]


async def test_a_policy_change_applies_to_the_next_request(fakes, auth):
    from inference.services import policy_update

    headers = {**auth, "X-Custom-Session": "c-1"}
    await post(AsyncClient(), body(), headers)  # the policy is now cached
    assert not await SessionRoute.objects.filter(session_id="c-1").aexists()
    await sync_to_async(policy_update)(changes={"session_header": "X-Custom-Session"})
    await post(AsyncClient(), body(), headers)
    assert await SessionRoute.objects.filter(session_id="c-1").aexists()


async def test_it_serves_a_hard_coded_model_name_through_an_alias_or_the_default(fakes, auth):
    unknown = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
    assert (await post(AsyncClient(), unknown, auth)).status_code == 404
    await sync_to_async(policy_update)(changes={"model_aliases": {"gpt-4o-mini": MODEL}})
    aliased = await post(AsyncClient(), unknown, auth)
    assert aliased.status_code == 200
    served = fakes[aliased["X-Phalanx-Node"]].requests[-1]["body"]
    assert served["model"] == MODEL  # the node is asked for the package it serves
    other = json.dumps({"model": "claude-x", "messages": [{"role": "user", "content": "x"}]})
    assert (await post(AsyncClient(), other, auth)).status_code == 404
    await sync_to_async(policy_update)(changes={"default_model": MODEL})
    assert (await post(AsyncClient(), other, auth)).status_code == 200


async def test_a_busy_pinned_node_answers_node_busy_without_moving_the_session(fakes, auth):
    first = await post(AsyncClient(), body(), {**auth, "X-Session-Id": "pinned-busy"})
    node = first["X-Phalanx-Node"]
    fakes[node].chat_status = 503  # its queue is full
    busy = await post(AsyncClient(), body(), {**auth, "X-Session-Id": "pinned-busy"})
    assert busy.status_code == 503 and busy["Retry-After"] == "1"
    assert error_of(busy)["code"] == "node_busy"
    route = await SessionRoute.objects.select_related("node").aget(session_id="pinned-busy")
    assert route.node.node_id == node and route.moves == 0  # it keeps its node and its KV
    assert (await Node.objects.aget(node_id=node)).consecutive_failures == 0
    other = next(n for n in fakes if n != node)
    assert len(fakes[other].requests) == 0


async def _hold_the_only_slot(fakes, auth):
    """``max_inflight`` 1, taken by a stream that stays open (200 slow tokens); returns it."""
    await sync_to_async(policy_update)(changes={"max_inflight": 1})
    for fake in fakes.values():
        fake.tokens, fake.token_delay = ["x"] * 200, 0.02
    held = await post(AsyncClient(), body(stream=True), auth)
    assert held.status_code == 200
    return held


async def test_a_full_array_answers_429_with_retry_after_over_http_and_websocket(
    fakes, auth, token
):
    from channels.testing import WebsocketCommunicator

    from console.asgi import application

    held = await _hold_the_only_slot(fakes, auth)
    full = await post(AsyncClient(), body(), auth)
    assert full.status_code == 429 and int(full["Retry-After"]) >= 1
    assert error_of(full)["code"] == "array_full"
    comm = WebsocketCommunicator(application, f"/ws/sessions/full-ws/?token={token}")
    assert (await comm.connect(timeout=10))[0]
    await comm.send_json_to({"type": "user", "content": "hi"})
    event = await comm.receive_json_from(timeout=10)
    await comm.disconnect()
    assert event["type"] == "error" and event["code"] == "array_full" and event["retry_after"] >= 1
    held.close()  # the client goes: the stream, never read, is closed on this loop
    await asyncio.sleep(0.2)
    assert (await post(AsyncClient(), body(), auth)).status_code == 200


async def test_a_turn_refused_for_a_bad_cache_header_gives_its_slot_back(fakes, auth):
    """The turn is admitted (a slot of max_inflight) before its X-Phalanx-Cache header is read:
    the 400 for a bad one must hand the slot back, or the next turn finds the array full."""
    await sync_to_async(policy_update)(changes={"max_inflight": 1})
    bad = await AsyncClient().post(
        CHAT, body(), content_type="application/json", headers={**auth, "X-Phalanx-Cache": "x"}
    )
    assert bad.status_code == 400 and "X-Phalanx-Cache" in error_of(bad)["message"]
    ok = await post(AsyncClient(), body(), auth)
    assert ok.status_code == 200, ok.content


async def test_a_stream_dropped_before_its_first_byte_gives_its_slot_back(fakes, auth):
    """A client gone between the view's return and the send: Django never starts the
    response's generator (its finally never runs), yet the node connection, the slot of
    max_inflight and the usage lease must go back."""
    import gc

    held = await _hold_the_only_slot(fakes, auth)
    refused = await post(AsyncClient(), body(), auth)
    assert refused.status_code == 429
    del held
    gc.collect()
    await asyncio.sleep(0.2)
    ok = await post(AsyncClient(), body(), auth)
    assert ok.status_code == 200, ok.content
