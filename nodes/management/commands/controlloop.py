"""``manage.py controlloop [--once]``: run the health-check loop (see ``nodes.control``); each
tick also keeps a utilization sample (``nodes.utilization.record_sample``) and starts,
watches and cancels package jobs (``inference.packages.jobs.jobs_tick``) and starts load-test
workers (``inference.loadtests.jobs.loadtests_tick``). Rolling upgrades
step in a thread of their own (``inference.upgrades.driver.run``): a smoke test takes seconds
and must not hold up health checks; so do device validations (``nodes.device_validation.run``)."""

from __future__ import annotations

import signal
import threading

from console.lib.commands import ArrayCommand
from inference.loadtests.jobs import loadtests_tick
from inference.packages.jobs import jobs_shutdown, jobs_tick
from inference.upgrades import driver as upgrades
from nodes import device_validation
from nodes.control import ControlLoop
from nodes.utilization import record_sample


def after_tick() -> None:
    record_sample()
    jobs_tick()
    loadtests_tick()


class Command(ArrayCommand):
    help = "Probe every node at the routing policy's interval; mark nodes down and up."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="run one tick, print it, exit")

    def handle(self, *args, **options) -> None:
        loop = ControlLoop(after_tick=after_tick)
        if options["once"]:
            report = loop.tick()
            upgrades.upgrades_tick()
            device_validation.validation_step()
            for node_id, status in report.statuses.items():
                self.stdout.write(f"{node_id}: {status}")
            for event in report.events:
                self.stdout.write(
                    f"{event.node.node_id}: {event.get_kind_display()} ({event.message})"
                )
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: loop.stop())
        self.stdout.write("control loop running")
        upgrade_thread = threading.Thread(
            target=upgrades.run, args=(loop.stop_event,), name="upgrades", daemon=True
        )
        upgrade_thread.start()
        validation_thread = threading.Thread(
            target=device_validation.run, args=(loop.stop_event,), name="validation", daemon=True
        )
        validation_thread.start()
        try:
            loop.run()
        finally:
            jobs_shutdown()
            upgrade_thread.join(timeout=30)
            validation_thread.join(timeout=10)
