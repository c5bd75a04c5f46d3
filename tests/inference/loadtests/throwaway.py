"""A throwaway HTTP server on loopback that records every request it gets: a stranger on a port
of this machine, which must never receive a credential the array minted."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Stranger:
    """What the server saw: ``requests`` as ``(method, path, headers)``."""

    url: str
    port: int
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def credentials(self) -> list[str]:
        """Every Authorization header (and any ``phx_`` token anywhere in a request)."""
        seen = []
        for _, path, headers in self.requests:
            seen += [v for k, v in headers.items() if k.lower() == "authorization"]
            seen += [path] if "phx_" in path else []
        return seen


Answer = Callable[[str, "Stranger"], tuple[int, dict]]


def _health_ok(path: str, stranger: Stranger) -> tuple[int, dict]:
    """Answers like a control plane would, with no proof: 200 ``{"status": "ok"}`` on
    ``/health``, an empty model list on ``/v1/models``, 404 elsewhere."""
    if path.startswith("/health"):
        return 200, {"status": "ok"}
    if path.startswith("/v1/models"):
        return 200, {"object": "list", "data": [{"id": "smollm2-135m", "object": "model"}]}
    return 404, {"error": "not found"}


@contextmanager
def stranger_server(answer: Answer = _health_ok) -> Iterator[Stranger]:
    """Serve on ``127.0.0.1`` (a free port) until the block ends; ``answer(path, stranger)``
    gives each response's status and JSON body."""
    holder: dict[str, Stranger] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self) -> None:
            stranger = holder["s"]
            stranger.requests.append((self.command, self.path, dict(self.headers.items())))
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            status, body = answer(self.path, stranger)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    holder["s"] = Stranger(url=f"http://127.0.0.1:{port}", port=port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["s"]
    finally:
        server.shutdown()
        server.server_close()
