"""A tiny fake node agent for control-plane tests: speaks enough of docs/node-protocol.md.

Runs a threaded HTTP/1.1 server on a free loopback port. Streams are sent chunked, so closing the
socket mid-way looks like a broken stream to the client. Every chat request is recorded.
``shape`` makes a streamed answer misbehave the ways a sick node does (see ``SHAPES``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeNode:
    node_id: str
    tokens: list[str] = field(default_factory=lambda: ["Hel", "lo", "!"])
    token_delay: float = 0.0
    health_status: int = 200
    chat_status: int = 200
    break_after: int | None = None  # close the socket after this many tokens
    shape: str = "ok"  # one of SHAPES: how a streamed answer ends
    metrics_text: str = (
        'phalanx_node_busy 0\nphalanx_node_sequences{state="active"} 1\n'
        "phalanx_node_sequences_total 4\nphalanx_node_queue_depth 1\n"
    )
    requests: list[dict[str, Any]] = field(default_factory=list)
    # what its answers report: usage's prompt and cached tokens, and timings
    prompt_tokens: int = 10
    cached_tokens: int = 0
    timings: dict[str, Any] = field(default_factory=lambda: {"ttft_ms": 1.0})
    disconnects: int = 0
    connections: int = 0  # TCP connections accepted
    # device validation (docs/node-protocol.md): /health's "device" block when set, and the
    # report a run ends with (None: the node does not validate, 404)
    device: dict[str, Any] | None = None
    validation_report: dict[str, Any] | None = None
    validation_polls: int = 1  # GETs that answer "running" before "done"
    validation_run: str | None = None
    validation_gets: int = 0
    server: ThreadingHTTPServer | None = None

    def validation_state(self) -> dict[str, Any]:
        """``GET /validation``: "running" for ``validation_polls`` GETs, then "done"."""
        self.validation_gets += 1
        done = self.validation_gets > self.validation_polls
        return {
            "run": self.validation_run,
            "state": "done" if done else "running",
            "phase": "" if done else "decode, 8 sequences",
            "progress": 1.0 if done else 0.6,
            "report": self.validation_report if done else None,
            "instance": (self.device or {}).get("instance"),
        }

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> FakeNode:
        handler = type("Handler", (FakeNodeHandler,), {"node": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class FakeNodeHandler(BaseHTTPRequestHandler):
    """The fake node's HTTP handler; ``FakeNode.start`` binds ``node`` to the node it serves."""

    node: FakeNode
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:  # one handler per accepted connection
        super().setup()
        self.node.connections += 1

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Phalanx-Node", self.node.node_id)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            status = "ok" if self.node.health_status == 200 else "loading"
            health = {"status": status, "node": self.node.node_id}
            if self.node.device is not None:
                health["device"] = self.node.device
            self._json(self.node.health_status, health)
        elif self.path == "/validation" and self.node.validation_report is not None:
            self._json(200, self.node.validation_state())
        elif self.path == "/metrics":
            data = self.node.metrics_text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/validation":
            self._start_validation(body)
            return
        self.node.requests.append(
            {
                "body": body,
                "session": self.headers.get("X-Session-Id"),
                "authorization": self.headers.get("Authorization"),
                "request_id": self.headers.get("X-Request-Id"),
            }
        )
        self._answer_chat(body)

    def _start_validation(self, body: dict[str, Any]) -> None:
        """``POST /validation``: 404 when the node does not validate, else 202 "running" (a new
        run id starts its polls afresh)."""
        if self.node.validation_report is None:
            self._json(404, {"error": {"message": "no such endpoint"}})
        else:
            if body.get("run") != self.node.validation_run:
                self.node.validation_run, self.node.validation_gets = body.get("run"), 0
            self._json(202, {"run": self.node.validation_run, "state": "running"})

    def _answer_chat(self, body: dict[str, Any]) -> None:
        """A chat request's answer: an error status, one of the sick ``shape``s, or a whole or
        streamed completion."""
        node = self.node
        if node.chat_status != 200:
            message = "busy" if node.chat_status == 503 else "engine failed"
            self._json(
                node.chat_status,
                {"error": {"message": message, "type": "x", "code": "x"}},
            )
            return
        if node.shape == "reset":  # read the request, then drop the connection
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if node.shape == "silent":
            time.sleep(30)  # accepted, never answered
            self.close_connection = True
            return
        if node.shape == "empty_200":
            self._raw_response(b"", content_type="application/json")
            return
        if body.get("stream") and node.shape == "close_delimited":
            self._raw_response(_events(node, finish=False, done=False), close=True)
            return
        if body.get("stream"):
            self._stream(_continued_tokens(node.tokens, body))
        else:
            self._json(200, _completion(node, "".join(node.tokens)))

    def _raw_response(
        self, data: bytes, content_type: str = "text/event-stream", close: bool = False
    ) -> None:
        """200 with ``data``: Content-Length framed, or (``close``) ended by closing."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if close:
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, tokens: list[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Phalanx-Node", self.node.node_id)
        self.end_headers()
        try:
            for i, token in enumerate(tokens):
                if self.node.break_after is not None and i >= self.node.break_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                time.sleep(self.node.token_delay)
                if self.node.shape == "malformed" and i == 1:
                    self._chunk(b'data: {"choices": [{"delta": {"content": "oops\n\n')
                self._chunk(f"data: {json.dumps(_token_chunk(token))}\n\n".encode())
            if self.node.shape == "no_finish":
                self.wfile.write(b"0\r\n\r\n")  # a clean end: no finish, no [DONE]
                self.wfile.flush()
                return
            last = {
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": _usage(self.node),
                "timings": self.node.timings,
            }
            stop = {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
            self._chunk(f"data: {json.dumps(stop)}\n\n".encode())
            self._chunk(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            if self.node.shape == "after_done":  # a node that goes on writing after the end
                self._chunk(f"data: {json.dumps(_token_chunk('more'))}\n\n".encode())
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.node.disconnects += 1
            self.close_connection = True


def _continued_tokens(tokens: list[str], body: dict[str, Any]) -> list[str]:
    """The tokens a streamed answer sends: all of them, or, for ``continue_final_message``
    (request migration), those after the answer's start already written (a deterministic
    model: the same text whichever node writes it)."""
    if not body.get("continue_final_message"):
        return tokens
    written = body["messages"][-1]["content"]
    for i in range(len(tokens) + 1):
        if "".join(tokens[:i]) == written:
            return tokens[i:]
    return tokens


SHAPES = (
    "ok",
    "after_done",
    "no_finish",
    "close_delimited",
    "empty_200",
    "malformed",
    "silent",
    "reset",
)


def _token_chunk(token: str) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}],
    }


def _events(node: FakeNode, *, finish: bool, done: bool) -> bytes:
    """The SSE body of an answer, whole; without its finish chunk and ``[DONE]`` as asked."""
    events = [_token_chunk(t) for t in node.tokens]
    if finish:
        events.append(
            {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
        )
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def _usage(node: FakeNode) -> dict[str, Any]:
    return {
        "prompt_tokens": node.prompt_tokens,
        "completion_tokens": len(node.tokens),
        "total_tokens": node.prompt_tokens + len(node.tokens),
        "prompt_tokens_details": {"cached_tokens": node.cached_tokens},
    }


def _completion(node: FakeNode, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": _usage(node),
        "timings": node.timings,
    }


def refused_address() -> str:
    """A loopback address where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


class HungListener:
    """A socket that accepts connections into its backlog and never answers: a stopped node."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()
