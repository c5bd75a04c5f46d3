"""The node's session endpoints (``/sessions/<id>[/state]``): locate, export, import and erase a
session's KV, on the engine thread, for the package served when the request arrived."""

from __future__ import annotations

from typing import Any

from inference.engine.scheduler import Engine
from inference.engine.sequences import SessionBusy
from inference.engine.session_state import pack_state, unpack_state
from nodes.agent.asgi_io import BodyTooLarge, Receive, Send, read_body, send_bytes, send_json
from nodes.agent.node_state import NodeState

STATE_LIMIT = 1 << 30


class SessionEndpoints(NodeState):
    """``/sessions/<id>`` and ``/sessions/<id>/state``: where a session's KV is, its export,
    import and erasure."""

    async def _session(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        *,
        sid: str,
        state: str | None,
    ) -> None:
        method, session_id = scope["method"], sid
        engine, identity = self.engine, self.identity  # one package, whatever a switch does
        if not engine.ready.is_set():
            return await self._error(
                send, 503, "the model is still loading", code="loading", retry=True
            )
        table = engine.table
        try:
            if method == "GET" and not state:
                where = await self._on_engine(
                    engine, lambda: table.locate(session_id, engine.kv_bytes_per_token)
                )
                if where is None:
                    return await self._error(
                        send, 404, f"no KV held for session {session_id!r}", code="unknown_session"
                    )
                return await send_json(send, 200, {"session_id": session_id, **where}, self.headers)
            if method == "GET" and state:
                entry = await self._on_engine(engine, lambda: table.export(session_id))
                if entry is None:
                    return await self._error(
                        send, 404, f"no KV held for session {session_id!r}", code="unknown_session"
                    )
                blob = pack_state(entry, model_sha256=identity.model_sha256)
                return await send_bytes(send, 200, blob, "application/octet-stream", self.headers)
            if method == "PUT" and state:
                return await self._import(session_id, receive, send, engine, identity)
            if method == "DELETE" and not state:
                found = await self._on_engine(engine, lambda: table.erase(session_id))
                return await send_json(
                    send, 200, {"session_id": session_id, "erased": found}, self.headers
                )
        except SessionBusy:
            return await self._error(
                send, 409, f"session {session_id!r} has a request in flight", code="session_busy"
            )
        return await self._error(
            send, 405, f"{method} is not allowed here", code="method_not_allowed"
        )

    async def _import(
        self, session_id: str, receive: Receive, send: Send, engine: Engine, identity: Any
    ) -> None:
        try:
            entry, sha = unpack_state(await read_body(receive, STATE_LIMIT))
        except (ValueError, BodyTooLarge) as exc:
            return await self._error(send, 400, str(exc), code="invalid_state")
        if sha and identity.model_sha256 and sha != identity.model_sha256:
            return await self._error(
                send, 409, "state was exported from another model", code="model_mismatch"
            )
        kept = await self._on_engine(engine, lambda: engine.table.import_(session_id, entry))
        if not kept:
            return await self._error(
                send, 507, "state exceeds the host RAM budget", code="over_budget"
            )
        return await send_json(
            send,
            200,
            {
                "session_id": session_id,
                "where": "host",
                "tokens": len(entry.tokens),
                "bytes": len(entry.blob),
            },
            self.headers,
        )
