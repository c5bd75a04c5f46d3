"""The proxy's transport to nodes (``nodes.http11``) against a real HTTP server on loopback:
keep-alive reuse, a streamed chunked body, an answer left unread dropping its connection (how
a node learns its client left), and each failure as the httpx error callers handle."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest

from nodes.http11 import NodeTransport


class Node:
    """A tiny HTTP/1.1 server: ``script`` says what each request gets."""

    def __init__(self, script: str) -> None:
        self.script = script
        self.connections = 0
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if not await self._answer(reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to end."""
        if self.script == "silent":
            await asyncio.sleep(5)
            return False
        if self.script == "overlong":  # more than its Content-Length says, then a stray answer
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Node: n1\r\n\r\nbodySTALE")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Node: n1\r\n\r\nstale")
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Node: n1\r\n\r\n")
        for part in (b"data: one\n\n", b"data: two\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        if self.script == "cut":
            return False  # closed mid-answer: no last chunk
        if self.script == "endless":
            with contextlib.suppress(ConnectionError):
                while True:  # until the client goes
                    writer.write(b"7\r\ndata: x\r\n")
                    await writer.drain()
                    if await _closed(reader):
                        self.closed_by_client.set()
                        return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return self.script != "close-after"


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 0.01) == b""
    except TimeoutError:
        return False


def _client(read_timeout: float = 2.0) -> httpx.AsyncClient:
    timeout = httpx.Timeout(read_timeout, connect=1.0)
    return httpx.AsyncClient(transport=NodeTransport(), timeout=timeout)


async def _chat(client: httpx.AsyncClient, url: str) -> tuple[int, str, bytes]:
    async with client.stream("POST", f"{url}/v1/chat/completions", json={"x": 1}) as response:
        body = b"".join([part async for part in response.aiter_raw()])
        return response.status_code, response.headers["x-node"], body


def _against(script: str, steps: Callable[..., Awaitable[None]], read_timeout: float = 2.0):
    """Run ``steps(node, url, client)`` against a ``Node`` playing ``script``; the node after."""
    node = Node(script)

    async def go() -> None:
        url = await node.start()
        async with _client(read_timeout) as client:
            await steps(node, url, client)

    asyncio.run(go())
    return node


WHOLE = (200, "n1", b"data: one\n\ndata: two\n\n")


def test_answers_stream_whole_and_one_connection_serves_them_in_turn():
    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        for _ in range(3):
            assert await _chat(client, url) == WHOLE

    assert _against("ok", steps).connections == 1


def test_a_connection_the_node_closed_while_idle_is_not_reused():
    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        assert await _chat(client, url) == WHOLE
        await asyncio.sleep(0.05)  # the node's FIN arrives
        assert await _chat(client, url) == WHOLE

    assert _against("close-after", steps).connections == 2


def test_bytes_after_an_answer_never_become_the_next_requests_answer():
    """An external server that sends more than its framing says (or a stray answer later):
    the connection is not reused, so the next request, maybe another caller's, gets its own."""

    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        assert await _chat(client, url) == (200, "n1", b"body")
        await asyncio.sleep(0.2)  # the stray answer arrives while the connection is idle
        assert await _chat(client, url) == (200, "n1", b"body")
        node.script = "ok"
        await asyncio.sleep(0.2)
        assert await _chat(client, url) == WHOLE

    assert _against("overlong", steps).connections == 3


def test_an_answer_closed_before_its_end_drops_the_connection_so_the_node_sees_it():
    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{url}/v1/chat/completions", json={}) as response:
            async for _ in response.aiter_raw():
                break
        await asyncio.wait_for(node.closed_by_client.wait(), 2)
        node.script = "ok"
        assert await _chat(client, url) == WHOLE

    assert _against("endless", steps).connections == 2


def test_a_node_that_closes_mid_answer_is_a_remote_protocol_error():
    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        with pytest.raises(httpx.RemoteProtocolError):
            await _chat(client, url)

    _against("cut", steps)


def test_no_answer_within_the_read_timeout_is_a_read_timeout():
    async def steps(node: Node, url: str, client: httpx.AsyncClient) -> None:
        with pytest.raises(httpx.ReadTimeout):
            await _chat(client, url)

    _against("silent", steps, read_timeout=0.2)


def test_nothing_listening_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused

        async def go() -> None:
            async with _client() as client:
                with pytest.raises(httpx.ConnectError):
                    await _chat(client, f"http://127.0.0.1:{port}")

        asyncio.run(go())
