"""Alert rows: the thresholds (one row), one alert per (rule, subject), the webhooks and
their delivery outbox. Registered with the ``inference`` app (re-exported by
``inference.models``); docs/alerts.md."""

from __future__ import annotations

from typing import ClassVar

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class AlertSettings(models.Model):
    """The single row (pk=1) of alert thresholds, editable in the Django admin; read it with
    ``AlertSettings.load()``. Windows in seconds, rates per minute, ratios 0..1."""

    flap_window_s = models.PositiveIntegerField(default=600, validators=[MinValueValidator(60)])
    flap_count = models.PositiveSmallIntegerField(
        default=3, validators=[MinValueValidator(2)], help_text="Went-down events in the window."
    )
    window_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(30)],
        help_text="Window of the rate rules (error rate, KV store thrashing, queue saturation).",
    )
    error_rate_max = models.FloatField(
        default=0.05, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    error_rate_min_requests = models.PositiveIntegerField(default=20)
    ttft_p95_max_s = models.FloatField(default=1.0, validators=[MinValueValidator(0.001)])
    queue_saturation_ratio = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="Queued requests per configured sequence, held over the window.",
    )
    restores_skipped_per_min_max = models.FloatField(default=30.0)
    restores_per_min_max = models.FloatField(default=120.0)
    event_window_s = models.PositiveIntegerField(
        default=3600,
        validators=[MinValueValidator(60)],
        help_text="How long a rolled-back upgrade or a given-up job keeps its alert firing.",
    )

    class Meta:
        verbose_name = "alert settings"
        verbose_name_plural = "alert settings"

    def __str__(self) -> str:
        return "alert settings"

    @classmethod
    def load(cls) -> AlertSettings:
        """The settings row, created with defaults on first use."""
        row, _ = cls.objects.get_or_create(pk=1)
        return row


class Alert(models.Model):
    """One alert per (``rule``, ``subject``): ``firing`` while its condition holds,
    ``acknowledged`` by an operator (stays so while it holds), ``resolved`` when the condition
    clears or an operator resolves it; a resolved alert whose condition comes back fires anew
    (``fired_count`` + 1). ``value`` is the rule's measure at ``last_seen_at``."""

    class State(models.TextChoices):
        FIRING = "firing", "Firing"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        RESOLVED = "resolved", "Resolved"

    OPEN: ClassVar[tuple[str, ...]] = (State.FIRING, State.ACKNOWLEDGED)
    STATE_COLOURS: ClassVar[dict[str, str]] = {
        "firing": "red",
        "acknowledged": "orange",
        "resolved": "green",
    }

    rule = models.CharField(max_length=32)
    subject = models.CharField(max_length=128)
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    value = models.FloatField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    first_seen_at = models.DateTimeField(help_text="When this firing began.")
    last_seen_at = models.DateTimeField(help_text="When the condition last held.")
    fired_count = models.PositiveIntegerField(default=1)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(
        max_length=150, blank=True, default="", help_text="Empty when the condition cleared."
    )

    class Meta:
        ordering = ["-last_seen_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "subject"], name="alert_rule_subject")
        ]
        indexes = [models.Index(fields=["state"], name="alert_state")]

    def __str__(self) -> str:
        return f"{self.rule} {self.subject}: {self.state}"


class AlertWebhook(models.Model):
    """A URL that receives every alert's firing and resolving (a JSON POST signed with
    ``secret``: ``X-Phalanx-Signature: sha256=<hex HMAC of "<timestamp>.<body>">``). The
    secret is write-only: no page, API answer or log shows it."""

    name = models.CharField(max_length=64, unique=True)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AlertDelivery(models.Model):
    """The outbox: one row per (alert transition, webhook), sent at least once by the control
    loop: ``pending`` until a 2xx (``delivered``), retried with backoff, ``given_up`` after
    ``MAX_ATTEMPTS``. ``payload`` is the body as sent (same bytes on every attempt)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        GIVEN_UP = "given_up", "Given up"

    class Event(models.TextChoices):
        FIRING = "firing", "Firing"
        RESOLVED = "resolved", "Resolved"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    webhook = models.ForeignKey(AlertWebhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=Event.choices)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_error = models.CharField(max_length=255, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="delivery_due")]

    def __str__(self) -> str:
        return f"{self.event} of alert {self.alert_id} to {self.webhook_id}: {self.state}"
