"""Bounded input on a real control plane (``manage.py serve``): oversized websocket messages
close with 1009, oversized HTTP bodies get 413, refused websocket origins are logged."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.support.processes import Proc, control_plane_at_home

pytestmark = pytest.mark.e2e
MIB = 1 << 20


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[tuple[Proc, str]]:
    proc, token, _ = control_plane_at_home(tmp_path_factory.mktemp("limits-home"))
    yield proc, token
    proc.stop()


def test_a_websocket_message_over_the_limit_closes_with_1009(plane) -> None:
    proc, token = plane
    url = proc.url.replace("http://", "ws://") + f"/ws/sessions/big/?token={token}"
    with connect(url, max_size=None) as ws:
        ws.send(json.dumps({"type": "user", "content": "x" * (2 * MIB)}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None, "the server dropped the connection without a close"
    assert closed.value.rcvd.code == 1009
    assert "exceeds payload limit" in closed.value.rcvd.reason


def test_an_http_body_over_the_limit_gets_413(plane) -> None:
    proc, token = plane
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for path in ("/v1/chat/completions", "/api/config"):
        response = httpx.post(f"{proc.url}{path}", content=b" " * (9 * MIB), headers=auth)
        assert response.status_code == 413, path
        assert "over the limit" in response.json()["error"]["message"]

    def chunked():
        for _ in range(9):
            yield b" " * MIB

    response = httpx.post(f"{proc.url}/v1/chat/completions", content=chunked(), headers=auth)
    assert response.status_code == 413


def test_a_refused_websocket_origin_is_logged_with_the_reason(plane) -> None:
    proc, token = plane
    url = proc.url.replace("http://", "ws://") + f"/ws/sessions/o/?token={token}"
    with pytest.raises(InvalidStatus):
        with connect(url, origin="http://evil.example"):
            pass
    assert "websocket refused: Origin http://evil.example" in proc.log()
