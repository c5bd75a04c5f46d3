"""The inference app's configuration: what it registers with the plumbing in ``ready()``
(token resolver, metrics, the control loop's work)."""

from __future__ import annotations

from django.apps import AppConfig

UPLOAD_SWEEP_S = 60.0  # abandoned uploads are removed after a day; a minute late is no matter


class InferenceConfig(AppConfig):
    name = "inference"
    label = "inference"
    verbose_name = "Inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console.lib.access import register_token_resolver
        from console.lib.metrics import register_collector, register_counter
        from inference import control_plane_metrics as metrics
        from inference import lookups  # noqa: F401  (connects its cache-clearing signals)
        from inference.alerts.metrics import alert_families
        from inference.tokens import token_match
        from inference.usage.metrics import usage_families

        register_token_resolver(token_match)
        register_collector(metrics.routing_families)
        register_collector(alert_families)
        register_collector(usage_families)
        for name, help_text in metrics.COUNTERS.items():
            register_counter(name, help_text)
        self.register_control_loop_work()

    @staticmethod
    def register_control_loop_work() -> None:
        """What inference gives the control loop: the routing policy it follows
        (``nodes.health_policy``), rolling upgrades (a step kind), and, every health-check
        interval unless said, the package jobs' tick, the load tests' tick, idle-route release,
        the alert rules, each second the upgrades' traffic samples and the alert webhooks'
        deliveries, every ``UPLOAD_SWEEP_S`` the sweep of abandoned uploads, and every
        minute the semantic cache's sweep of expired entries, every five minutes the pruning of
        usage turn rows and rate windows."""
        from console.lib.steps import Periodic, lazy, register_periodic, register_step_kind
        from inference.models import RoutingPolicy
        from nodes.health_policy import health_interval_s, register_policy_source

        register_policy_source(RoutingPolicy.load)
        register_step_kind("inference.upgrades.driver.upgrades_step_kind")
        for work in (
            Periodic("upgrade samples", lazy("inference.upgrades.driver.upgrades_sample")),
            Periodic(
                "package jobs",
                lazy("inference.packages.jobs.jobs_tick"),
                interval_s=health_interval_s,
                on_stop=lazy("inference.packages.jobs.jobs_shutdown"),
            ),
            Periodic(
                "load tests", lazy("inference.loadtests.jobs.loadtests_tick"), health_interval_s
            ),
            Periodic(
                "upload sweep",
                lazy("inference.packages.uploads.uploads_collect_stale"),
                UPLOAD_SWEEP_S,
            ),
            Periodic(
                "alerts", lazy("inference.alerts.services.alerts_evaluate"), health_interval_s
            ),
            Periodic("alert webhooks", lazy("inference.alerts.webhooks.deliveries_send_due")),
            Periodic(
                "idle routes", lazy("inference.apps.routes_release_idle_now"), health_interval_s
            ),
            Periodic("semantic cache sweep", lazy("inference.semcache.service.sweep_now"), 60.0),
            Periodic("usage pruning", lazy("inference.usage.recorder.usage_prune"), 300.0),
            Periodic(
                "shared prefixes",
                lazy("inference.prefixes.services.prefixes_send_due"),
                health_interval_s,
            ),
        ):
            register_periodic(work)


def routes_release_idle_now() -> None:
    """Release the session pins idle past the routing policy's ``session_idle_release_s``."""
    from inference.models import RoutingPolicy
    from inference.services import routes_release_idle

    routes_release_idle(idle_s=RoutingPolicy.load().session_idle_release_s)
