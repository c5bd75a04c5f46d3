"""The registry of step kinds and periodic work, and the runner that gives each a thread.

A step kind is a kind of step job (rolling upgrades, device validations): ``due()`` says
which of its jobs to step now, ``step(job_id)`` advances one job by one step (under
``console.lib.jobs.hold``, so one control loop steps a job at a time). Periodic work is a
function called every ``interval_s`` (utilization samples, idle-route release, the package
jobs' and load tests' ticks). Each app registers its own in ``AppConfig.ready()``, the way
``AUTHENTICATION_BACKENDS`` work (the plumbing imports no app): ``register_step_kind``,
``register_periodic``, by dotted path (``lazy``), so that ``ready()``, which every process
runs, imports no feature's modules; they are imported when the control loop first ticks.

``run_registered(stop)`` (``manage.py controlloop``) starts one thread per kind and per
periodic work, so a two-minute smoke test never delays validation polls; the health-check
loop keeps its own. A step or a round that raises is logged and tried again at the next
tick; it never ends its thread. ``tick_registered()`` runs one round of everything in the
calling thread (``manage.py controlloop --once``, tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, connection
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)

Interval = float | Callable[[], float]  # seconds, or a function that reads them (a policy)


@dataclass(frozen=True)
class StepKind:
    """A kind of step job: ``due()`` -> ids of the jobs to step now; ``step(job_id)``
    advances one of them by one step; ``on_error(job_id, exc)`` (optional) records a step
    that raised (it is retried next tick whatever it does); every ``interval_s``."""

    name: str
    due: Callable[[], Iterable[int]]
    step: Callable[[int], object]
    interval_s: Interval = 1.0
    on_error: Callable[[int, Exception], None] | None = None

    def tick(self) -> None:
        """Step every due job once; a step that raises is logged (and ``on_error``) and does
        not hold up the others."""
        for job_id in list(self.due()):
            try:
                self.step(job_id)
            except Exception as exc:  # a bad step must not stop the others; it is retried
                log.exception("%s %s: step failed", self.name, job_id)
                if self.on_error is not None:
                    self.on_error(job_id, exc)


@dataclass(frozen=True)
class Periodic:
    """Work done every ``interval_s``: ``run()``; ``on_stop()`` (optional) once, on its
    thread, when the runner stops (after the last ``run``)."""

    name: str
    run: Callable[[], object]
    interval_s: Interval = 1.0
    on_stop: Callable[[], object] | None = None

    def tick(self) -> None:
        self.run()


def lazy(path: str) -> Callable[..., Any]:
    """The function at dotted ``path``, imported at its first call (``ready()`` registers
    work without importing the module that does it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return import_string(path)(*args, **kwargs)

    call.__qualname__ = call.__name__ = path
    return call


STEP_KINDS: list[StepKind | str] = []
PERIODIC: list[Periodic] = []


def register_step_kind(kind: StepKind | str) -> None:
    """Add ``kind`` to what the control loop steps: a ``StepKind``, or the dotted path of a
    function that returns one (called when the runner starts or ticks). Once each: a second
    ``ready()`` replaces it."""
    STEP_KINDS[:] = [k for k in STEP_KINDS if _key(k) != _key(kind)]
    STEP_KINDS.append(kind)


def register_periodic(work: Periodic) -> None:
    """Add ``work`` to what the control loop runs every ``work.interval_s`` (once per name)."""
    PERIODIC[:] = [w for w in PERIODIC if w.name != work.name]
    PERIODIC.append(work)


def _key(kind: StepKind | str) -> str:
    return kind if isinstance(kind, str) else kind.name


def registered() -> list[StepKind | Periodic]:
    """Everything registered: the step kinds, then the periodic work."""
    kinds = [import_string(k)() if isinstance(k, str) else k for k in STEP_KINDS]
    return [*kinds, *PERIODIC]


def tick_registered() -> None:
    """One round of every step kind and every periodic work, in this thread, in the order
    they were registered; one that raises is logged and does not stop the others."""
    for item in registered():
        _round(item)


def _round(item: StepKind | Periodic) -> None:
    try:
        item.tick()
    except Exception:  # e.g. the database locked while listing what is due: next tick
        log.exception("%s: tick failed", item.name)
    finally:
        close_old_connections()


def _interval(item: StepKind | Periodic) -> float:
    if not callable(item.interval_s):
        return item.interval_s
    try:
        return item.interval_s()
    except Exception:
        log.exception("%s: interval not read; 1 s", item.name)
        return 1.0


def _loop(item: StepKind | Periodic, stop: threading.Event) -> None:
    """Tick ``item`` every interval until ``stop``; then its ``on_stop``."""
    try:
        while not stop.is_set():
            _round(item)
            stop.wait(max(0.0, _interval(item)))
        if isinstance(item, Periodic) and item.on_stop is not None:
            item.on_stop()
    except Exception:
        log.exception("%s: stopping failed", item.name)
    finally:
        connection.close()  # this thread's own


def run_registered(stop: threading.Event) -> list[threading.Thread]:
    """Start one thread (a daemon) per step kind and per periodic work, each ticking until
    ``stop`` is set; returns them (join them after setting ``stop``)."""
    threads = [
        threading.Thread(target=_loop, args=(item, stop), name=item.name, daemon=True)
        for item in registered()
    ]
    for thread in threads:
        thread.start()
    return threads
