"""``manage.py loadtestjob ID``: run one queued load test in this process (the control loop
starts it; ``inference.loadtests.jobs``)."""

from __future__ import annotations

import logging
import signal
import threading

from django.core.management.base import CommandError

from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from inference.loadtests.jobs import loadtest_execute
from inference.loadtests.models import LoadTestRun


def quiet_clients() -> None:
    """One log line per request (httpx's INFO) would drown the progress lines."""
    for name in ("httpx", "httpx2", "openai", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def stop_on_signal(run_id: int) -> None:
    """SIGTERM / SIGINT ask the run to stop (it keeps what it measured), as the Stop button
    does."""

    def ask(*_: object) -> None:
        threading.Thread(
            target=lambda: LoadTestRun.objects.filter(pk=run_id).update(cancel_requested=True)
        ).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, ask)


class Command(ArrayCommand):
    help = "Run one load test to its end (started by the control loop)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument(
            "--attempt", type=int, default=None, help="the attempt the control loop claimed"
        )

    def handle(self, *args, **options) -> None:
        run = LoadTestRun.objects.filter(pk=options["run_id"]).first()
        if run is None:
            raise CommandError(f"no load test {options['run_id']}")
        stop_on_signal(run.pk)
        quiet_clients()
        with acting_as(run.created_by or "system"):
            done = loadtest_execute(run.pk, claimed=True, attempt=options["attempt"])
        self.stdout.write(f"load test {done.pk}: {done.state} {done.error}".rstrip())
