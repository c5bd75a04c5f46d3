from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    verbose_name = "Nodes"
