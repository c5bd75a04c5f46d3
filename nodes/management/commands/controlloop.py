"""``manage.py controlloop [--once]``: run the health-check loop (see ``nodes.control``) and,
each on a thread of its own, the step kinds and periodic work the apps registered
(``console.lib.steps``: rolling upgrades, device validations, utilization samples, package
jobs, load tests, idle-route release): a smoke test takes seconds and must not hold up health
checks, nor validation polls. ``--once``: one health-check round and one round of each."""

from __future__ import annotations

import signal
import time

from console.lib.commands import ArrayCommand
from console.lib.steps import run_registered, tick_registered
from nodes.control import ControlLoop


class Command(ArrayCommand):
    help = "Probe every node at the routing policy's interval; mark nodes down and up."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="run one tick, print it, exit")

    def handle(self, *args, **options) -> None:
        loop = ControlLoop()
        if options["once"]:
            report = loop.tick()
            tick_registered()
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
        threads = run_registered(loop.stop_event)
        try:
            loop.run()
        finally:
            loop.stop()
            deadline = time.monotonic() + 30  # a step under way (a smoke chat) may finish
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
