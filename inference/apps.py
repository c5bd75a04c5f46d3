from __future__ import annotations

from django.apps import AppConfig


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
        from inference.tokens import token_match

        register_token_resolver(token_match)
        register_collector(metrics.routing_families)
        for name, help_text in metrics.COUNTERS.items():
            register_counter(name, help_text)
