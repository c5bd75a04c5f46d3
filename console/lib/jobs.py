"""The job mechanism's shared parts: the two leases (an attempt's ``Lease`` on a job row, and
the time lease ``hold`` on a step job's row), the atomic claim, the heartbeat thread, and the
process runner that starts, watches and kills job processes. The registry of step kinds and
periodic work, and the threads that run them, are ``console.lib.steps``.

A job is a row with ``state``, ``attempts``, ``pid``, ``started_at`` and ``heartbeat_at``
(package jobs and load-test runs today; docs/architecture.md, "Jobs"). It moves from
``queued`` to ``running`` in one conditional UPDATE (``claim``), which adds one to
``attempts``: that number is the attempt's ``Lease``, and every write of the attempt goes
through ``Lease.rows()``, so an attempt the control loop gave up on (and queued again, or
ended) cannot write over the next attempt or over the end. A job process takes up the
attempt it was started for (``adopt``; ``ProcessRunner`` puts it on the command line), never
the one the row holds when the process gets there: one that starts late, after its attempt
was given up and the job claimed again (by another replica's control loop), does nothing. A
running attempt beats (``heartbeat_at``); the control loop judges a process it started by the process
(``ProcessRunner.alive``) and any other by the beat. Django's Tasks framework (the
``django-tasks`` backport on Django 5.2) was weighed first and not used: its database backend
leaves a task whose worker died in RUNNING for ever and has no cancel or progress
(django-tasks-db issue 5, django-tasks issue 192), all of which these jobs need.

A step job (a rolling upgrade, a device validation) has no process of its own: a control loop
advances it one step at a time, and ``hold`` makes that one control loop at a time. It sets
the row's ``lease_until`` ``lease_s`` ahead in one conditional UPDATE (only when it is unset
or past: one of any number of racing holders gets it), a thread pushes it ahead every
``renew_s`` while the step runs, and the step's end clears it. A holder killed mid-step
(SIGKILL, a lost host) leaves the row to the next one within ``lease_s``. The attempt
``Lease`` and this time lease are what let several control-plane replicas share the work.

The plumbing imports no app: a kind passes its model class and its field names.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, models
from django.db.models import F, Q
from django.utils import timezone

log = logging.getLogger(__name__)

QUEUED, RUNNING = "queued", "running"  # the states every job kind shares


@dataclass(frozen=True)
class Lease:
    """One attempt's hold on its job: the row of ``model`` while it is ``running`` with this
    attempt number (``attempt``)."""

    model: type[models.Model]
    job_id: int
    attempt: int

    def rows(self) -> models.QuerySet:
        """The job's row, only while this attempt holds it (an UPDATE through it is a no-op
        once the attempt was given up)."""
        return self.model.objects.filter(  # type: ignore[attr-defined]
            pk=self.job_id, state=RUNNING, attempts=self.attempt
        )

    def holds(self) -> bool:
        """True while this attempt still holds the job."""
        return self.rows().exists()


def claim(
    model: type[models.Model], job_id: int, *, pid: int | None, only_if: dict | None = None, **also
) -> bool:
    """``queued`` -> ``running`` for job ``job_id`` of ``model`` unless someone took it first
    (one conditional UPDATE: the atomic claim on SQLite and PostgreSQL alike), with ``pid``,
    ``heartbeat_at`` now, ``attempts`` + 1, ``started_at`` now unless ``also`` sets it, and
    the other fields of ``also``. ``only_if``: more conditions on the queued row (a cancel
    not asked for). True when this caller claimed it."""
    now = timezone.now()
    fields: dict[str, Any] = {"started_at": now, **also}
    return bool(
        model.objects.filter(  # type: ignore[attr-defined]
            pk=job_id, state=QUEUED, **(only_if or {})
        ).update(state=RUNNING, pid=pid, heartbeat_at=now, attempts=F("attempts") + 1, **fields)
    )


@contextmanager
def hold(
    model: type[models.Model],
    pk: int,
    *,
    lease_s: float,
    renew_s: float,
    field: str = "lease_until",
) -> Iterator[bool]:
    """Hold step job ``pk`` of ``model`` for the ``with`` block: yields True when this caller
    got it (``field`` was unset or past, and is now ``lease_s`` seconds ahead, renewed every
    ``renew_s`` by a thread of its own until the block ends, then cleared), False when
    another holder has it (the block should then do nothing)."""
    now = timezone.now()
    free = model.objects.filter(pk=pk).filter(  # type: ignore[attr-defined]
        Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": now})
    )
    if not free.update(**{field: now + timedelta(seconds=lease_s)}):
        yield False
        return
    done = threading.Event()
    renewer = threading.Thread(
        target=_renew,
        args=(model, pk, field, lease_s, renew_s, done),
        name=f"{model._meta.model_name}-{pk}-lease",
    )
    renewer.start()
    try:
        yield True
    finally:
        done.set()
        renewer.join()  # before the release: a late renewal would hold the row
        model.objects.filter(pk=pk).update(**{field: None})  # type: ignore[attr-defined]


def _renew(
    model: type[models.Model],
    pk: int,
    field: str,
    lease_s: float,
    renew_s: float,
    done: threading.Event,
) -> None:
    """Every ``renew_s`` until ``done``: push the row's lease ``lease_s`` ahead."""
    try:
        while not done.wait(renew_s):
            until = timezone.now() + timedelta(seconds=lease_s)
            model.objects.filter(pk=pk).update(**{field: until})  # type: ignore[attr-defined]
    except Exception:  # the step goes on; at worst another holder takes over after lease_s
        log.exception("%s %s: lease renewal failed", model._meta.model_name, pk)
    finally:
        connection.close()  # this thread's own


def adopt(
    model: type[models.Model], job_id: int, *, attempt: int | None, **also: Any
) -> Lease | None:
    """Take up attempt ``attempt`` of job ``job_id`` in this process (the one a job process
    was started for: ``ProcessRunner.start``'s ``attempt``): through that attempt's lease,
    ``pid`` becomes this process's, with a first beat and the fields of ``also``. Returns the
    lease, or None when the attempt no longer holds the job (cancelled, or given up, and
    perhaps claimed again by another control loop, while this process started): the process
    must then do nothing, never take over the next attempt's lease. ``attempt`` None: the
    attempt the row holds now (a process started by hand, or one that just claimed it)."""
    if attempt is None:
        rows = model.objects.filter(pk=job_id)  # type: ignore[attr-defined]
        attempt = rows.values_list("attempts", flat=True).first()
        if attempt is None:
            return None
    lease = Lease(model, job_id, attempt)
    if not lease.rows().update(pid=os.getpid(), heartbeat_at=timezone.now(), **also):
        return None
    return lease


def beat_is_fresh(beat: datetime | None, stale_s: float) -> bool:
    """True when a heartbeat (or the start, for a job that has not beaten yet) is younger
    than ``stale_s`` seconds."""
    return beat is not None and (timezone.now() - beat).total_seconds() < stale_s


class Heartbeat:
    """A thread that writes the attempt's ``heartbeat_at`` every ``interval_s`` seconds and
    stops the attempt when ``cancel_field`` is set on its row or the attempt lost its lease:
    a process the control loop started (``own_process_group``) gets SIGTERM to its group
    (with whatever it started), an in-process attempt an interrupt in its main thread."""

    def __init__(
        self,
        lease: Lease,
        *,
        interval_s: float,
        cancel_field: str,
        own_process_group: bool = False,
    ) -> None:
        self.lease, self.interval_s, self.cancel_field = lease, interval_s, cancel_field
        self.own_process_group = own_process_group
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"job-{lease.job_id}-heartbeat", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    if not self._beat():
                        self._stop_the_run()
                        return
                except Exception:  # a missed beat is not the job's failure; the next may land
                    log.warning("job %s: heartbeat not written", self.lease.job_id, exc_info=True)
        finally:
            connection.close()

    def _beat(self) -> bool:
        """Write the beat; False when the attempt must stop (cancelled, or no longer its)."""
        rows = self.lease.rows()
        if not rows.update(heartbeat_at=timezone.now()):
            return False
        return not rows.filter(**{self.cancel_field: True}).exists()

    def _stop_the_run(self) -> None:
        if self._stop.is_set():
            return
        if self.own_process_group:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        else:
            _thread.interrupt_main()


def child_environment() -> dict[str, str]:
    """This process's environment, with the SQLite file it is connected to (the same
    database whatever ``PHALANX_HOME`` the child would derive; the test database in tests)."""
    env = {**os.environ, "PHALANX_HOME": str(settings.VAR_DIR)}
    if connection.vendor == "sqlite":
        env["PHALANX_SQLITE"] = str(connection.settings_dict["NAME"])
    return env


class ProcessRunner:
    """The job processes of one kind this control loop started, by job id: each is
    ``manage.py <command> [--attempt N] <id>`` in a process group of its own (killed whole), its output
    appended to ``var/logs/<log_prefix>-<id>.log``. The loop signals only these, never a pid
    read from a row."""

    def __init__(self, command: str, log_prefix: str) -> None:
        self.command, self.log_prefix = command, log_prefix
        self.children: dict[int, subprocess.Popen] = {}

    def start(self, job_id: int, *, attempt: int | None = None) -> subprocess.Popen:
        """Start job ``job_id``'s process for attempt ``attempt`` (``--attempt N``: the
        process takes up that attempt only, ``adopt``). Raises ``OSError`` when it cannot
        start."""
        args = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), self.command]
        if attempt is not None:
            args += ["--attempt", str(attempt)]
        logfile = Path(settings.VAR_DIR) / "logs" / f"{self.log_prefix}-{job_id}.log"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "ab") as out:
            child = subprocess.Popen(
                [*args, str(job_id)],
                cwd=settings.BASE_DIR,
                env=child_environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a kill takes what it started
            )
        self.children[job_id] = child
        return child

    def started(self, job_id: int) -> bool:
        """True when this loop started job ``job_id``'s process (it may have ended since)."""
        return job_id in self.children

    def exited(self, job_id: int) -> bool | None:
        """Whether the process this loop started for ``job_id`` has exited; None when this
        loop started none."""
        child = self.children.get(job_id)
        return None if child is None else child.poll() is not None

    def forget(self, job_id: int) -> None:
        """Wait for the process of ``job_id`` if it ended (no zombie) and forget it."""
        child = self.children.pop(job_id, None)
        if child is not None:
            child.poll()

    def reap(self, keep: Callable[[int], bool]) -> None:
        """Forget the processes that ended, unless ``keep(job_id)``."""
        for job_id, child in list(self.children.items()):
            if child.poll() is not None and not keep(job_id):
                self.children.pop(job_id, None)

    def kill(self, job_id: int, *, grace_s: float = 5.0) -> None:
        """Stop the process group of ``job_id``'s process: SIGTERM (the job unwinds), then
        SIGKILL after ``grace_s`` seconds (at once when 0: a hung process)."""
        child = self.children.pop(job_id, None)
        if child is None:
            return  # the group may outlive its leader (a node it started): signal it anyway
        if grace_s > 0:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                return
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(child.pid, signal.SIGKILL)  # what it started (a node) goes with it
        except (ProcessLookupError, PermissionError):
            pass
        child.wait(timeout=10)
