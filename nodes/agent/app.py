"""The node agent's HTTP API (an ASGI application): see docs/node-protocol.md."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nodes.agent.asgi_io import ClientGone, Receive, Send, header
from nodes.agent.auth import proving
from nodes.agent.chat_endpoint import ChatEndpoint
from nodes.agent.package_endpoint import PackageEndpoint
from nodes.agent.prefix_endpoint import PrefixEndpoint
from nodes.agent.session_endpoints import SessionEndpoints
from nodes.agent.status_endpoints import StatusEndpoints
from nodes.agent.validation_endpoint import ValidationEndpoint


@dataclass(frozen=True)
class Route:
    """One line of the node's URL table: path pattern, allowed methods (empty: any), the
    ``NodeApp`` method that answers, whether it answers without the credential (only
    ``/health``), and an example path (tests call every route)."""

    pattern: re.Pattern[str]
    methods: tuple[str, ...]
    handler: str
    example: str
    public: bool = False


ROUTES = (
    Route(re.compile(r"^/health$"), ("GET", "HEAD"), "_health", "/health", public=True),
    Route(re.compile(r"^/metrics$"), ("GET",), "_metrics", "/metrics"),
    Route(re.compile(r"^/slots$"), ("GET",), "_slots", "/slots"),
    Route(re.compile(r"^/v1/models$"), ("GET",), "_models_list", "/v1/models"),
    Route(re.compile(r"^/package$"), ("GET", "PUT"), "_package", "/package"),
    Route(re.compile(r"^/validation$"), ("GET", "POST"), "_validation", "/validation"),
    Route(re.compile(r"^/v1/chat/completions$"), ("POST",), "_chat", "/v1/chat/completions"),
    Route(re.compile(r"^/prefixes$"), ("POST",), "_prefixes", "/prefixes"),
    Route(
        re.compile(r"^/sessions/(?P<sid>[^/]{1,200})(?P<state>/state)?/?$"),
        ("GET", "PUT", "DELETE"),
        "_session",
        "/sessions/s-1/state",
    ),
)


class NodeApp(
    StatusEndpoints,
    ChatEndpoint,
    PackageEndpoint,
    PrefixEndpoint,
    ValidationEndpoint,
    SessionEndpoints,
):
    """Routes requests to the engine through the endpoints of each concern (status, chat,
    package, shared prefixes, validation, sessions), all over one ``NodeState``. ``service`` is set once the
    engine has loaded."""

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._route(scope, receive, send)
        except ClientGone:
            return

    async def _route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        grant = self.credentials.grant(header(scope, "authorization"))
        send = proving(send, grant, header(scope, "x-phalanx-challenge"))
        for route in ROUTES:
            match = route.pattern.match(path)
            if match is None:
                continue
            public = route.public and method in route.methods
            if not public and grant is None:
                return await self._unauthorized(send)
            if route.methods and method not in route.methods:
                allowed = ", ".join(route.methods)
                return await self._error(send, 405, f"use {allowed}", code="method_not_allowed")
            handler = getattr(self, route.handler)
            return await handler(scope, receive, send, **match.groupdict())
        if grant is None:
            return await self._unauthorized(send)  # not even the URL table to strangers
        return await self._error(send, 404, f"no such endpoint: {method} {path}", code="not_found")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
