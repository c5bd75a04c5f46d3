"""Domain errors of the inference proxy, translated to HTTP/websocket errors at the edge.

Every error renders as OpenAI's shape: ``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

from typing import Any


class ProxyError(Exception):
    """Base class: ``status`` (HTTP), ``type`` and ``code`` (OpenAI error fields)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retry_after: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.retry_after = retry_after
        self.param = param

    def body(self) -> dict[str, Any]:
        """``{"error": {"message": ..., "type": ..., "code": ..., "param": ...}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }


class BadRequest(ProxyError):
    """Malformed JSON, missing or wrongly typed fields (400)."""


class AuthError(ProxyError):
    """Missing, unknown or revoked API token (401)."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NoRole(ProxyError):
    """A logged-in user in no role group (403): signed in, but allowed nothing."""

    status = 403
    type = "permission_error"
    code = "no_role"


class UnknownModel(ProxyError):
    """No package of that name (404)."""

    status = 404
    code = "model_not_found"


class MethodNotAllowed(ProxyError):
    status = 405
    code = "method_not_allowed"


class NoHealthyNode(ProxyError):
    """No healthy node serves the model, or every one refused (503 with Retry-After)."""

    status = 503
    type = "service_unavailable"
    code = "no_healthy_node"


class ArrayFull(ProxyError):
    """Every node that could take the request is at a hard limit (429 with Retry-After)."""

    status = 429
    type = "rate_limit_error"
    code = "array_full"


class UpstreamError(ProxyError):
    """The node broke after it started answering (502)."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
