"""Shared prefixes registered by operators (``/prefixes/``, ``/api/prefixes``). Registered with
the ``inference`` app (imported by ``inference.models``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SharedPrefix(models.Model):
    """An agent's opening, registered ahead of its traffic: its leading ``system`` message
    and its ``tools`` (OpenAI's shapes). Every healthy node serving ``model`` (a client-facing
    model name; blank: every model) is sent it, prefills its KV, keeps it on its prefix shelf
    across restarts and publishes its ``agent`` fingerprint (``inference.agent_prefix``), so
    placement prefers those nodes for the agent's new sessions."""

    name = models.SlugField(max_length=64, unique=True)
    model = models.CharField(max_length=128, blank=True, default="")
    system = models.TextField()
    tools = models.JSONField(default=list, blank=True)
    agent = models.CharField(max_length=16, help_text="agent_fingerprint of system and tools")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def messages(self) -> list[dict[str, str]]:
        """The opening as OpenAI messages (what a node renders and prefills)."""
        return [{"role": "system", "content": self.system}]
