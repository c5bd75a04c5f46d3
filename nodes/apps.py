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
