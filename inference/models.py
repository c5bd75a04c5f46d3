"""The inference app's models: the routing policy, the session routing table and its
decisions, API tokens; and, re-exported from their features' own modules (migrations stay in
this app), packages (``inference.packages.models``), upgrades (``inference.upgrades.models``),
load tests (``inference.loadtests.models``), the semantic cache's namespaces
(``inference.semcache.models``) registered shared prefixes (``inference.prefixes.models``) and usage and quotas
(``inference.usage.models``)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.alerts.models import Alert, AlertDelivery, AlertSettings, AlertWebhook
from inference.loadtests.models import CostModel, LoadScenario, LoadTestRun, LoadTestSample
from inference.packages.models import ModelPackage, PackageJob, PackagePolicy
from inference.prefixes.models import SharedPrefix
from inference.semcache.models import CacheNamespace
from inference.upgrades.models import Upgrade, UpgradeEvent, UpgradeSample
from inference.usage.models import InflightLease, Quota, RateWindow, UsageMinute, UsageTurn

__all__ = [
    "Alert",
    "AlertDelivery",
    "AlertSettings",
    "AlertWebhook",
    "ApiToken",
    "CacheNamespace",
    "CostModel",
    "InflightLease",
    "LoadScenario",
    "LoadTestRun",
    "LoadTestSample",
    "ModelPackage",
    "PackageJob",
    "PackagePolicy",
    "Quota",
    "RateWindow",
    "RouteDecision",
    "RoutingPolicy",
    "SessionRoute",
    "SharedPrefix",
    "Upgrade",
    "UpgradeEvent",
    "UsageMinute",
    "UsageTurn",
    "UpgradeSample",
]


class RoutingPolicy(models.Model):
    """The single routing policy row (pk=1); read it with ``RoutingPolicy.load()``."""

    class FailoverStrategy(models.TextChoices):
        STICK_AND_REDIRECT = "stick_and_redirect", "Stick, redirect when the node fails or drains"
        STICK_AND_REBALANCE = (
            "stick_and_rebalance",
            "Stick, redirect on failure or drain, and move off an overloaded node (hysteresis)",
        )
        LEAST_LOADED = "least_loaded", "No affinity: every request to the least loaded node"

    session_header = models.CharField(max_length=64, default="X-Session-Id")
    model_aliases = models.JSONField(
        default=dict,
        blank=True,
        help_text='Other model names clients send, and the package each means: {"gpt-4o-mini": '
        '"smollm2-135m-instruct-q4_1"} (agent frameworks often hard-code a name).',
    )
    default_model = models.CharField(
        max_length=160,
        blank=True,
        default="",
        help_text="The package a request for a model this array does not know goes to "
        "(blank: such a request gets 404).",
    )
    health_interval_s = models.FloatField(
        default=5.0, validators=[MaxValueValidator(3600), MinValueValidator(0.1)]
    )
    failure_threshold = models.PositiveSmallIntegerField(
        default=3, validators=[MaxValueValidator(100), MinValueValidator(1)]
    )
    failover_strategy = models.CharField(
        max_length=32, choices=FailoverStrategy.choices, default=FailoverStrategy.STICK_AND_REDIRECT
    )
    probe_timeout_s = models.FloatField(
        default=2.0, validators=[MaxValueValidator(600), MinValueValidator(0.1)]
    )
    connect_timeout_s = models.FloatField(
        default=2.0, validators=[MaxValueValidator(600), MinValueValidator(0.1)]
    )
    request_timeout_s = models.FloatField(
        default=120.0,
        validators=[MaxValueValidator(3600), MinValueValidator(1.0)],
        help_text="Longest wait for the node's next byte (s).",
    )
    first_byte_floor_s = models.FloatField(
        default=5.0,
        validators=[MaxValueValidator(3600), MinValueValidator(0.1)],
        help_text="Shortest wait for a streamed answer's first byte (s); see first_byte_margin.",
    )
    first_byte_margin = models.FloatField(
        default=3.0,
        validators=[MaxValueValidator(100), MinValueValidator(1.0)],
        help_text="A streamed answer's first byte may take this many times the prompt's "
        "estimated prefill on the node (at least first_byte_floor_s).",
    )
    max_attempts = models.PositiveSmallIntegerField(
        default=3,
        validators=[MaxValueValidator(10), MinValueValidator(1)],
        help_text="Nodes tried for one request when it fails before its first byte.",
    )
    retry_backoff_ms = models.PositiveIntegerField(
        default=50,
        help_text="Wait before the 2nd attempt (ms); doubles per attempt, capped at 1 s.",
        validators=[MaxValueValidator(60000)],
    )
    recovery_threshold = models.PositiveSmallIntegerField(
        default=2,
        validators=[MaxValueValidator(100), MinValueValidator(1)],
        help_text="Consecutive good probes before a down node is up again (flap damping).",
    )
    session_idle_release_s = models.FloatField(
        default=1800.0,
        validators=[MaxValueValidator(2592000), MinValueValidator(1.0)],
        help_text="A session idle this long loses its pin; its next turn is placed afresh (s).",
    )
    overload_threshold = models.FloatField(
        default=1.5,
        validators=[MaxValueValidator(100), MinValueValidator(0.1)],
        help_text="Load per weight at which a pinned session may move (stick_and_rebalance).",
    )
    rebalance_target = models.FloatField(
        default=0.5,
        validators=[MaxValueValidator(100), MinValueValidator(0.0)],
        help_text="A rebalanced session only moves to a node below this load per weight.",
    )
    move_cooldown_s = models.FloatField(
        default=120.0,
        validators=[MaxValueValidator(86400), MinValueValidator(0.0)],
        help_text="A session that moved for load does not move for load again within this (s).",
    )
    canary_idle_s = models.FloatField(
        default=60.0,
        validators=[MaxValueValidator(86400), MinValueValidator(0.0)],
        help_text="After this long without traffic, health checks add a 1-token completion "
        "(s; 0 turns canaries off).",
    )
    canary_timeout_s = models.FloatField(
        default=10.0, validators=[MaxValueValidator(600), MinValueValidator(0.1)]
    )
    max_inflight_per_node = models.PositiveIntegerField(
        default=64,
        help_text="Requests one control-plane process keeps open to one node; past it, 429.",
        validators=[MaxValueValidator(1000000)],
    )
    max_inflight = models.PositiveIntegerField(
        default=512,
        help_text="Requests one control-plane process keeps open in all; past it, 429.",
        validators=[MaxValueValidator(1000000)],
    )
    queue_wait_s = models.FloatField(
        default=0.0,
        validators=[MaxValueValidator(600), MinValueValidator(0.0)],
        help_text="A turn past max_inflight waits up to this long for a slot, higher token "
        "priority first (s; 0: refused at once with 429).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "routing policy"

    def __str__(self) -> str:
        return "Routing policy"

    def clean(self) -> None:
        errors = {}
        if self.rebalance_target >= self.overload_threshold:
            errors["rebalance_target"] = (
                "Must be below overload_threshold, or sessions would bounce between nodes."
            )
        if not self.session_header.strip() or any(c in self.session_header for c in " :\r\n"):
            errors["session_header"] = "Must be an HTTP header name such as X-Session-Id."
        elif not self.session_header.lower().startswith("x-"):
            errors["session_header"] = (
                "Must be a custom header (X-...): a standard one such as Host would give every "
                "client the same session."
            )
        if self.model_aliases in (None, ""):
            self.model_aliases = {}
        aliases = self.model_aliases
        if not isinstance(aliases, dict) or not all(
            isinstance(k, str) and k.strip() and isinstance(v, str) and v.strip()
            for k, v in aliases.items()
        ):
            errors["model_aliases"] = 'Must map model names to package names: {"alias": "package"}.'

        if errors:
            raise ValidationError(errors)

    def save(self, *args, **kwargs) -> None:
        self.pk = 1
        super().save(*args, **kwargs)

    @classmethod
    def load(cls) -> RoutingPolicy:
        """The policy row, created with defaults on first use."""
        policy, _ = cls.objects.get_or_create(pk=1)
        return policy


class SessionRoute(models.Model):
    """The routing table: where a session is pinned and what it has said.

    ``transcript`` is a list of OpenAI chat messages (``{"role": ..., "content": ...}``) kept for
    websocket clients, which send only the new message; REST clients send the whole history and
    their turns are not stored here.
    """

    session_id = models.CharField(max_length=200, unique=True)
    node = models.ForeignKey(
        "nodes.Node",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="session_routes",
    )
    package = models.ForeignKey(
        ModelPackage,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="session_routes",
    )
    turns = models.PositiveIntegerField(default=0)
    moves = models.PositiveIntegerField(default=0)
    version_changes = models.PositiveIntegerField(
        default=0, help_text="Turns served by another package version than the one before."
    )
    moved_for_load_at = models.DateTimeField(null=True, blank=True)
    transcript = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.session_id


class RouteDecision(models.Model):
    """One entry of a session's decision log: why it was placed on or moved to a node."""

    class Action(models.TextChoices):
        PLACED = "placed", "Placed"
        MOVED = "moved", "Moved"
        RELEASED = "released", "Released"
        KV_MOVED = "kv_moved", "KV moved"
        VERSION_CHANGED = "version_changed", "Version changed"

    route = models.ForeignKey(SessionRoute, on_delete=models.CASCADE, related_name="decisions")
    action = models.CharField(max_length=16, choices=Action.choices)
    node_id = models.CharField(max_length=64)
    reason = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.reason


class ApiToken(models.Model):
    """A Bearer token for ``/v1/`` and the websockets; only its sha256 is stored.

    ``prefix`` (the first characters of the plaintext) lets an operator recognise a token.
    """

    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    # answers to its stateless requests come from the semantic cache when they can
    # (docs/semcache.md); a request opts in or out itself with X-Phalanx-Cache
    cache_answers = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
