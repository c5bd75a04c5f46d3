from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    label = "inference"
    verbose_name = "Inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from inference import lookups  # noqa: F401  (connects its cache-clearing signals)
