"""The registry of step kinds and periodic work and its runner (``console.lib.steps``): each
kind on a thread of its own (a slow step of one kind does not delay another's ticks), a step
that raises logged and tried again next tick without ending its thread, one round of
everything (``tick_registered``), and what the apps register in ``ready()``."""

from __future__ import annotations

import threading
import time

import pytest

from console.lib import steps
from console.lib.steps import Periodic, StepKind, run_registered, tick_registered


@pytest.fixture
def registry(monkeypatch):
    """An empty registry of its own (the apps' registrations put back after)."""
    monkeypatch.setattr(steps, "STEP_KINDS", [])
    monkeypatch.setattr(steps, "PERIODIC", [])


def until(what, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_slow_step_of_one_kind_does_not_delay_another_kinds_ticks(registry):
    release, slow_started, fast_ticks = threading.Event(), threading.Event(), []

    def slow_step(job_id: int) -> None:  # a two-minute smoke test, in short
        slow_started.set()
        release.wait(10)

    steps.register_step_kind(StepKind("slow", due=lambda: [1], step=slow_step, interval_s=0.01))
    steps.register_periodic(Periodic("fast", lambda: fast_ticks.append(1), interval_s=0.01))
    stop = threading.Event()
    threads = run_registered(stop)
    try:
        assert {t.name for t in threads} == {"slow", "fast"}
        assert slow_started.wait(10)
        assert until(lambda: len(fast_ticks) >= 5)  # while the slow step is still under way
        assert not release.is_set()
    finally:
        release.set()
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


def test_a_step_that_raises_is_logged_and_retried_next_tick(registry, caplog):
    calls, errors = [], []

    def flaky(job_id: int) -> None:
        calls.append(job_id)
        if len(calls) == 1:
            raise RuntimeError("database is locked")

    steps.register_step_kind(
        StepKind(
            "flaky", due=lambda: [7], step=flaky, on_error=lambda i, e: errors.append((i, str(e)))
        )
    )
    tick_registered()
    tick_registered()
    assert calls == [7, 7]
    assert errors == [(7, "database is locked")]
    assert "flaky 7: step failed" in caplog.text


def test_a_kind_that_always_raises_never_ends_its_thread(registry):
    calls, stopped = [], []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("bad tick")

    steps.register_periodic(
        Periodic("broken", broken, interval_s=0.01, on_stop=lambda: stopped.append(1))
    )
    stop = threading.Event()
    (thread,) = run_registered(stop)
    try:
        assert until(lambda: len(calls) >= 3)
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=10)
    assert stopped == [1]  # its on_stop, once, after the last tick


def test_one_round_runs_every_kind_once_in_order(registry):
    seen = []
    steps.register_step_kind(StepKind("a", due=lambda: [1, 2], step=lambda i: seen.append(i)))
    steps.register_periodic(Periodic("b", lambda: seen.append("b")))
    steps.register_periodic(Periodic("b", lambda: seen.append("b2")))  # the same name replaces
    tick_registered()
    assert seen == [1, 2, "b2"]


def test_a_lazy_function_is_imported_at_its_first_call():
    join = steps.lazy("os.path.join")
    assert join("a", "b") == "a/b"


def test_the_apps_register_their_kinds_and_periodic_work():
    names = {item.name for item in steps.registered()}
    assert names == {
        "upgrade",
        "validation",
        "utilization",
        "upgrade samples",
        "package jobs",
        "load tests",
        "idle routes",
        "upload sweep",
        "alerts",
        "alert webhooks",
        "log retention",
        "semantic cache sweep",
        "shared prefixes",
        "usage pruning",
    }
