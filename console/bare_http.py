"""Django without its middleware stack, for the token-authenticated OpenAI proxy (``/v1/``).

The proxy authenticates every request with a Bearer token and sets no cookies, so sessions,
CSRF, messages and auth middleware do nothing for it; under ASGI each of them still costs a
thread hop per request (``MiddlewareMixin.__acall__``), several milliseconds of added TTFT on
two cores. ``/v1/`` requests go to a handler whose middleware chain is empty; everything else
goes through the full stack.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

BARE_PREFIXES = ("/v1/",)


class BareASGIHandler(ASGIHandler):
    """An ``ASGIHandler`` that runs views with no middleware."""

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
