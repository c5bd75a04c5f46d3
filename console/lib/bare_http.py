"""Django without its middleware stack, for the token-authenticated OpenAI proxy (``/v1/``).

The proxy authenticates every request with a Bearer token and sets no cookies, so sessions,
CSRF, messages and auth middleware do nothing for it; under ASGI each of them still costs a
thread hop per request (``MiddlewareMixin.__acall__``), several milliseconds of added TTFT on
two cores. ``/v1/`` requests go to a handler whose middleware chain is empty; everything else
goes through the full stack.

The bare handler also runs without Django's per-request ``ThreadSensitiveContext``, which
starts a new thread, with a new database connection, for each request's first thread-sensitive
call. The proxy's own database reads go through ``db_thread`` instead: a pool of long-lived
threads that keep their connections (``CONN_MAX_AGE``), checked the way Django checks them at
each request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.db import close_old_connections
from django.urls import set_script_prefix

P = ParamSpec("P")
R = TypeVar("R")


def db_thread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``fn`` (synchronous, using the ORM) as a coroutine run in a pooled worker thread
    (``sync_to_async(thread_sensitive=False)``); the thread's connection is first closed when
    it is broken or older than ``CONN_MAX_AGE`` (Django's own per-request check)."""

    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        return fn(*args, **kwargs)

    return sync_to_async(checked, thread_sensitive=False)


BARE_PREFIXES = ("/v1/",)


class BareASGIHandler(ASGIHandler):
    """An ``ASGIHandler`` that runs views with no middleware and no per-request thread."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle`` without its ``request_started`` signal, whose
        receivers (connection hygiene, the DEBUG query log) are synchronous and cost a thread
        hop before the view runs; ``db_thread`` does that hygiene where the proxy reads. A client
        disconnect still cancels the view (and so the node's generation)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            return
        respond = asyncio.create_task(self._respond(request, send))
        disconnect = asyncio.create_task(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({respond, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (disconnect, respond):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await task
            body_file.close()

    async def _respond(self, request: Any, send: Any) -> None:
        response = await self.run_get_response(request)
        try:
            await self.send_response(response, send)
        finally:
            await sync_to_async(response.close, thread_sensitive=False)()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)


def split_by_path(full: Any, bare: Any) -> Any:
    """An ASGI app sending ``BARE_PREFIXES`` paths to ``bare`` and the rest to ``full``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = bare if scope.get("path", "").startswith(BARE_PREFIXES) else full
        await target(scope, receive, send)

    return app
