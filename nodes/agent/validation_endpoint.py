"""The node's device-validation endpoint (``/validation``): start a run, read the last one."""

from __future__ import annotations

from typing import Any

from inference.chat_request import decode_json
from inference.errors import BadRequest
from nodes.agent.asgi_io import BodyTooLarge, Receive, Send, read_body, send_json
from nodes.agent.node_state import JSON_LIMIT, NodeState
from nodes.agent.validation import ValidationBusy


class ValidationEndpoint(NodeState):
    """``GET``/``POST /validation``: device validation runs (``nodes/agent/validation.py``)."""

    async def _validation(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """POST ``{"run": id}``: start a validation run (202; the same id again answers its
        state; 409 while another runs). GET: the last run's state, progress and report."""
        if self.devices is None:
            return await self._error(
                send, 404, "this node does not run device validation", code="not_found"
            )
        if scope["method"] == "POST":
            try:
                body = decode_json(await read_body(receive, JSON_LIMIT))
                run_id = body.get("run") if isinstance(body, dict) else None
                task = self.devices.start(str(run_id) if isinstance(run_id, str) else "")
            except (BadRequest, BodyTooLarge, ValueError) as exc:
                return await self._error(send, 400, str(exc), code="invalid_validation")
            except ValidationBusy as exc:
                return await self._error(send, 409, str(exc), code="validation_busy")
            return await send_json(send, 202, task.as_dict(), self.headers)
        task = self.devices.task
        body = task.as_dict() if task else {"run": None, "state": "none"}
        return await send_json(send, 200, {**body, "instance": self.devices.instance}, self.headers)
