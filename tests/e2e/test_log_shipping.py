"""End to end: a real node agent that cannot reach its control plane keeps its log records in
its spool and ships every one of them, once, when the control plane comes up."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from tests.support.processes import (
    free_port,
    migrated_with_token,
    start_control_plane,
    start_node,
    wait_healthy,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]
NODE = "node-cut"
TURNS = 5


def records(base: str, token: str, **params) -> list[dict]:
    found = httpx.get(
        f"{base}/api/logs",
        params={"limit": 1000, **params},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert found.status_code == 200, found.text
    return found.json()["records"]


def test_a_cut_off_node_ships_its_spooled_records_when_the_control_plane_comes_up(tmp_path):
    port = free_port()
    home = {"PHALANX_HOME": str(tmp_path)}
    register = (
        "from nodes.models import Node\n"
        f"Node.objects.create(node_id={NODE!r}, address='127.0.0.1:1', state='up')\n"
    )
    env = {**os.environ, **home, "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("DATABASE_URL", None)
    token = migrated_with_token(env, register)
    ships = {**home, "PHALANX_LOGS_URL": f"http://127.0.0.1:{port}"}  # nobody listens yet
    node = start_node(NODE, tmp_path, env=ships)
    plane = None
    try:
        ids = [f"cut-{i}" for i in range(TURNS)]
        for request_id in ids:
            answer = httpx.post(
                f"{node.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                headers={**node.headers, "X-Request-Id": request_id},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
        spool = tmp_path / "log-spool" / f"{NODE}.jsonl"
        deadline = time.monotonic() + 20
        while not all(f'"{r}"' in _read(spool) for r in ids):
            assert time.monotonic() < deadline, "the node did not spool its records"
            time.sleep(0.3)
        spooled = _read(spool).splitlines()
        plane = start_control_plane(port, tmp_path, env=home)
        wait_healthy(plane.url, plane, timeout=60)
        deadline = time.monotonic() + 30
        while _read(spool).strip():
            assert time.monotonic() < deadline, "the spool was not shipped"
            time.sleep(0.3)
        kept = records(plane.url, token, node_id=NODE, process="runnode")
        answered = [r["request_id"] for r in kept if r["event"] == "chat answered"]
        assert sorted(answered) == ids  # every turn's line, once
        assert len(kept) >= len(spooled)  # nothing dropped under the bound
        shipped_events = {json.loads(line)["event"] for line in spooled}
        assert shipped_events <= {r["event"] for r in kept}
    finally:
        for proc in (plane, node):
            if proc is not None:
                proc.stop()


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
