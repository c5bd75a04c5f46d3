"""The nodes app's configuration: what it registers with the plumbing in ``ready()`` (metrics,
the control loop's work)."""

from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    label = "nodes"
    verbose_name = "Nodes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console.lib.metrics import register_collector
        from nodes.control_plane_metrics import node_families

        register_collector(node_families)
        self.register_control_loop_work()

    @staticmethod
    def register_control_loop_work() -> None:
        """Device validations (a step kind) and utilization samples (every health-check
        interval) for the control loop's runner (``console.lib.steps``)."""
        from console.lib.steps import Periodic, lazy, register_periodic, register_step_kind
        from nodes.health_policy import health_interval_s

        register_step_kind("nodes.device_validation.validation_step_kind")
        register_periodic(
            Periodic(
                "utilization", lazy("nodes.utilization.record_sample"), interval_s=health_interval_s
            )
        )
