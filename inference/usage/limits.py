"""Rate limits and quotas per caller, checked before a turn is routed.

Fixed windows (a minute, a UTC day) counted where every control-plane process sees them:
Redis when ``REDIS_URL`` is set (``limit_store_redis``: one round trip, a Lua script), the
database otherwise (``limit_store_db``: one short write transaction). The embedded array
(SQLite, one control-plane process) counts in that process's memory and writes behind
(``limit_store_memory``: no database on the request path). A caller with no counted limit
(``Limits.limited`` false) costs nothing here.

- ``requests_per_minute``: a request is counted when it is admitted; the window's count never
  passes the limit (the ``limit``-th request of a window is the last one admitted).
- ``tokens_per_minute`` / ``tokens_per_day``: prompt plus completion tokens, added when the
  turn ends (``settle``); a request is refused while the window's tokens are at the limit
  (so one turn may take the window past it, as OpenAI's and LiteLLM's limits do).
- ``concurrent_sessions``: sessions with a turn in flight; a lease per turn, released when it
  ends, expiring after ``LEASE_S`` should its process die.
- ``max_tokens``: a request asking for more is a 400 naming the limit; one that asks nothing
  gets the limit as its ``max_tokens`` (``cap_max_tokens``).

Over a limit: ``OverLimit``, a 429 with ``Retry-After`` (seconds to the window's end) in
OpenAI's error shape, ``param`` naming the limit.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.db import connection

from console.lib.bare_http import db_thread
from inference.errors import BadRequest, ProxyError
from inference.usage.quotas import Caller, Limits

MINUTE_S = 60
DAY_S = 86_400
LEASE_S = 900  # a turn in flight longer than this (its process died) stops counting

REFUSED_MINUTE = "requests_per_minute"
WORDS = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "tokens_per_day": "tokens per day",
    "concurrent_sessions": "concurrent sessions",
}


def clock() -> float:
    """Now, in epoch seconds (the windows' clock; tests move it)."""
    return time.time()


class OverLimit(ProxyError):
    """A caller over one of its limits (429 with Retry-After, ``param`` the limit's name)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


@dataclass(frozen=True)
class Windows:
    """The window starts (epoch seconds) a check at ``now`` counts in."""

    minute: int
    day: int

    @classmethod
    def at(cls, now: float) -> Windows:
        return cls(minute=int(now // MINUTE_S) * MINUTE_S, day=int(now // DAY_S) * DAY_S)

    def retry_after(self, limit: str, now: float) -> int:
        """Whole seconds until the window of ``limit`` ends (at least 1)."""
        if limit == "tokens_per_day":
            end = self.day + DAY_S
        elif limit == "concurrent_sessions":
            return 1
        else:
            end = self.minute + MINUTE_S
        return max(1, math.ceil(end - now))


def keys(caller_key: str, windows: Windows) -> dict[str, str]:
    """The counters' keys of a caller in ``windows`` (one per limit)."""
    return {
        "requests_per_minute": f"{caller_key}:rpm:{windows.minute}",
        "tokens_per_minute": f"{caller_key}:tpm:{windows.minute}",
        "tokens_per_day": f"{caller_key}:tpd:{windows.day}",
        "concurrent_sessions": f"{caller_key}:inflight",
    }


@dataclass
class Admission:
    """A turn let in: whose, the windows it counted in, and its concurrency lease (None
    without a concurrent-sessions limit). ``settle`` it once when the turn ends."""

    caller: Caller
    windows: Windows
    lease: str | None = None
    settled: bool = False


class LimitStore(Protocol):
    def admit(self, keys: dict[str, str], limits: Limits, now: float, lease: str | None) -> str:
        """Count the request; returns "" when admitted, else the name of the limit hit."""

    def settle(self, keys: dict[str, str], tokens: int, lease: str | None) -> None:
        """Add the turn's ``tokens``; release ``lease``."""

    def counts(self, keys: dict[str, str], now: float) -> dict[str, int]:
        """What each window of ``keys`` holds (``concurrent_sessions``: live leases)."""

    def ready(self, keys: dict[str, str]) -> bool:
        """True when ``admit`` and ``settle`` with ``keys`` touch no database (they may run
        on the event loop)."""


_stores: dict[str, LimitStore] = {}


def store() -> LimitStore:
    """Redis when ``REDIS_URL`` is set, else this process's memory on SQLite (the embedded
    array), else the database (one per process)."""
    url = settings.REDIS_URL or ""
    kind = url or connection.vendor
    if kind not in _stores:
        if url:
            from inference.usage.limit_store_redis import RedisLimitStore

            _stores[kind] = RedisLimitStore(url)
        elif kind == "sqlite":
            from inference.usage.limit_store_memory import MemoryLimitStore

            _stores[kind] = MemoryLimitStore()
        else:
            from inference.usage.limit_store_db import DbLimitStore

            _stores[kind] = DbLimitStore()
    return _stores[kind]


def forget_counts() -> None:
    """Write what this process counted and forget it, as a new process starts (tests)."""
    from inference.usage.limit_store_memory import MemoryLimitStore

    for kept in _stores.values():
        if isinstance(kept, MemoryLimitStore):
            kept.clear()


def _refusal(caller: Caller, limit: str, windows: Windows, now: float) -> OverLimit:
    value = getattr(caller.limits, limit)
    return OverLimit(
        f"{caller.name} is over its limit of {value} {WORDS[limit]}; retry in "
        f"{windows.retry_after(limit, now)} s.",
        param=limit,
        retry_after=windows.retry_after(limit, now),
    )


def _admit(caller: Caller, windows: Windows, now: float) -> Admission:
    lease = secrets.token_hex(8) if caller.limits.concurrent_sessions else None
    hit = store().admit(keys(caller.key, windows), caller.limits, now, lease)
    if hit:
        raise _refusal(caller, hit, windows, now)
    return Admission(caller, windows, lease)


def admit(caller: Caller) -> Admission:
    """Let a turn of ``caller`` in, or raise ``OverLimit`` (429). Blocking (tests, threads)."""
    now = clock()
    return _admit(caller, Windows.at(now), now)


async def aadmit(caller: Caller) -> Admission | None:
    """``admit`` for the proxy: None at no cost for a caller without counted limits; a
    Redis round trip or a count in memory on the loop, else in a DB thread (a database
    write; the memory store's first count in a window, which reads the window first)."""
    if not caller.limits.limited:
        return None
    now = clock()
    windows = Windows.at(now)
    if store().ready(keys(caller.key, windows)):
        return _admit(caller, windows, now)
    return await db_thread(_admit)(caller, windows, now)


def settle(admission: Admission | None, tokens: int) -> None:
    """Add a finished turn's prompt and completion ``tokens`` to its windows and release its
    lease (once; None: nothing counted). Blocking: the recorder's thread calls it."""
    if admission is None or admission.settled:
        return
    admission.settled = True
    limits = admission.caller.limits
    counted = tokens if (limits.tokens_per_minute or limits.tokens_per_day) else 0
    if counted or admission.lease:  # into the windows the turn ends in (its tokens are spent)
        ended_in = Windows.at(clock())
        store().settle(keys(admission.caller.key, ended_in), counted, admission.lease)


def settles_on_loop(admission: Admission) -> bool:
    """True when ``settle(admission, ...)`` touches no database (Redis, memory)."""
    return store().ready(keys(admission.caller.key, Windows.at(clock())))


def window_counts(caller_key: str, windows: Windows, now: float) -> dict[str, int]:
    """What ``caller_key``'s current windows hold, by limit name (the Usage page)."""
    return store().counts(keys(caller_key, windows), now)


def cap_max_tokens(body: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """``body`` with the caller's ``max_tokens`` limit applied: the limit when it asks for
    none; raises ``BadRequest`` (400, ``param`` the field) when it asks for more, in
    ``max_tokens``, ``max_completion_tokens`` or llama-server's ``n_predict`` (which an
    external node reads before ``max_tokens``; -1 there is no end, refused too)."""
    cap = limits.max_tokens
    if not cap or not settings.USAGE_ACCOUNTING:
        return body
    for field in ("max_tokens", "max_completion_tokens", "n_predict"):
        asked = body.get(field)
        if field == "n_predict" and asked is not None and not isinstance(asked, int):
            raise BadRequest(f"n_predict must be a whole number, not {asked!r}.", param=field)
        if isinstance(asked, int) and (asked > cap or asked < 0):
            raise BadRequest(
                f"{field} {asked} is over this token's limit of {cap} (max_tokens quota).",
                param=field,
                code="max_tokens_over_quota",
            )
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        return {**body, "max_tokens": cap}
    return body
