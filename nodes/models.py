"""Inventory of nodes: the processes that serve one model package each, and their event log."""

from __future__ import annotations

from typing import Any

from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

address_validator = RegexValidator(
    r"^[A-Za-z0-9.\-]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$",
    "Address must be host:port, for example 127.0.0.1:9401.",
)
cpu_set_validator = RegexValidator(
    r"^$|^\d+(-\d+)?(,\d+(-\d+)?)*$", "CPU set is a CPU list such as 0, 0-3 or 0,2."
)


class Node(models.Model):
    """One node agent (or external OpenAI-compatible server) reachable at ``address``.

    ``state`` is owned by the control loop (``up``/``down``/``unknown``) and by operators
    (``draining``). ``last_seen_load`` holds the last parsed metrics: ``{"load": float | None,
    "active": int, "queue": int, "total": int, ...}``; ``load`` is active sequences plus queue
    depth over configured sequences (see ``nodes.metrics.load_from_metrics``).
    """

    class State(models.TextChoices):
        UP = "up", "Up"
        DOWN = "down", "Down"
        DRAINING = "draining", "Draining"
        UNKNOWN = "unknown", "Unknown"

    STATE_COLOURS = {
        State.UP: "green",
        State.DOWN: "red",
        State.DRAINING: "orange",
        State.UNKNOWN: "grey",
    }

    node_id = models.SlugField(max_length=64, unique=True)
    address = models.CharField(max_length=255, validators=[address_validator])
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    affinity = models.BooleanField(default=True, help_text="Pin sessions to this node.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNKNOWN)
    cpu_set = models.CharField(
        max_length=64, blank=True, default="", validators=[cpu_set_validator]
    )
    threads = models.PositiveSmallIntegerField(default=1)
    package = models.ForeignKey(
        "inference.ModelPackage",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="nodes",
    )
    served_name = models.CharField(
        max_length=128,
        blank=True,
        default="",
        help_text="The model name clients ask this node for (blank: its package's name). "
        "An upgrade keeps it while the package under it changes.",
    )
    engine_settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="Engine settings an upgrade rolled: sequences, ctx_per_seq, host_ram_mib "
        "(threads is its own field); the node is started with them.",
    )
    max_sessions = models.PositiveIntegerField(
        default=0, help_text="Most sessions pinned here (0: no limit)."
    )
    kv_budget_tokens = models.PositiveIntegerField(
        default=0, help_text="KV tokens new sessions may fill (0: the node's own capacity)."
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    consecutive_successes = models.PositiveIntegerField(default=0)
    last_canary_at = models.DateTimeField(null=True, blank=True)
    last_active_at = models.DateTimeField(null=True, blank=True)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_error = models.CharField(max_length=255, blank=True, default="")
    last_seen_load = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id"]

    def __str__(self) -> str:
        return f"{self.node_id} ({self.address})"

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the node's HTTP API."""
        return f"http://{self.address}"

    @property
    def model_name(self) -> str | None:
        """The name clients ask for: ``served_name``, else the package's name."""
        if self.served_name:
            return self.served_name
        return self.package.name if self.package_id else None

    @property
    def load(self) -> float | None:
        """Last load figure from metrics, or None when unknown."""
        data: Any = self.last_seen_load
        if isinstance(data, dict) and isinstance(data.get("load"), int | float):
            return float(data["load"])
        return None


class NodeEvent(models.Model):
    """Something that happened to a node: it went down, came back, was drained."""

    class Kind(models.TextChoices):
        WENT_DOWN = "went_down", "Went down"
        CAME_BACK = "came_back", "Came back"
        DRAINED = "drained", "Drained"
        UNDRAINED = "undrained", "Undrained"
        REGISTERED = "registered", "Registered"
        RESTARTED = "restarted", "Restarted"
        SWITCHED = "switched", "Switched package"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.node.node_id}: {self.get_kind_display()}"
