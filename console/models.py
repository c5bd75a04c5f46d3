"""Console tables: the role of each API token and the array settings that only the config file
carries (listen address, model path, accelerator modules, context window, max batch)."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models


class Role(models.TextChoices):
    """Who may do what: admin (everything), operator (drain, upgrade, load test, edit policy),
    viewer (read only). Ordered by power: see ``console.lib.access.ROLE_RANK``."""

    ADMIN = "admin", "Admin"
    OPERATOR = "operator", "Operator"
    VIEWER = "viewer", "Viewer"


class TokenRole(models.Model):
    """The role an ``inference.ApiToken`` acts with on ``/api/``. A token without a row acts as
    ``operator`` (tokens minted by ``bootstrap`` before roles existed)."""

    token = models.OneToOneField(
        "inference.ApiToken", on_delete=models.CASCADE, related_name="console_role"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    def __str__(self) -> str:
        return f"{self.token_id}: {self.role}"


class ArrayConfig(models.Model):
    """The single row (pk=1) of settings from the config file's ``server`` and ``inference``
    sections that no other table holds; read it with ``ArrayConfig.load()``."""

    listen = models.CharField(max_length=255, blank=True, default="")
    model_path = models.CharField(max_length=1024, blank=True, default="")
    ai_modules = models.CharField(
        max_length=255, blank=True, default="", help_text="Comma-separated accelerator modules."
    )
    context_window = models.PositiveIntegerField(null=True, blank=True)
    max_batch = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "array config"

    def __str__(self) -> str:
        return "Array config"

    def save(self, *args, **kwargs) -> None:
        self.pk = 1
        super().save(*args, **kwargs)

    @classmethod
    def load(cls) -> ArrayConfig:
        """The row, created empty on first use."""
        config, _ = cls.objects.get_or_create(pk=1)
        return config


class UtilizationSample(models.Model):
    """One utilization snapshot kept by the control loop (shape in ``nodes.utilization``),
    so the history an operator sees does not depend on a console tab having been open."""

    taken_at = models.DateTimeField(db_index=True)
    snapshot = models.JSONField()

    class Meta:
        ordering = ["taken_at"]


class AuditEntry(models.Model):
    """One change an operator (or a command) made: who, when, what, and each field's before
    and after (``console.lib.audit``)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=255, blank=True, default="")
    changes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"


class LogRecord(models.Model):
    """One structured log record of any Phalanx process, kept centrally (``console.lib.log_store``):
    shipped by the process that wrote it (``console.lib.log_shipping``), trimmed by age and
    size by the control loop, read on the Logs page and ``GET /api/logs``."""

    time = models.DateTimeField(db_index=True)
    level = models.CharField(max_length=10)  # debug, info, warning, error, critical
    levelno = models.PositiveSmallIntegerField(db_index=True)  # logging's number: 10 ... 50
    process = models.CharField(max_length=40, db_index=True)  # serve, controlloop, runnode ...
    node_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    session_id = models.CharField(max_length=128, blank=True, default="", db_index=True)
    request_id = models.CharField(max_length=128, blank=True, default="", db_index=True)
    logger = models.CharField(max_length=128, blank=True, default="")
    event = models.TextField()  # the message
    fields = models.JSONField(default=dict, blank=True)  # every other key of the record
    size = models.PositiveIntegerField(default=0)  # bytes of the record as shipped

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.level.upper()} {self.process}: {self.event}"
