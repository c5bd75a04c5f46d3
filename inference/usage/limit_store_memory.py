"""The rate-limit counters of the embedded array (SQLite, no ``REDIS_URL``): counted in the
memory of its one control-plane process and written behind to the database.

The embedded array has one process that admits requests (daphne: ``/v1/``, the websockets and
the console). There a write transaction per admission (``limit_store_db``) cost about 1.4 ms
of time to first token on SQLite (a thread hop, ``BEGIN IMMEDIATE``, a write); here an
admission is a dictionary update under a lock, on the event loop.

- A window this process has not counted in yet is read from the database first (its
  ``RateWindow`` row: once per window), so a restart keeps what the minute and the day
  already hold, up to the last write.
- What the process adds is written behind by that one thread, at most ``FLUSH_S`` after it
  was counted (one transaction for everything pending); a write that fails is kept and
  tried again. A read waits for a write under way, and what was written leaves the pending
  amounts only once committed, so a window read from the database plus what is still pending
  is the exact count.
- Leases (``concurrent_sessions``) live in memory only: they end with the process, which is
  what their expiry stands for in the database store.

Counting is exact within the process. A second process admitting on the same SQLite file
(not a supported set-up: several control planes need PostgreSQL and Redis) would see this
one's counts up to ``FLUSH_S`` late.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref

from django.db import close_old_connections, connection, transaction

from console.lib.write_behind import WriteBehind
from inference.models import RateWindow
from inference.usage.limit_store_db import WINDOWED, window_add
from inference.usage.quotas import Limits

log = logging.getLogger(__name__)

FLUSH_S = 0.5  # what was counted reaches the database within this


def row_expiry(key: str) -> float:
    """When the row of window ``key`` (``limits.keys``: ``<caller>:<rpm|tpm|tpd>:<start>``)
    may go (epoch s): a minute after its window ends."""
    from inference.usage.limits import DAY_S, MINUTE_S

    _, kind, start = key.rsplit(":", 2)
    return int(start) + (DAY_S if kind == "tpd" else MINUTE_S) + MINUTE_S


class MemoryLimitStore:
    """``limits.LimitStore`` in this process's memory, written behind to the default database.

    ``admit``, ``settle`` and ``counts`` may be called from any thread; ``admit`` and
    ``counts`` read a window not counted in yet from the database first, in the calling
    thread (``ready`` says whether one is needed)."""

    def __init__(self) -> None:
        atexit.register(_flush_at_exit, weakref.ref(self))  # the last FLUSH_S is not lost
        self._lock = threading.Lock()  # the dictionaries
        self._io = threading.Lock()  # a database read or write of the windows, one at a time
        self._counts: dict[str, int] = {}  # window key -> count (database + this process)
        self._expires: dict[str, float] = {}  # window key -> epoch s its row expires
        self._pending: dict[str, int] = {}  # window key -> amount not yet written
        self._leases: dict[str, dict[str, float]] = {}  # caller -> {lease: expires epoch s}
        self._writer = WriteBehind(self._write, FLUSH_S, "limit-writer")

    def ready(self, keys: dict[str, str]) -> bool:
        """True when every window of ``keys`` is in memory (``admit`` reads no database)."""
        return all(keys[n] in self._counts for n in WINDOWED)

    def _read(self, keys: dict[str, str]) -> None:
        """Read the windows of ``keys`` not in memory yet (blocking, in the calling thread;
        never while a write is under way, so the rows plus what is pending is exact)."""
        with self._io:
            missing = [keys[n] for n in WINDOWED if keys[n] not in self._counts]
            rows = dict(RateWindow.objects.filter(key__in=missing).values_list("key", "count"))
            with self._lock:
                for key in missing:
                    if key not in self._counts:
                        self._counts[key] = rows.get(key, 0) + self._pending.get(key, 0)
                        self._expires[key] = row_expiry(key)

    def admit(self, keys: dict[str, str], limits: Limits, now: float, lease: str | None) -> str:
        from inference.usage.limits import LEASE_S

        if not self.ready(keys):
            self._read(keys)
        caller = keys["concurrent_sessions"].rsplit(":", 1)[0]
        with self._lock:
            for name in ("tokens_per_minute", "tokens_per_day"):
                value = getattr(limits, name)
                if value and self._counts.get(keys[name], 0) >= value:
                    return name
            leases = self._live_leases(caller, now)
            if limits.concurrent_sessions and len(leases) >= limits.concurrent_sessions:
                return "concurrent_sessions"
            if limits.requests_per_minute:
                if self._counts.get(keys["requests_per_minute"], 0) >= limits.requests_per_minute:
                    return "requests_per_minute"
                self._add(keys["requests_per_minute"], 1)
            if lease:
                leases[lease] = now + LEASE_S
        self._writer.soon()
        return ""

    def _live_leases(self, caller: str, now: float) -> dict[str, float]:
        leases = self._leases.setdefault(caller, {})
        for lease in [name for name, expires in leases.items() if expires <= now]:
            del leases[lease]
        return leases

    def _add(self, key: str, amount: int) -> None:
        """Count ``amount`` in window ``key`` (lock held)."""
        if key in self._counts:
            self._counts[key] += amount
        self._pending[key] = self._pending.get(key, 0) + amount
        self._expires.setdefault(key, row_expiry(key))

    def settle(self, keys: dict[str, str], tokens: int, lease: str | None) -> None:
        with self._lock:
            if tokens:
                self._add(keys["tokens_per_minute"], tokens)
                self._add(keys["tokens_per_day"], tokens)
            if lease:
                caller = keys["concurrent_sessions"].rsplit(":", 1)[0]
                self._leases.get(caller, {}).pop(lease, None)
        if tokens:
            self._writer.soon()

    def counts(self, keys: dict[str, str], now: float) -> dict[str, int]:
        if not self.ready(keys):
            self._read(keys)
        caller = keys["concurrent_sessions"].rsplit(":", 1)[0]
        with self._lock:
            counts = {n: self._counts.get(keys[n], 0) for n in WINDOWED}
            return {**counts, "concurrent_sessions": len(self._live_leases(caller, now))}

    def _write(self) -> None:
        """Write what is pending (writer thread), and forget windows whose rows expired. What
        was written leaves ``_pending`` only once committed (a read meanwhile waits)."""
        from inference.usage.limits import clock

        with self._io:
            with self._lock:
                pending = dict(self._pending)
            if not pending:
                return
            close_old_connections()
            try:
                with transaction.atomic():
                    for key, amount in pending.items():
                        window_add(key, amount, row_expiry(key))
            except Exception:
                log.exception("could not write %d rate-limit counts; trying again", len(pending))
                connection.close()
                self._writer.soon()
                return
            with self._lock:
                for key, amount in pending.items():
                    left = self._pending.pop(key) - amount
                    if left:
                        self._pending[key] = left
        self._forget_expired(clock())

    def _forget_expired(self, now: float) -> None:
        with self._lock:
            for key in [k for k, at in self._expires.items() if at < now]:
                if key not in self._pending:
                    self._counts.pop(key, None)
                    del self._expires[key]

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything counted so far is in the database (tests, exit)."""
        self._writer.now(timeout)

    def clear(self) -> None:
        """Write what is pending, then forget every count and lease, and what could not be
        written (tests: a new process)."""
        self.flush()
        self._writer.cancel()
        with self._lock:
            self._pending.clear()
            self._counts.clear()
            self._expires.clear()
            self._leases.clear()


def _flush_at_exit(store: weakref.ref[MemoryLimitStore]) -> None:
    kept = store()
    if kept is not None:
        kept.flush()
