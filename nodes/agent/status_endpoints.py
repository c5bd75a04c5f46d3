"""The node's status endpoints: ``/health`` (loading, ready, what it serves), ``/metrics``
(Prometheus text), ``/slots`` and ``/v1/models``."""

from __future__ import annotations

import os
from typing import Any

from nodes.agent.asgi_io import Receive, Send, send_bytes, send_json
from nodes.agent.metrics import prometheus_text
from nodes.agent.node_state import RETRY_AFTER_S, NodeState


class StatusEndpoints(NodeState):
    """``GET /health``, ``/metrics``, ``/slots`` and ``/v1/models``: what the node is and does."""

    async def _metrics(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        snapshot = {**self.engine.snapshot(), **self.outcomes.snapshot()}
        body = prometheus_text(self.identity.node_id, snapshot).encode()
        await send_bytes(send, 200, body, "text/plain; version=0.0.4", self.headers)

    async def _slots(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.engine.slots(), self.headers)

    async def _models_list(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._models(), self.headers)

    async def _health(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if self.engine.load_error:
            return await send_json(
                send, 500, {"status": "error", "error": self.engine.load_error}, self.headers
            )
        if not self.engine.ready.is_set():
            return await send_json(
                send, 503, {"status": "loading"}, {**self.headers, "retry-after": RETRY_AFTER_S}
            )
        snap = self.engine.snapshot()
        return await send_json(
            send,
            200,
            {
                "status": "ok",
                "node": self.identity.node_id,
                "array": self.identity.array_id,
                "model": self.identity.package,
                "sha256": self.identity.model_sha256,
                "switch": self.switch.as_dict() if self.switch else None,
                "pid": os.getpid(),
                "sequences_active": snap["sequences_active"],
                "queue_depth": snap["queue_depth"],
                "kv": snap["kv_settings"],
                "tuning": snap["tuning"],
                "repeatable": snap["repeatable"],
                "host_ram_budget_bytes": snap["host_ram_budget_bytes"],
                "warm": snap["warm"],
                "chat_template": self._template_status(),
                "device": self.devices.health() if self.devices else None,
            },
            self.headers,
        )

    def _template_status(self) -> str:
        """``"ok"``, or why chat completions are refused (no template, one that fails)."""
        service = self.service
        return (service.formatter.load_error or "ok") if service else "loading"

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": self.identity.package, "object": "model", "owned_by": self.identity.node_id}
            ],
        }
