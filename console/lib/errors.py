"""Domain errors of the console and the admin API; ``console.api`` maps them to HTTP in one
handler (``{"detail": message, "code": code, "field": field}`` with ``status``)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied


class ConsoleError(Exception):
    """Base: ``status`` (HTTP), ``code`` (stable, machine-readable) and optional ``field``."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class Forbidden(ConsoleError, PermissionDenied):
    """The caller's role may not do this (403; pages render Django's 403 for it)."""

    status = 403
    code = "forbidden"


class NotFound(ConsoleError):
    status = 404
    code = "not_found"


class Conflict(ConsoleError):
    """The thing exists already, or is in use (409)."""

    status = 409
    code = "conflict"


class Invalid(ConsoleError):
    """Input that fails a rule (422); ``field`` names it."""

    status = 422
    code = "invalid"
