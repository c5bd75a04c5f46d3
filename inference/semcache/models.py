"""The semantic cache's settings per namespace, edited by operators (``/cache/``,
``PUT /api/cache/namespaces/{name}``). Registered with the ``inference`` app (imported by
``inference.models``); the entries themselves live in the cache's store
(``inference.semcache.store``), not here."""

from __future__ import annotations

from django.db import models


class CacheNamespace(models.Model):
    """``name`` is ``tools:<tool>`` (a tool's results: cached only once a row enables it) or
    ``answers:<model>`` (a model's answers; without a row the defaults of
    ``inference.semcache.service`` apply). ``threshold`` is the cosine similarity a semantic
    hit needs; ``ttl_s`` how long an entry lives; ``max_entries`` how many are kept."""

    name = models.CharField(max_length=200, unique=True)
    enabled = models.BooleanField(default=True)
    threshold = models.FloatField()
    ttl_s = models.PositiveIntegerField()
    max_entries = models.PositiveIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
