"""Usage rows (per turn and per minute), quotas per token or role, and the database's rate
windows and in-flight leases (used when ``REDIS_URL`` is not set). Re-exported from
``inference.models``; migrations stay in the inference app."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "tool_calls",
)
SECONDS = ("prefill_s", "decode_s")


class UsageFigures(models.Model):
    """What a turn (or a minute of turns) used: counts, and node-seconds of prefill and decode
    (the node's share of each engine step: ``timings.prefill_node_ms``/``decode_node_ms``)."""

    caller = models.CharField(max_length=120, help_text="token:<id>, user:<name> or env")
    caller_name = models.CharField(max_length=120)
    model = models.CharField(max_length=200, help_text="the client-facing name (family)")
    package = models.CharField(max_length=200, blank=True, help_text="name:version that served")
    node_id = models.CharField(max_length=100, blank=True)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    prefill_s = models.FloatField(default=0.0)
    decode_s = models.FloatField(default=0.0)

    class Meta:
        abstract = True


class UsageTurn(UsageFigures):
    """One turn, as the proxy counted it (``requests`` is 1). Pruned after
    ``recorder.RAW_RETENTION_DAYS``; the minutes stay."""

    at = models.DateTimeField(db_index=True)
    session_id = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=128, blank=True)

    class Meta:
        indexes = [models.Index(fields=["session_id"])]


class UsageMinute(UsageFigures):
    """The turns of one minute (UTC, truncated) for one caller, model, package and node."""

    minute = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "caller", "model", "package", "node_id"],
                name="usage_minute_key",
            )
        ]


class Quota(models.Model):
    """Limits of one API token, or the default of a role (exactly one of the two is set).

    A blank limit inherits: a token's from its role's default, a role's means no limit; 0 is
    no limit. ``priority`` 0-9 (higher first) decides who waits when the control plane is
    full (``inference.usage.priority``)."""

    token = models.OneToOneField(
        "inference.ApiToken", null=True, blank=True, on_delete=models.CASCADE, related_name="quota"
    )
    role = models.CharField(max_length=16, blank=True, default="")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    concurrent_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    priority = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(9)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    LIMITS = (
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
        "concurrent_sessions",
        "max_tokens",
        "priority",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["role"], condition=~models.Q(role=""), name="quota_one_per_role"
            )
        ]

    def __str__(self) -> str:
        return f"quota of token {self.token_id}" if self.token_id else f"quota of {self.role}"


class RateWindow(models.Model):
    """A fixed window's count for one caller and limit (the database backend of
    ``inference.usage.limits``): ``key`` is ``<caller>:<limit>:<window start, epoch s>``."""

    key = models.CharField(max_length=200, unique=True)
    count = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField(db_index=True)


class InflightLease(models.Model):
    """A turn in flight of a caller with a concurrent-sessions limit (database backend)."""

    caller = models.CharField(max_length=120, db_index=True)
    lease = models.CharField(max_length=40, unique=True)
    expires_at = models.DateTimeField()
