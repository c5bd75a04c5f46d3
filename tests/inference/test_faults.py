"""Fault tests with real node agents (the bundled model) on loopback, through the real proxy.

Each test states the failure, then checks what the client sees and what the routing table says.
Timings are never asserted; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from console.asgi import application
from inference.deadlines import CHARS_PER_TOKEN, uncached_prompt_chars
from inference.models import RouteDecision, RoutingPolicy, SessionRoute
from inference.relay import inflight
from nodes.control import ControlLoop
from nodes.models import Node
from nodes.services import node_drain
from tests.inference.conftest import NODE_ARGS, PACKAGE, inventory
from tests.support.processes import Proc, start_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.model]

LONG = "Count from 1 to 300, separated by commas."


def chat(content: str, max_tokens: int, **extra) -> str:
    return json.dumps(
        {
            "model": PACKAGE,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            **extra,
        }
    )


async def open_stream(token: str, session: str, max_tokens: int = 24, content: str = LONG):
    return await AsyncClient().post(
        "/v1/chat/completions",
        chat(content, max_tokens),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "X-Session-Id": session},
    )


async def read_all(response) -> str:
    return b"".join([c async for c in response.streaming_content]).decode()


def active_sequences(proc: Proc) -> int:
    return httpx.get(f"{proc.url}/health", timeout=5).json()["sequences_active"]


def cancelled(proc: Proc) -> float:
    """The node's ``phalanx_node_cancelled_total`` (requests cancelled by their client)."""
    for line in httpx.get(f"{proc.url}/metrics", headers=proc.headers, timeout=5).text.splitlines():
        if line.startswith("phalanx_node_cancelled_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no phalanx_node_cancelled_total")


async def settled(proc: Proc) -> int:
    """Active sequences once they drop to 0, or after 5 s (bounded poll)."""
    deadline = time.monotonic() + 5
    while active_sequences(proc) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return active_sequences(proc)


async def first_tokens(response) -> list[bytes]:
    """Read a streamed answer until its first content delta has arrived (bounded by the
    caller); returns the chunks read."""
    read = []
    async for chunk in response.streaming_content:
        read.append(chunk)
        if b'"content": "' in chunk and b'"content": ""' not in chunk:
            return read
    return read


def content_and_ends(text: str) -> tuple[str, list[dict], list[dict]]:
    """The streamed answer's text, its chunks that carry ``migrated``, and its error events."""
    events = [json.loads(e[6:]) for e in text.split("\n") if e.startswith("data: {")]
    deltas = [c.get("delta") or {} for e in events for c in e.get("choices") or []]
    text_out = "".join(d.get("content") or "" for d in deltas)
    return text_out, [e for e in events if "migrated" in e], [e for e in events if "error" in e]


def kept(responses: list) -> list:
    """The answers steady-1 served from start to end."""
    return [r for r in responses if r["X-Phalanx-Node"] == "steady-1"]


async def test_answers_cut_by_a_killed_node_go_on_on_the_other_as_one_stream(steady, log_dir):
    victim = start_node("victim", log_dir, extra_args=NODE_ARGS)
    try:
        token = await inventory(steady[0], victim)
        sessions = [f"kill-{i}" for i in range(6)]
        first = await asyncio.wait_for(
            asyncio.gather(*(open_stream(token, s, max_tokens=48) for s in sessions)), 120
        )
        on_victim = [r for r in first if r["X-Phalanx-Node"] == "victim"]
        assert on_victim, "placement should spread six sessions over two idle nodes"
        started = await asyncio.wait_for(asyncio.gather(*(first_tokens(r) for r in first)), 120)
        os.kill(victim.popen.pid, signal.SIGKILL)  # mid-stream: each has streamed a token
        rests = await asyncio.wait_for(asyncio.gather(*(read_all(r) for r in first)), 120)
        answers = [
            content_and_ends(b"".join(head).decode() + rest)
            for head, rest in zip(started, rests, strict=True)
        ]
        assert all(rest.rstrip().endswith("data: [DONE]") for rest in rests)
        assert [errors for _, _, errors in answers] == [[]] * 6  # 0 errors: a second node is up
        # the same prompt at temperature 0: an answer steady-1 wrote whole is the reference
        # (this model writes the digits 1234567890 over and over); a restarted or spliced
        # answer would repeat its start
        reference = next(c for r, (c, _, _) in zip(first, answers, strict=True) if r in kept(first))
        migrated = 0
        for response, (content, ends, _) in zip(first, answers, strict=True):
            assert content[:40] == reference[:40], (content, reference)
            if ends:
                migrated += 1
                assert response["X-Phalanx-Node"] == "victim"
                assert all(e["migrated"] == {"from": "victim", "to": "steady-1"} for e in ends)
        assert migrated == len(on_victim)
        # the sessions the victim held are on steady-1 now; their next turns stay there
        second = await asyncio.wait_for(
            asyncio.gather(*(open_stream(token, s, max_tokens=4) for s in sessions)), 120
        )
        assert [r.status_code for r in second] == [200] * len(sessions)
        texts = await asyncio.wait_for(asyncio.gather(*(read_all(r) for r in second)), 120)
        assert all('"error"' not in t for t in texts)
        assert {r["X-Phalanx-Node"] for r in second} == {"steady-1"}
        reasons = await sync_to_async(list)(
            RouteDecision.objects.filter(action="moved").values_list("reason", flat=True)
        )
        assert len(reasons) == len(on_victim)
        assert all(r.startswith("moved to steady-1: victim") for r in reasons)
    finally:
        victim.stop()


async def test_it_marks_a_stopped_node_down_and_moves_its_sessions(steady, log_dir):
    frozen = start_node("frozen", log_dir, extra_args=NODE_ARGS)
    try:
        token = await inventory(steady[0], frozen)
        policy = await sync_to_async(RoutingPolicy.load)()
        policy.health_interval_s, policy.probe_timeout_s, policy.failure_threshold = 0.5, 0.3, 2
        await sync_to_async(policy.save)()
        await sync_to_async(Node.objects.filter(node_id="steady-1").update)(
            last_seen_load={"load": 5.0}
        )
        response = await open_stream(token, "stop-1", max_tokens=2)
        assert response["X-Phalanx-Node"] == "frozen"
        await read_all(response)
        await sync_to_async(ControlLoop().tick)()
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        # a turn sent now waits on a process that accepts but never answers ...
        waiting = asyncio.ensure_future(open_stream(token, "stop-1", max_tokens=2))
        deadline = time.monotonic() + 30
        while inflight.per_node().get("frozen", 0) != 1:  # sent to frozen, waiting on it
            assert time.monotonic() < deadline and not waiting.done()
            await asyncio.sleep(0.02)
        assert not waiting.done()
        # ... two health checks (two intervals) time out and mark the node down ...
        loop = ControlLoop()
        for _ in range(2):
            await sync_to_async(loop.tick)()
        assert (await sync_to_async(Node.objects.get)(node_id="frozen")).state == "down"
        # ... and the waiting turn gives up on it and is answered elsewhere
        moved = await asyncio.wait_for(waiting, 30)
        assert moved.status_code == 200 and moved["X-Phalanx-Node"] == "steady-1"
        assert '"error"' not in await read_all(moved)
        route = await sync_to_async(SessionRoute.objects.select_related("node").get)(
            session_id="stop-1"
        )
        assert route.node.node_id == "steady-1" and route.moves == 1
        reasons = await sync_to_async(list)(route.decisions.values_list("reason", flat=True))
        # it moved *while waiting* (the wait saw the node go down), not at a later routing
        assert "moved to steady-1: frozen went down while the request waited" in reasons
    finally:
        os.kill(frozen.popen.pid, signal.SIGCONT)
        frozen.stop()


async def test_it_drains_a_node_under_load_without_cutting_streams(steady):
    token = await inventory(*steady)
    sessions = [f"drain-{i}" for i in range(4)]
    # each session its own prompt prefix: cached tokens can only come from its own KV
    prompts = {s: f"[{s} asks] {LONG}" for s in sessions}
    responses = await asyncio.wait_for(
        asyncio.gather(
            *(open_stream(token, s, max_tokens=32, content=prompts[s]) for s in sessions)
        ),
        120,
    )
    drained = responses[0]["X-Phalanx-Node"]
    await sync_to_async(node_drain)(node_id=drained)
    bodies = await asyncio.wait_for(asyncio.gather(*(read_all(r) for r in responses)), 120)
    assert all('"error"' not in b and b.rstrip().endswith("[DONE]") for b in bodies)
    first_usage = {s: usage_of(b) for s, b in zip(sessions, bodies, strict=True)}
    # the drained node's sessions move at their next turn and take their KV along
    mine = [s for s, r in zip(sessions, responses, strict=True) if r["X-Phalanx-Node"] == drained]
    old = next(p for p in steady if p.log_path.stem == drained)
    for session in mine:
        again = await open_stream(token, session, max_tokens=2, content=prompts[session])
        assert again["X-Phalanx-Node"] != drained
        usage = usage_of(await read_all(again))
        # reused on the new node: all of the first turn's prompt was cached there ...
        assert usage["prompt_tokens_details"]["cached_tokens"] >= (
            first_usage[session]["prompt_tokens"] - 2
        )
        # ... and erased on the node it left
        held = httpx.get(f"{old.url}/sessions/{session}", headers=old.headers, timeout=5)
        assert held.status_code == 404
    kinds = await sync_to_async(list)(
        RouteDecision.objects.filter(route__session_id__in=mine).values_list("action", flat=True)
    )
    assert kinds.count("moved") == len(mine)
    assert kinds.count("kv_moved") == len(mine)


def usage_of(text: str) -> dict:
    """The ``usage`` of a streamed answer (its last chunk before ``[DONE]`` carries it)."""
    for event in text.split("\n\n"):
        if event.startswith("data: {") and '"usage"' in event:
            return json.loads(event[6:])["usage"]
    raise AssertionError("no usage in the stream")


async def test_it_cancels_generation_when_an_sse_client_goes_away(steady):
    """Through the ASGI application, as the server runs it: the client's ``http.disconnect``."""
    token = await inventory(steady[0])
    gone = asyncio.Event()
    body = chat(LONG, 400).encode()
    chunks: list[bytes] = []
    received = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if received:
            return received.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            chunks.append(message["body"])
            if len(chunks) == 3:
                gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"x-session-id", b"gone-sse"),
        ],
    }
    before = cancelled(steady[0])
    app = asyncio.ensure_future(application(scope, receive, send))
    await asyncio.wait_for(gone.wait(), 60)
    await asyncio.wait_for(app, 30)  # the handler ends once the client is gone
    assert await settled(steady[0]) == 0
    assert b"[DONE]" not in b"".join(chunks)
    assert cancelled(steady[0]) == before + 1  # stopped by the disconnect, not finished


async def test_it_cancels_generation_when_a_websocket_client_goes_away(steady):
    token = await inventory(steady[0])
    comm = WebsocketCommunicator(application, f"/ws/sessions/gone-ws/?token={token}")
    connected, _ = await comm.connect()
    assert connected
    before = cancelled(steady[0])
    await comm.send_json_to({"type": "user", "content": LONG, "max_tokens": 400})
    for _ in range(3):
        event = await comm.receive_json_from(timeout=30)
        assert event["type"] == "delta", event
    await comm.disconnect()
    assert await settled(steady[0]) == 0
    assert cancelled(steady[0]) == before + 1  # stopped by the disconnect, not finished


async def test_concurrent_turns_of_a_moving_session_wait_for_its_kv(steady):
    token = await inventory(*steady)
    first = await open_stream(token, "mover", max_tokens=8)
    await read_all(first)
    drained = first["X-Phalanx-Node"]
    await sync_to_async(node_drain)(node_id=drained)
    turns = await asyncio.wait_for(
        asyncio.gather(*(open_stream(token, "mover", max_tokens=4) for _ in range(3))), 120
    )
    bodies = await asyncio.wait_for(asyncio.gather(*(read_all(r) for r in turns)), 120)
    assert all(r["X-Phalanx-Node"] != drained for r in turns)
    assert all(b.rstrip().endswith("[DONE]") and '"error"' not in b for b in bodies)
    kinds = await sync_to_async(list)(
        RouteDecision.objects.filter(route__session_id="mover").values_list("action", flat=True)
    )
    assert kinds.count("moved") == 1
    assert kinds.count("kv_moved") == 1


async def test_a_long_real_prefill_is_not_taken_for_a_silent_node(steady):
    token = await inventory(steady[0])
    policy = await sync_to_async(RoutingPolicy.load)()
    policy.first_byte_floor_s = 0.1  # the estimate alone must cover the prefill
    await sync_to_async(policy.save)()
    prompt = " ".join(f"item {i} is {LONG[: 10 + i % 20]};" for i in range(60))
    response = await AsyncClient().post(
        "/v1/chat/completions",
        chat(prompt, 2, stream_options={"include_usage": True}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "X-Session-Id": "long-prefill"},
    )
    assert response.status_code == 200, response.content
    text = await read_all(response)
    assert '"error"' not in text
    usage = usage_of(text)
    assert usage["prompt_tokens"] > 700 and usage["prompt_tokens_details"]["cached_tokens"] < 100
    # the deadline's token estimate never counts fewer tokens than the node prefilled
    assert uncached_prompt_chars([{"content": prompt}], cached_on_node=False) / CHARS_PER_TOKEN >= (
        usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] - 40
    )
    reasons = await sync_to_async(list)(
        RouteDecision.objects.filter(route__session_id="long-prefill").values_list(
            "reason", flat=True
        )
    )
    assert not any("no first byte" in r for r in reasons)
