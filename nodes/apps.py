from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    label = "nodes"
    verbose_name = "Nodes"
    default_auto_field = "django.db.models.BigAutoField"
