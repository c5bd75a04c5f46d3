"""The node agent's state and its error answers: who the node is (``NodeIdentity``) and what it
holds (``NodeState``), shared by its endpoints (``nodes/agent/*_endpoint*.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from inference.engine.scheduler import Engine
from nodes.agent.asgi_io import Send, error_body, send_json
from nodes.agent.auth import CredentialCheck
from nodes.agent.completions import ChatService
from nodes.agent.outcomes import Outcomes
from nodes.agent.switch import SwitchStatus
from nodes.agent.validation import DeviceValidation

JSON_LIMIT = 8 << 20
RETRY_AFTER_S = "1"


@dataclass
class NodeIdentity:
    """Who the node is: its id, the package it serves, its GGUF's sha256 and its array's id."""

    node_id: str
    package: str
    model_sha256: str = ""
    array_id: str = ""


class NodeState:
    """What the agent holds (identity, engine, chat service, switch, outcome counters, device
    validation, credentials) and how it answers an error; ``service`` is set once the engine
    has loaded. The endpoint classes build on it and ``NodeApp`` routes to them."""

    def __init__(
        self,
        identity: NodeIdentity,
        engine: Engine,
        service_factory,
        credentials: CredentialCheck,
        devices: DeviceValidation | None = None,
    ) -> None:
        self.identity = identity
        self.devices = devices  # device validation (None: this node does not validate)
        self.credentials = credentials
        self.engine = engine
        self._service_factory = service_factory
        self._service: ChatService | None = None
        self.switch: SwitchStatus | None = None
        self.outcomes = Outcomes()  # of the package served now (a switch starts afresh)
        self._holding: dict[int, int] = {}  # id(engine) -> requests that captured it

    @property
    def service(self) -> ChatService | None:
        if self._service is None and self.engine.ready.is_set():
            self._service = self._service_factory(self.engine)
        return self._service

    @property
    def headers(self) -> dict[str, str]:
        return {"x-phalanx-node": self.identity.node_id}

    async def _unauthorized(self, send: Send) -> None:
        body = error_body(
            "This node answers only its control plane: send 'Authorization: Bearer <node "
            "credential>' (docs/node-protocol.md).",
            kind="authentication_error",
            code="unauthorized",
        )
        await send_json(send, 401, body, {**self.headers, "www-authenticate": "Bearer"})

    async def _error(
        self,
        send: Send,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        retry: bool = False,
    ) -> None:
        extra = {**self.headers, **({"retry-after": RETRY_AFTER_S} if retry else {})}
        kind = "invalid_request_error" if status < 500 else "overloaded_error"
        await send_json(send, status, error_body(message, kind=kind, code=code, param=param), extra)

    @staticmethod
    async def _on_engine(engine: Engine, fn):
        return await asyncio.wrap_future(engine.call(fn))
