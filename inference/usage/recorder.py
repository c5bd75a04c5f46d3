"""Turns counted off the request path: ``record`` queues a turn's figures; one writer thread
writes them every ``FLUSH_S`` seconds as ``UsageTurn`` rows and adds them to their
``UsageMinute`` rows (one increment per minute, caller, model, package and node: exact under
concurrent turns and across control-plane processes, which each add their own). Turn rows
older than ``RAW_RETENTION_DAYS`` are pruned; the minutes stay (``usage_prune``, a periodic
of the control loop).

A process that dies loses at most the turns of its last ``FLUSH_S`` seconds; one that stops
(SIGTERM) writes them first (``flush`` at exit).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from console.lib.write_behind import WriteBehind
from inference.models import InflightLease, RateWindow, UsageMinute, UsageTurn
from inference.usage.models import COUNTERS, SECONDS

log = logging.getLogger(__name__)

FLUSH_S = 0.5
RAW_RETENTION_DAYS = 7

Key = tuple[datetime, str, str, str, str]  # minute, caller, model, package, node


@dataclass
class Turn:
    """One turn's figures (``UsageFigures`` fields) and whom and where it counts."""

    caller: str
    caller_name: str
    model: str
    package: str = ""
    node_id: str = ""
    session_id: str = ""
    request_id: str = ""
    at: datetime = field(default_factory=timezone.now)
    requests: int = 1
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def key(self) -> Key:
        minute = self.at.replace(second=0, microsecond=0)
        return (minute, self.caller, self.model[:200], self.package[:200], self.node_id[:100])

    def row(self) -> UsageTurn:
        return UsageTurn(
            caller=self.caller,
            caller_name=self.caller_name[:120],
            model=self.model[:200],
            package=self.package[:200],
            node_id=self.node_id[:100],
            session_id=self.session_id[:200],
            request_id=self.request_id[:128],
            at=self.at,
            **{name: getattr(self, name) for name in (*COUNTERS, *SECONDS)},
        )


def summed(turns: list[Turn]) -> dict[Key, dict[str, float]]:
    """The turns' figures added up per minute key (pure)."""
    sums: dict[Key, dict[str, float]] = {}
    for turn in turns:
        into = sums.setdefault(turn.key(), dict.fromkeys((*COUNTERS, *SECONDS), 0))
        for name in (*COUNTERS, *SECONDS):
            into[name] += getattr(turn, name)
    return sums


def _add_minute(key: Key, figures: dict[str, float], name: str) -> None:
    minute, caller, model, package, node_id = key
    rows = UsageMinute.objects.filter(
        minute=minute, caller=caller, model=model, package=package, node_id=node_id
    )
    increments = {n: F(n) + v for n, v in figures.items() if v}
    if rows.update(**increments) if increments else rows.exists():
        return
    try:
        with transaction.atomic():
            UsageMinute.objects.create(
                minute=minute,
                caller=caller,
                caller_name=name,
                model=model,
                package=package,
                node_id=node_id,
                **figures,
            )
    except IntegrityError:  # another process created it meanwhile
        rows.update(**increments)


def write(turns: list[Turn]) -> None:
    """Write ``turns`` (rows and minute sums) in one transaction."""
    names = {t.caller: t.caller_name[:120] for t in turns}
    with transaction.atomic():
        UsageTurn.objects.bulk_create([t.row() for t in turns])
        # keys in one order in every process: two replicas' writes never wait on each other's
        # rows in opposite orders (a deadlock on PostgreSQL, which fails one of them)
        for key, figures in sorted(summed(turns).items(), key=lambda item: item[0]):
            _add_minute(key, figures, names[key[1]])


WRITE_TRIES = 3  # a write that fails (a lost connection, a lock timeout) is tried again


class Recorder:
    """The buffer and its writer thread (one per process: ``recorder``)."""

    def __init__(self) -> None:
        self._pending: list[Turn] = []
        self._lock = threading.Lock()
        self._writer = WriteBehind(self._write_pending, FLUSH_S, "usage-writer")

    def record(self, turn: Turn) -> None:
        """Queue ``turn``; written within ``FLUSH_S`` seconds. Constant time, any thread."""
        with self._lock:
            self._pending.append(turn)
        self._writer.soon()

    def _write_pending(self) -> None:
        with self._lock:
            turns, self._pending = self._pending, []
        if not turns:
            return
        for attempt in range(1, WRITE_TRIES + 1):
            try:
                write(turns)
                return
            except Exception:
                connection.close()  # a broken connection is opened afresh for the next try
                if attempt == WRITE_TRIES:
                    log.exception("could not write the usage of %d turns", len(turns))
                    return
                time.sleep(0.1 * attempt)

    def flush(self, timeout: float = 10.0) -> None:
        """Write what is queued now and wait for it (tests, exit)."""
        self._writer.now(timeout)


recorder = Recorder()
atexit.register(lambda: recorder.flush() if recorder._pending else None)


def usage_prune() -> dict[str, int]:
    """Delete turn rows past ``RAW_RETENTION_DAYS`` and expired rate windows and leases;
    returns what went, by table (the control loop's "usage pruning" periodic)."""
    now = timezone.now()
    turns, _ = UsageTurn.objects.filter(at__lt=now - timedelta(days=RAW_RETENTION_DAYS)).delete()
    windows, _ = RateWindow.objects.filter(expires_at__lt=now).delete()
    leases, _ = InflightLease.objects.filter(expires_at__lt=now).delete()
    return {"turns": turns, "rate_windows": windows, "leases": leases}
