"""``manage.py packagejob ID``: run one package job in this process (the control loop starts
it; ``inference.packages.jobs``)."""

from __future__ import annotations

import signal
import sys

from django.core.management.base import CommandError

from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from inference.models import PackageJob
from inference.packages.jobs import job_execute


class Command(ArrayCommand):
    help = "Run one package job (import, build, evaluate) to its end."

    def add_arguments(self, parser) -> None:
        parser.add_argument("job_id", type=int)
        parser.add_argument(
            "--attempt", type=int, default=None, help="the attempt the control loop claimed"
        )

    def handle(self, *args, **options) -> None:
        job = PackageJob.objects.filter(pk=options["job_id"]).first()
        if job is None:
            raise CommandError(f"no job {options['job_id']}")
        # a cancel (SIGTERM to the job's process group) unwinds the job: the node an evaluation
        # started is stopped by its context manager, the scratch space removed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with acting_as(job.created_by or "system"):
            done = job_execute(job.pk, claimed=True, attempt=options["attempt"])
        self.stdout.write(f"job {done.pk}: {done.state} {done.error}".rstrip())
