"""``/ws/live/``: the console's live feed (node states, events, utilization snapshots).

Server -> client messages:

- ``{"type": "history", "snapshots": [...]}`` once, right after connecting (the kept minutes);
- ``{"type": "snapshot", "snapshot": {...}}`` every second (shape in ``nodes.utilization``);
- ``{"type": "node", "node": {...}, "event": {...}?}`` when a node changed (``nodes.live``);
- ``{"type": "node_removed", "node_id": ...}``.

Auth: a logged-in user with a role, or an API token (``?token=`` or ``Authorization: Bearer``);
otherwise the socket is closed with 4401 (no credentials) or 4403 (no role). The origin check is
``console.websocket.AllowedOriginsValidator`` around the whole router.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.lib import access
from console.lib.live import LIVE_GROUP
from inference.tokens import bearer_token
from nodes import utilization

CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403


@sync_to_async
def _principal(scope: dict[str, Any]) -> access.Principal | None:
    principal = access.principal_for_user(scope.get("user"))
    if principal is not None:
        return principal
    token = (parse_qs(scope.get("query_string", b"").decode("latin1")).get("token") or [None])[0]
    if token is None:
        headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope["headers"]}
        token = bearer_token(headers.get("authorization"))
    return access.principal_for_token(token) if token else None


async def _admitted(consumer: AsyncJsonWebsocketConsumer) -> bool:
    """True for a caller with a role; otherwise an error event and close 4401 (no
    credentials) or 4403 (no role), and False."""
    principal = await _principal(consumer.scope)
    if principal is not None and principal.role is not None:
        return True
    code = CLOSE_UNAUTHORIZED if principal is None else CLOSE_FORBIDDEN
    await consumer.send_json({"type": "error", "code": code, "message": "Not allowed."})
    await consumer.close(code=code)
    return False


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Thin consumer: authenticate, join the live group, send history, relay group events."""

    joined = False

    async def connect(self) -> None:
        await self.accept()
        if not await _admitted(self):
            return
        await self.channel_layer.group_add(LIVE_GROUP, self.channel_name)
        self.joined = True
        utilization.sampler().watch()
        await self.send_json({"type": "history", "snapshots": await utilization.history()})

    async def disconnect(self, code: int) -> None:
        if self.joined:
            self.joined = False
            utilization.sampler().unwatch()
            await self.channel_layer.group_discard(LIVE_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; anything they send is ignored."""

    async def util_snapshot(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "snapshot", "snapshot": event["snapshot"]})

    async def node_status(self, event: dict[str, Any]) -> None:
        message = {"type": "node", "node": event["node"]}
        if "event" in event:
            message["event"] = event["event"]
        await self.send_json(message)

    async def node_removed(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "node_removed", "node_id": event["node_id"]})


LOADTEST_POLL_S = 0.5


def _loadtest_state(run_id: int, after: int) -> dict[str, Any] | None:
    """The run's state and its samples newer than ``after`` (ids), or None when no such run."""
    from django.db import close_old_connections

    from inference.loadtests.models import LoadTestRun, LoadTestSample

    close_old_connections()
    run = (
        LoadTestRun.objects.filter(pk=run_id)
        .values("state", "progress", "message", "live", "error", "cancel_requested")
        .first()
    )
    if run is None:
        return None
    samples = list(
        LoadTestSample.objects.filter(run_id=run_id, id__gt=after)
        .order_by("id")
        .values("id", "t", "data")[:3600]
    )
    run["finished"] = run["state"] in LoadTestRun.FINISHED
    return {"run": run, "samples": samples}


class LoadTestConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/loadtests/<id>/``: a run's live figures. The worker is another process, so this
    follows the run's row (every ``LOADTEST_POLL_S``) rather than a channel group.

    Server -> client: ``{"type": "run", "run": {state, progress, message, live, error,
    cancel_requested, finished}, "samples": [{"id", "t", "data"}]}`` whenever either changed
    (all kept samples first), then ``{"type": "finished", "state": ...}`` once the run has
    ended. Errors: 4401/4403 as ``/ws/live/``, 4404 for an unknown run."""

    task: asyncio.Task | None = None

    async def connect(self) -> None:
        await self.accept()
        if not await _admitted(self):
            return
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        state = sync_to_async(_loadtest_state, thread_sensitive=False)
        after, last_run = 0, None
        while True:
            found = await state(self.run_id, after)
            if found is None:
                await self.send_json({"type": "error", "code": 4404, "message": "No such run."})
                await self.close(code=4404)
                return
            if found["samples"] or found["run"] != last_run:
                await self.send_json({"type": "run", **found})
                after = found["samples"][-1]["id"] if found["samples"] else after
                last_run = found["run"]
            if found["run"]["finished"]:
                await self.send_json({"type": "finished", "state": found["run"]["state"]})
                return
            await asyncio.sleep(LOADTEST_POLL_S)

    async def disconnect(self, code: int) -> None:
        if self.task is not None:
            self.task.cancel()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; anything they send is ignored."""


LOGS_POLL_S = 1.0


def _log_records_after(query: Any) -> list[dict[str, Any]]:
    from django.db import close_old_connections

    from console.lib.log_store import record_out, records_find

    close_old_connections()
    return [record_out(r) for r in records_find(query)]


class LogsConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/logs/?<filters>&after=<id>``: the live tail of the Logs page. Records are shipped
    by many processes into the store, so this follows the store (every ``LOGS_POLL_S``).

    Server -> client: ``{"type": "records", "records": [...]}`` (``GET /api/logs``' shape,
    oldest first) whenever records newer than the last sent match the filters
    (``console.lib.log_store.query_from``). A filter that cannot be asked: ``{"type":
    "error", "code": 4422, "message"}`` and close 4422. Auth as ``/ws/live/``."""

    task: asyncio.Task | None = None

    async def connect(self) -> None:
        from console.lib.errors import ConsoleError
        from console.lib.log_store import query_from

        await self.accept()
        if not await _admitted(self):
            return
        params = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        asked = {k: v[0] for k, v in params.items() if k != "token"}
        try:
            query = query_from({**asked, "after": asked.get("after") or "0", "limit": "500"})
        except ConsoleError as exc:
            await self.send_json({"type": "error", "code": 4422, "message": exc.message})
            await self.close(code=4422)
            return
        self.task = asyncio.create_task(self._follow(query))

    async def _follow(self, query: Any) -> None:
        find = sync_to_async(_log_records_after, thread_sensitive=False)
        while True:
            records = await find(query)
            if records:
                await self.send_json({"type": "records", "records": records})
                query = type(query)(**{**query.__dict__, "after": records[-1]["id"]})
            else:
                await asyncio.sleep(LOGS_POLL_S)

    async def disconnect(self, code: int) -> None:
        if self.task is not None:
            self.task.cancel()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; anything they send is ignored."""
