"""The rate-limit counters in the database (no ``REDIS_URL``): ``RateWindow`` rows and
``InflightLease`` rows, shared by every process on the same database.

One write transaction per admission, which serializes admissions: on SQLite the transaction
itself (``BEGIN IMMEDIATE`` takes the database's write lock), on PostgreSQL its first
statement, a write of the caller's lock row (a row lock held to the commit). Counting is then
exact, also across processes; the windows are read in one query. Rows expire with their window and are deleted by the
usage pruning (``recorder.usage_prune``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import IntegrityError, connection, transaction
from django.db.models import F

from inference.models import InflightLease, RateWindow
from inference.usage.quotas import Limits


def _at(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=UTC)


WINDOWED = ("tokens_per_minute", "tokens_per_day", "requests_per_minute")


def _counts(window_keys: list[str]) -> dict[str, int]:
    """The counts of the windows ``window_keys`` that exist, in one query."""
    if not window_keys:
        return {}
    return dict(RateWindow.objects.filter(key__in=window_keys).values_list("key", "count"))


def _count(key: str) -> int:
    return RateWindow.objects.filter(key=key).values_list("count", flat=True).first() or 0


def window_add(key: str, amount: int, expires_at: float) -> None:
    """Add ``amount`` to the window ``key`` (created when missing)."""
    if RateWindow.objects.filter(key=key).update(count=F("count") + amount):
        return
    try:
        with transaction.atomic():
            RateWindow.objects.create(key=key, count=amount, expires_at=_at(expires_at))
    except IntegrityError:  # another process created it meanwhile
        RateWindow.objects.filter(key=key).update(count=F("count") + amount)


class DbLimitStore:
    """``limits.LimitStore`` on the default database."""

    @transaction.atomic
    def admit(self, keys: dict[str, str], limits: Limits, now: float, lease: str | None) -> str:
        from inference.usage.limits import DAY_S, LEASE_S, MINUTE_S

        caller = keys["concurrent_sessions"].rsplit(":", 1)[0]
        if connection.vendor != "sqlite":  # SQLite's IMMEDIATE transaction holds its write lock
            window_add(f"{caller}:lock", 1, now + DAY_S)  # the caller's lock, held to the commit
        counts = _counts([keys[n] for n in WINDOWED if getattr(limits, n)])
        for name in ("tokens_per_minute", "tokens_per_day"):
            value = getattr(limits, name)
            if value and counts.get(keys[name], 0) >= value:
                return name
        if limits.concurrent_sessions:
            live = InflightLease.objects.filter(caller=caller, expires_at__gt=_at(now))
            if live.count() >= limits.concurrent_sessions:
                return "concurrent_sessions"
        if limits.requests_per_minute:
            if counts.get(keys["requests_per_minute"], 0) >= limits.requests_per_minute:
                return "requests_per_minute"
            window_add(keys["requests_per_minute"], 1, now + 2 * MINUTE_S)
        if lease:
            InflightLease.objects.create(caller=caller, lease=lease, expires_at=_at(now + LEASE_S))
        return ""

    def settle(self, keys: dict[str, str], tokens: int, lease: str | None) -> None:
        from inference.usage.limits import DAY_S, MINUTE_S

        now = datetime.now(UTC).timestamp()
        with transaction.atomic():
            if tokens:
                window_add(keys["tokens_per_minute"], tokens, now + 2 * MINUTE_S)
                window_add(keys["tokens_per_day"], tokens, now + DAY_S + MINUTE_S)
            if lease:
                InflightLease.objects.filter(lease=lease).delete()

    def ready(self, keys: dict[str, str]) -> bool:
        return False  # every admission and settlement writes

    def counts(self, keys: dict[str, str], now: float) -> dict[str, int]:
        caller = keys["concurrent_sessions"].rsplit(":", 1)[0]
        counts = {n: _count(keys[n]) for n in keys if n != "concurrent_sessions"}
        live = InflightLease.objects.filter(caller=caller, expires_at__gt=_at(now))
        return {**counts, "concurrent_sessions": live.count()}

    def clear(self) -> None:
        """Drop every counter (tests)."""
        RateWindow.objects.all().delete()
        InflightLease.objects.all().delete()
