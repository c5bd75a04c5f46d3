"""The console app: operator pages, access control, live events, config as a file."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
    default_auto_field = "django.db.models.BigAutoField"
