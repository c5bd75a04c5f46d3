"""``manage.py loadtest SCENARIO [--file scenario.yaml] [--target URL] [--token T] [--profile]``:
run a load test here, headless, and end with one JSON line of its headline figures
(``inference.loadtests.report.headline``): ``knee_concurrency``, ``session_p95_s``,
``turn_ttft_p95_s``, ``errors``, ``requests``, ``sessions_per_node``, ``cost_per_session`` ...

The run is a row like any other (its page shows it live and keeps its report); progress goes to
stderr once a second. Ctrl-C stops it and still prints the report of what it measured. Exit
status: 0 when it succeeded or was stopped, 1 when it failed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from django.core.management.base import CommandError

from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from console.lib.errors import ConsoleError
from inference.loadtests import services
from inference.loadtests.jobs import loadtest_execute
from inference.loadtests.report import headline
from inference.loadtests.scenario import MAX_YAML_CHARS
from inference.management.commands.loadtestjob import quiet_clients, stop_on_signal


class Command(ArrayCommand):
    help = "Run a load-test scenario (stored, built in, or from a YAML file); print JSON."

    def add_arguments(self, parser) -> None:
        parser.add_argument("scenario", nargs="?", help="a stored or built-in scenario's name")
        parser.add_argument("--file", help="a YAML scenario file (instead of a stored name)")
        parser.add_argument("--target", help="base URL of the array (default: this array's)")
        parser.add_argument("--token", default="", help="Bearer token for --target")
        parser.add_argument("--profile", action="store_true", help="take flame graphs")
        parser.add_argument("--quiet", action="store_true", help="no progress on stderr")

    def handle(self, *args, **options) -> None:
        if bool(options["scenario"]) == bool(options["file"]):
            raise CommandError("name a scenario or give --file (one of them)")
        with acting_as("cli"):
            try:
                run = services.loadtest_start(
                    scenario=options["scenario"],
                    spec=self._spec(options["file"]),
                    target_url=options["target"],
                    token=options["token"],
                    profile=options["profile"],
                    claim_pid=os.getpid(),
                )
            except ConsoleError as exc:
                raise CommandError(exc.message) from exc
            self.stderr.write(f"load test {run.pk}: {run.scenario_name} against {run.target_url}")
            stop_on_signal(run.pk)
            quiet_clients()
            echo = None if options["quiet"] else (lambda line: self.stderr.write(line))
            done = loadtest_execute(run.pk, claimed=True, echo=echo)
        if done.error:
            self.stderr.write(f"failed: {done.error}")
        self.stdout.write(
            json.dumps(
                headline(done.report, run_id=done.pk)
                if done.report
                else {"run": done.pk, "state": done.state, "error": done.error}
            )
        )
        if done.state == "failed":
            sys.exit(1)

    @staticmethod
    def _spec(path: str | None) -> dict | None:
        if not path:
            return None
        try:
            with Path(path).open(encoding="utf-8") as handle:
                text = handle.read(MAX_YAML_CHARS + 1)  # more is refused: never read it whole
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"--file: {exc}") from exc
        try:
            return services.scenario_parse(yaml_text=text).as_spec()
        except ConsoleError as exc:
            raise CommandError(f"{path}: {exc.message}") from exc
