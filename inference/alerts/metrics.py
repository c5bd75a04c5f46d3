"""What the control plane's ``/metrics`` says of alerts and of work that ended: open alerts by
state, upgrades and jobs by the state they ended in (counted from their rows; the alerting
rules file takes their ``increase()``). Registered in ``InferenceConfig.ready``."""

from __future__ import annotations

from django.db.models import Count

from console.lib.metrics import Write
from inference.alerts.models import Alert
from inference.loadtests.models import LoadTestRun
from inference.packages.models import PackageJob
from inference.upgrades.models import Upgrade


def alert_families(write: Write) -> None:
    """``phalanx_alerts{state}``, ``phalanx_upgrades_finished_total{state}`` and
    ``phalanx_jobs_finished_total{kind, state}`` (kind: ``package``, ``loadtest``)."""
    alerts = dict(Alert.objects.values_list("state").annotate(n=Count("id")))
    write(
        "phalanx_alerts",
        "gauge",
        "Alerts by state.",
        [({"state": s.value}, alerts.get(s.value, 0)) for s in Alert.State],
    )
    upgrades = Upgrade.objects.filter(state__in=Upgrade.FINISHED).values_list("state")
    write(
        "phalanx_upgrades_finished_total",
        "counter",
        "Upgrades by the state they ended in.",
        [({"state": s}, n) for s, n in upgrades.annotate(n=Count("id"))],
    )
    jobs = [
        ({"kind": kind, "state": s}, n)
        for kind, model in (("package", PackageJob), ("loadtest", LoadTestRun))
        for s, n in model.objects.filter(state__in=model.FINISHED)
        .values_list("state")
        .annotate(n=Count("id"))
    ]
    write("phalanx_jobs_finished_total", "counter", "Jobs by the state they ended in.", jobs)
