"""The console app: operator pages, access control, live events, config as a file."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console.lib.steps import Periodic, lazy, register_periodic

        register_periodic(
            Periodic("log retention", lazy("console.lib.log_store.records_trim_now"), 60.0)
        )
