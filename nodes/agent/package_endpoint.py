"""The node's package endpoint (``/package``): what it serves and its last switch; a switch loads
the new engine on a thread of its own and adopts it on the event loop in one step."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

from inference.chat_request import decode_json
from inference.engine.scheduler import Engine
from inference.errors import BadRequest
from nodes.agent.asgi_io import BodyTooLarge, Receive, Send, read_body, send_json
from nodes.agent.node_state import JSON_LIMIT, NodeIdentity, NodeState
from nodes.agent.outcomes import Outcomes
from nodes.agent.switch import SwitchRefused, SwitchRequest, SwitchStatus, load_engine, retire


class PackageEndpoint(NodeState):
    """``GET``/``PUT /package``: what the node serves, and a switch to another package."""

    async def _package(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """GET: what the node serves and its last switch. PUT: switch (202; 409 while one
        runs; 400 naming what is wrong). See nodes/agent/switch.py."""
        if scope["method"] == "PUT":
            try:
                request = SwitchRequest.from_body(decode_json(await read_body(receive, JSON_LIMIT)))
                request.config(self.engine.config)  # the settings it would run with fit
            except (SwitchRefused, BadRequest, BodyTooLarge) as exc:
                return await self._error(send, 400, str(exc), code="invalid_switch")
            if self.switch is not None and self.switch.running:
                return await self._error(
                    send, 409, f"a switch to {self.switch.package} is under way", code="switching"
                )
            self.switch = SwitchStatus(request.package, request.sha256)
            loop = asyncio.get_running_loop()
            threading.Thread(
                target=self._load, args=(request, self.switch, loop), name="switch", daemon=True
            ).start()
            return await send_json(send, 202, self._package_state(), self.headers)
        return await send_json(send, 200, self._package_state(), self.headers)

    def _package_state(self) -> dict[str, Any]:
        config = self.engine.config
        return {
            "package": self.identity.package,
            "sha256": self.identity.model_sha256,
            "model_path": config.model_path,
            "settings": {
                "threads": config.threads,
                "sequences": config.sequences,
                "ctx_per_seq": config.ctx_per_seq,
                "host_ram_mib": config.host_ram_mib,
            },
            "switch": self.switch.as_dict() if self.switch else None,
        }

    def _load(
        self, request: SwitchRequest, status: SwitchStatus, loop: asyncio.AbstractEventLoop
    ) -> None:
        """On a thread of its own: load the new engine, then hand it to the event loop."""
        try:
            engine = load_engine(request, self.engine.config, status)
        except Exception as exc:  # the old engine goes on serving; the status says why
            status.fail(f"the switch failed: {exc}")
            return
        if engine is not None:
            identity = dataclasses.replace(
                self.identity, package=request.package, model_sha256=request.sha256
            )
            loop.call_soon_threadsafe(self._adopt, engine, identity, status)

    def _adopt(self, engine: Engine, identity: NodeIdentity, status: SwitchStatus) -> None:
        """On the event loop, in one step: the new engine serves every request from now."""
        old = self.engine
        self.engine, self.identity, self._service = engine, identity, None
        self.outcomes = Outcomes()
        status.state, status.finished_at = "done", time.time()
        retire(old)
