"""``manage.py validate NODE``: validate a node now and print its report (the same service as
the page's "validate now" and ``POST /api/nodes/{id}/validations``). It advances the run
itself, so it works with or without a control loop (both may step it). Progress goes to
stderr; the last line on stdout is one JSON object: ``state``, ``seconds``, ``rules``,
``bench``, ``pool``, ``changes``. Exits 1 when the node failed, the run errored or did not
end in time.
``--no-wait`` queues the run and prints it; ``--waive REASON`` lets the node serve without
passing (admin's decision, audited)."""

from __future__ import annotations

import json
import sys

from django.core.management.base import CommandError

from console import services
from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from console.lib.errors import ConsoleError
from nodes.api_validation import ValidationRunOut, _run_out
from nodes.device_validation import validation_wait
from nodes.models import ValidationRun


class Command(ArrayCommand):
    help = "Validate a node's devices now (inventory, benchmarks, compatibility matrix)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("node_id")
        parser.add_argument("--no-wait", action="store_true", help="queue the run and return")
        parser.add_argument("--waive", metavar="REASON", help="let the node serve without passing")

    def handle(self, *args, **options) -> None:
        node_id = options["node_id"]
        try:
            with acting_as("manage.py validate"):
                if options["waive"] is not None:
                    node = services.node_waive_validation(node_id=node_id, reason=options["waive"])
                    self.stdout.write(json.dumps({"node": node_id, "validation": node.validation}))
                    return
                run = services.node_validate(node_id=node_id)
        except ConsoleError as exc:
            raise CommandError(str(exc)) from exc
        if not options["no_wait"]:
            run = validation_wait(run, on_step=self._progress)
        run = ValidationRun.objects.select_related("node").get(pk=run.pk)
        self.stdout.write(_run_out(run, ValidationRunOut).model_dump_json())
        if not run.finished or run.state in (ValidationRun.State.FAILED, ValidationRun.State.ERROR):
            sys.exit(1)

    def _progress(self, run: ValidationRun) -> None:
        if run.finished:
            for rule in run.rules:
                self.stderr.write(f"  {rule['status']:4}  {rule['rule']}: {rule['reason']}")
            self.stderr.write(f"{run.node.node_id}: {run.state} in {run.seconds or 0:.1f} s")
        else:
            self.stderr.write(f"{run.node.node_id}: {run.state} {run.phase} {run.progress:.0%}")
