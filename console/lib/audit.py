"""The audit log: who changed what, when, before and after (shared plumbing for every app).

The edges say who is acting (``acting_as``: the page's user, the API's token or user, a
management command); the services that make a change record it (``audit_record``) in the same
transaction, with each field's ``before → after`` (``diff``). Reads: the Audit page and
``GET /api/audit``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from console.models import AuditEntry

_actor: ContextVar[str] = ContextVar("phalanx_actor", default="system")


def set_actor(name: str) -> None:
    """Who the current request or command acts as (``"admin"``, ``"token:ci"``, ``"cli"``)."""
    _actor.set(name)


@contextlib.contextmanager
def acting_as(name: str) -> Iterator[None]:
    """``set_actor`` for a block, restored after it."""
    token = _actor.set(name)
    try:
        yield
    finally:
        _actor.reset(token)


def current_actor() -> str:
    return _actor.get()


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """``"field: before → after"`` for each key whose value differs."""
    return [
        f"{key}: {_shown(before.get(key))} \u2192 {_shown(after.get(key))}"
        for key in after
        if before.get(key) != after.get(key)
    ]


def _shown(value: Any) -> str:
    return "(none)" if value is None or value == "" else str(value)


def audit_record(*, action: str, target: str = "", changes: list[str] | None = None) -> AuditEntry:
    """Keep one entry by the current actor (call it inside the change's transaction)."""
    return AuditEntry.objects.create(
        actor=current_actor()[:150], action=action, target=target[:255], changes=changes or []
    )
