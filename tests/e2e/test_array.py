"""End to end: ``manage.py up`` with two real node agents and the real bundled model on loopback.

Chats through the control plane with the ``openai`` package and over the session websocket, and
checks pinning, spreading, KV reuse on the second turn and failover after a node is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI
from websockets.sync.client import connect

from nodes.credentials import credential_for
from tests.support.processes import (
    bundled_model_path,
    control_plane_at_home,
    free_port,
    free_port_block,
    spawn,
    wait_healthy,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]
TOKEN = "phx_e2e_test_token_0123456789"
ARRAY_SECRET = "e2e-array-node-secret"
MODEL = "smollm2-135m-instruct-q4_1"


@pytest.fixture(scope="module")
def array(tmp_path_factory):
    home = tmp_path_factory.mktemp("phalanx-home")
    (home / "models").mkdir()
    model = bundled_model_path()
    (home / "models" / model.name).symlink_to(model)
    port = free_port()
    node_port = free_port_block(2, avoid=(port,))  # the nodes take node_port and the next
    env = {
        "PHALANX_HOME": str(home),
        "PHALANX_API_TOKEN": TOKEN,
        "PHALANX_ADMIN_PASSWORD": "e2e-pass",
        "PHALANX_NODE_SECRET": ARRAY_SECRET,  # an array of its own, not the tests' secret
    }
    proc = spawn(
        [
            sys.executable,
            "manage.py",
            "up",
            "--nodes",
            "2",
            "--port",
            str(port),
            "--node-port",
            str(node_port),
        ],
        home / "up.log",
        env=env,
    )
    try:
        nodes = [f"http://127.0.0.1:{node_port + i}" for i in range(2)]
        for url in nodes:
            wait_healthy(url, proc)
        base = f"http://127.0.0.1:{port}"
        # the control loop marks both nodes up, with a load, and validates them one at a time
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:  # the nodes may answer before the control plane listens (a busy machine)
                listed = httpx.get(
                    f"{base}/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"}
                )
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            if listed.status_code == 200 and all(
                n["state"] == "up" and n["validation"] in ("passed", "warned")
                for n in listed.json()
            ):
                break
            time.sleep(0.5)
        yield {"base": base, "port": port, "nodes": nodes, "proc": proc}
    finally:
        proc.stop(timeout=20)
        assert proc.popen.returncode is not None


def client(array) -> OpenAI:
    return OpenAI(base_url=f"{array['base']}/v1", api_key=TOKEN, max_retries=0, timeout=120)


def turn(array, session: str, messages: list[dict]) -> tuple[str, dict]:
    raw = client(array).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        extra_headers={"X-Session-Id": session},
    )
    completion = raw.parse()
    return raw.headers["x-phalanx-node"], completion.model_dump()


def test_it_keeps_a_session_on_one_node_and_reuses_its_kv(array) -> None:
    history = [{"role": "user", "content": "Name a planet."}]
    node1, first = turn(array, "e2e-pin", history)
    history += [first["choices"][0]["message"], {"role": "user", "content": "Another one?"}]
    node2, second = turn(array, "e2e-pin", history)
    assert node1 == node2
    assert (
        second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    )


def both_nodes_measured(array, timeout: float = 90.0) -> None:
    """Wait until both nodes are up with a load from a recent probe: routing never takes a node
    whose load it does not know for idle, so a node whose last probe timed out (a busy
    machine) draws no new session until it is measured again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = httpx.get(
            f"{array['base']}/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        if all(
            n["state"] == "up" and n["load"] is not None and n["validation"] in ("passed", "warned")
            for n in nodes
        ):
            return
        time.sleep(0.5)
    raise AssertionError(f"both nodes were not up and measured: {nodes}")


def test_it_spreads_new_sessions_over_both_nodes(array) -> None:
    both_nodes_measured(array)
    seen = {
        turn(array, f"e2e-spread-{i}", [{"role": "user", "content": "Hi"}])[0] for i in range(4)
    }
    assert seen == {"node-01", "node-02"}


def test_it_spreads_sessions_that_arrive_together(array) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> str:
        r = await client.post(
            f"{array['base']}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {TOKEN}", "X-Session-Id": f"e2e-burst-{i}"},
        )
        assert r.status_code == 200, r.text
        return r.headers["x-phalanx-node"]

    async def burst() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(8)))

    nodes = asyncio.run(burst())
    assert min(nodes.count("node-01"), nodes.count("node-02")) >= 3, nodes


def test_it_streams_token_by_token_through_the_sdk(array) -> None:
    stream = client(array).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a short poem."}],
        max_tokens=24,
        stream=True,
        extra_headers={"X-Session-Id": "e2e-stream"},
    )
    deltas = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 5


def test_it_chats_over_the_websocket_with_a_server_side_transcript(array) -> None:
    url = f"ws://127.0.0.1:{array['port']}/ws/sessions/e2e-ws/?token={TOKEN}"
    done_events = []
    with connect(url) as ws:
        for text in ("Name a colour.", "And another?"):
            ws.send(json.dumps({"type": "user", "content": text, "max_tokens": 12}))
            deltas = []
            while True:
                event = json.loads(ws.recv(timeout=120))
                if event["type"] == "delta":
                    deltas.append(event["content"])
                else:
                    break
            assert event["type"] == "done", event
            assert "".join(deltas) == event["content"]
            done_events.append(event)
    assert done_events[0]["node"] == done_events[1]["node"]
    first, second = (e["usage"] for e in done_events)
    # the server kept the transcript: turn 2's prompt holds turn 1's prompt and reply ...
    assert second["prompt_tokens"] >= first["prompt_tokens"] + first["completion_tokens"]
    # ... and the node reused turn 1's KV for all of turn 1's prompt (not only a shared
    # system prompt, which any two prompts on this model have in common)
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"]


def test_it_answers_an_unpaired_surrogate_with_400_and_an_error_event(array) -> None:
    raw = b'{"model": "smollm2-135m-instruct-q4_1", "messages": [{"role": "user", "content": "\\ud800"}]}'
    r = httpx.post(
        f"{array['base']}/v1/chat/completions",
        content=raw,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
    with connect(f"ws://127.0.0.1:{array['port']}/ws/sessions/e2e-bad/?token={TOKEN}") as ws:
        ws.send('{"type": "user", "content": "\\ud800"}')
        event = json.loads(ws.recv(timeout=30))
    assert event["type"] == "error" and "surrogate" in event["message"]


def test_it_rejects_a_wrong_token(array) -> None:
    r = httpx.post(
        f"{array['base']}/v1/chat/completions",
        headers={"Authorization": "Bearer nope"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 401 and r.json()["error"]["message"]


def test_it_moves_a_session_when_its_node_is_killed(array) -> None:
    history = [{"role": "user", "content": "Tell me about cats."}]
    node, first = turn(array, "e2e-failover", history)
    index = int(node[-2:]) - 1
    pid = httpx.get(f"{array['nodes'][index]}/health").json().get("pid")
    assert pid, "node /health reports its pid"
    os.kill(pid, signal.SIGKILL)
    history += [first["choices"][0]["message"], {"role": "user", "content": "And dogs?"}]
    moved_to, second = turn(array, "e2e-failover", history)
    assert moved_to != node
    assert second["choices"][0]["message"]["content"]


def test_up_restarts_a_node_agent_that_exits(array) -> None:
    url = array["nodes"][1]
    wait_healthy(url, array["proc"])  # the test before may have killed it: it comes back
    pid = httpx.get(f"{url}/health").json()["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{url}/health", timeout=1).json()
            if health.get("status") == "ok" and health["pid"] != pid:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        raise AssertionError("the node agent did not come back")
    events = httpx.get(
        f"{array['base']}/api/nodes/node-02/events",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ).json()
    restarts = [e for e in events if e["kind"] == "restarted"]
    assert restarts and "exited with status -9" in restarts[0]["message"]


def test_another_array_never_takes_this_arrays_node(array, tmp_path) -> None:
    """A second control plane on the machine (its own home and node secret) is told this
    array's node address: its control loop refuses the node, and its proxy never reaches it."""
    setup = (
        "from console.embedded import package_register_bundled\n"
        "from tests.support.processes import bundled_model_path\n"
        "package_register_bundled(bundled_model_path())"
    )
    plane, token, extra = control_plane_at_home(tmp_path / "other-array", setup=setup)
    try:
        address = array["nodes"][0].removeprefix("http://")
        auth = {"Authorization": f"Bearer {token}"}
        put = httpx.put(
            f"{plane.url}/api/nodes/node-01",
            json={"node_id": "node-01", "address": address, "package": f"{MODEL}:1"},
            headers=auth,
        )
        assert put.status_code in (200, 201), put.text
        subprocess.run(
            [sys.executable, "manage.py", "controlloop", "--once"],
            env={**os.environ, **extra},
            check=True,
            timeout=60,
        )
        node = httpx.get(f"{plane.url}/api/nodes/node-01", headers=auth).json()
        assert node["state"] != "up"
        assert "another array's node" in node["last_probe_error"]
        before = served(array, address)
        chat = httpx.post(
            f"{plane.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers=auth,
            timeout=30,
        )
        assert chat.status_code == 503
        assert served(array, address) == before
    finally:
        plane.stop()


def served(array, address: str) -> float:
    """The node's request count, read with this array's own credential for it."""
    headers = {"Authorization": f"Bearer {credential_for(ARRAY_SECRET, 'node-01')}"}
    text = httpx.get(f"http://{address}/metrics", headers=headers, timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("phalanx_node_requests_total"))
    return float(line.rsplit(" ", 1)[1])
