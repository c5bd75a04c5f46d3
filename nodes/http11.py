"""A lean HTTP/1.1 transport for httpx, for the proxy's chat requests to nodes.

httpx's default transport (httpcore on anyio) cost the proxy about 4 ms of CPU per chat
request on a 2-core machine (py-spy over the control plane, issue 34): connection-pool locks,
anyio streams and a cancel scope per read, on the path to the first token. This one keeps what
the proxy needs and no more: asyncio streams, ``h11`` (the HTTP/1.1 state machine httpcore
uses too) for the protocol, keep-alive connections per address, timeouts from the request's
``timeout`` extension (``asyncio.timeout``). httpx stays the client on top (requests,
responses, event hooks, exceptions), so callers see no difference.

Errors are httpx's: ``ConnectError`` / ``ConnectTimeout`` (no connection), ``WriteError`` /
``WriteTimeout`` (sending the request), ``ReadTimeout`` (no bytes within the read timeout),
``RemoteProtocolError`` (the node closed the connection mid-answer or spoke bad HTTP),
``ReadError`` (the connection broke). An idle
connection is reused only while younger than ``KEEPALIVE_EXPIRY_S`` idle, when the node has not
closed it, and when nothing followed the last answer (an answer longer than its framing, from an
external server, would otherwise be read as the next one). Differences from httpcore: no cap on
concurrent connections (``httpx.Limits`` does not apply to a custom transport), h11's 16 KiB
limit on a response head, and a node that answers while the request body is still being sent
(an early 413) surfaces as ``WriteError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import h11
import httpx

READ_CHUNK = 65_536
MAX_IDLE_PER_ADDRESS = 64
KEEPALIVE_EXPIRY_S = 5.0  # httpx's default: well inside a node's own idle timeout (daphne: 60 s)


class _Connection:
    """One keep-alive TCP connection to ``address`` and its h11 state."""

    def __init__(
        self, address: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.address = address
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0  # time.monotonic() when it went back to the pool

    def usable(self, now: float) -> bool:
        """True when the connection is idle, younger than ``KEEPALIVE_EXPIRY_S`` idle, and the
        node has neither closed it nor sent anything since its last answer (stray bytes would
        be read as the next request's answer)."""
        return (
            now - self.idle_since < KEEPALIVE_EXPIRY_S
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and not self.reader._buffer  # asyncio's StreamReader has no public "buffered"
            and self.h11.our_state is h11.IDLE
        )

    def ended_cleanly(self) -> bool:
        """True when request and answer are both complete and nothing followed the answer."""
        return (
            self.h11.our_state is h11.DONE
            and self.h11.their_state is h11.DONE
            and self.h11.trailing_data == (b"", False)
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def send(self, request: httpx.Request, write_timeout: float | None) -> None:
        event = h11.Request(
            method=request.method, target=request.url.raw_path, headers=request.headers.raw
        )  # httpx put Host and Content-Length in the headers
        data = self.h11.send(event)
        async with asyncio.timeout(write_timeout):
            self.writer.write(data)
            async for part in request.stream:
                self.writer.write(self.h11.send(h11.Data(data=part)))
            self.writer.write(self.h11.send(h11.EndOfMessage()))
            await self.writer.drain()

    async def next_event(self, read_timeout: float | None) -> h11.Event:
        """The next h11 event, reading from the socket as needed."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            async with asyncio.timeout(read_timeout):
                data = await self.reader.read(READ_CHUNK)
            self.h11.receive_data(data)  # b"" is the node closing: h11 raises or ends


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection; handed back to the pool when read to the
    end, closed (the node sees the client leave) when closed before."""

    def __init__(self, transport: NodeTransport, conn: _Connection, read_timeout: float | None):
        self._transport, self._conn, self._timeout = transport, conn, read_timeout
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        request = httpx.Request("POST", "http://node")  # errors name no real request here
        while not self._done:
            try:
                event = await self._conn.next_event(self._timeout)
            except BaseException as exc:
                self._finish(reuse=False)
                _raise_as_httpx(exc, request)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self._finish(reuse=isinstance(event, h11.EndOfMessage))

    def _finish(self, *, reuse: bool) -> None:
        if self._done:
            return
        self._done = True
        self._transport.give_back(self._conn, reuse=reuse)

    async def aclose(self) -> None:
        self._finish(reuse=False)


class NodeTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncBaseTransport`` over asyncio streams and h11 (plain HTTP only), keeping up
    to ``MAX_IDLE_PER_ADDRESS`` idle connections per address. One per event loop."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        conn = await self._connection(request, timeouts.get("connect"))
        try:
            await conn.send(request, timeouts.get("write"))
        except BaseException as exc:
            conn.close()
            _raise_as_httpx(exc, request, writing=True)
        try:
            event = await conn.next_event(timeouts.get("read"))
            while isinstance(event, h11.InformationalResponse):
                event = await conn.next_event(timeouts.get("read"))
        except BaseException as exc:
            conn.close()
            _raise_as_httpx(exc, request)
        if not isinstance(event, h11.Response):
            conn.close()
            raise httpx.RemoteProtocolError(
                "the node closed the connection without answering", request=request
            )
        return httpx.Response(
            event.status_code,
            headers=event.headers.raw_items(),
            stream=_Body(self, conn, timeouts.get("read")),
            extensions={
                "http_version": b"HTTP/" + bytes(event.http_version),
                "reason_phrase": bytes(event.reason),
            },
            request=request,
        )

    async def _connection(
        self, request: httpx.Request, connect_timeout: float | None
    ) -> _Connection:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol("the node transport speaks plain http", request=request)
        address = (request.url.host, request.url.port or 80)
        idle, now = self._idle.get(address, []), time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        self._idle.pop(address, None)  # a node that went away leaves no entry behind
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(*address, limit=READ_CHUNK * 4)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"no connection within {connect_timeout} s", request=request
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return _Connection(address, reader, writer)

    def give_back(self, conn: _Connection, *, reuse: bool) -> None:
        """Keep ``conn`` for the next request when its exchange ended cleanly, else close it."""
        if reuse and conn.ended_cleanly():
            conn.h11.start_next_cycle()
            conn.idle_since = time.monotonic()
            idle = self._idle.setdefault(conn.address, [])
            if len(idle) < MAX_IDLE_PER_ADDRESS:
                idle.append(conn)
                return
        conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _raise_as_httpx(exc: BaseException, request: httpx.Request, *, writing: bool = False) -> None:
    """Raise ``exc`` as the httpx error a caller of httpx expects (cancellation and httpx's
    own errors as they are); ``writing``: it happened while sending the request."""
    if isinstance(exc, asyncio.CancelledError | httpx.HTTPError):
        raise exc
    if isinstance(exc, TimeoutError):
        timeout = httpx.WriteTimeout if writing else httpx.ReadTimeout
        raise timeout(
            f"no progress within the {'write' if writing else 'read'} timeout", request=request
        ) from exc
    if isinstance(exc, h11.RemoteProtocolError):
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    if isinstance(exc, h11.LocalProtocolError):
        raise httpx.LocalProtocolError(str(exc), request=request) from exc
    if isinstance(exc, OSError):
        error = httpx.WriteError if writing else httpx.ReadError
        raise error(str(exc) or type(exc).__name__, request=request) from exc
    raise exc
