"""A node's (or an external server's) error body nested past the JSON parser's depth is read as
text, never a RecursionError (a 500, or a websocket consumer that dies)."""

from __future__ import annotations

import httpx

from inference import consumers, node_refusals
from nodes import client

DEEP = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def test_the_proxy_reads_a_deep_error_body_as_text():
    response = httpx.Response(500, content=DEEP)
    assert node_refusals.error_message(response) == DEEP[:500].decode()
    assert client._error_message(response) == "HTTP 500"


def test_the_session_socket_reads_a_deep_error_body_as_text():
    error = consumers._node_error(400, DEEP, "node-01")
    assert error.status == 400 and error.code == "node_error"
    assert error.message == DEEP[:500].decode()
