"""Inventory of nodes: the processes that serve one model package each, and their event log."""

from __future__ import annotations

import uuid
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


def effective_weight(weight: float, measured_speed: float | None, measured: bool) -> float:
    """The weight routing uses: the operator's ``weight`` times the node's measured speed
    relative to its pool when ``measured`` (``weight`` alone otherwise or when unmeasured)."""
    if measured and measured_speed:
        return round(weight * measured_speed, 3)
    return weight


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

    class Kind(models.TextChoices):
        """What answers at ``address``: a Phalanx node agent, or any OpenAI-compatible server
        (a stock llama-server, vLLM on a GPU box: the hybrid array, docs/control-plane.md)."""

        PHALANX = "phalanx", "Phalanx node agent"
        EXTERNAL = "external", "External OpenAI-compatible server"

    node_id = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(
        max_length=16,
        choices=Kind.choices,
        default=Kind.PHALANX,
        help_text="external: health from /health or /v1/models, load from /metrics or /slots "
        "when it has them, no KV export; its device validation is waived.",
    )
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

    class Validation(models.TextChoices):
        """Where a node stands with device validation (``nodes.device_validation``)."""

        PENDING = "pending", "Pending"
        VALIDATING = "validating", "Validating"
        PASSED = "passed", "Passed"
        WARNED = "warned", "Passed with warnings"
        FAILED = "failed", "Failed"
        WAIVED = "waived", "Waived by an operator"

    validation = models.CharField(
        max_length=16,
        choices=Validation.choices,
        default=Validation.PENDING,
        help_text="Device validation: only passed, warned or waived nodes take traffic.",
    )
    validation_reason = models.TextField(blank=True, default="")
    device_instance = models.CharField(
        max_length=64, blank=True, default="", help_text="The agent process last validated."
    )
    device_fingerprint = models.CharField(
        max_length=64, blank=True, default="", help_text="Its inventory's fingerprint then."
    )
    measured_speed = models.FloatField(
        null=True,
        blank=True,
        help_text="Decode tokens/s at 8 sequences over the pool's median (same package), "
        "from the last validation.",
    )
    weight_measured = models.BooleanField(
        default=True,
        help_text="Route by weight × measured speed (off: by weight alone, the operator's "
        "override).",
    )
    supervisor = models.CharField(
        max_length=128,
        blank=True,
        default="",
        help_text="The embedded array (`up`) that started this node's agent and may restart "
        'it ("up, pid 4242 on host"); blank: started elsewhere (external, remote).',
    )
    restart_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="An operator asked for a restart: drained, then done."
    )
    restart_requested_by = models.CharField(max_length=150, blank=True, default="")
    restart_undrain = models.BooleanField(
        default=False, help_text="The restart drained it: undrain once its agent is back."
    )
    credential_epoch = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="Which credential the node holds (nodes.credentials): blank, the one "
        "derived from its id alone; else the one it received when it joined. Revoking its "
        "credential sets a new epoch.",
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

    ROUTABLE_VALIDATIONS = (Validation.PASSED, Validation.WARNED, Validation.WAIVED)

    @property
    def validated(self) -> bool:
        """True when device validation lets the node take traffic."""
        return self.validation in self.ROUTABLE_VALIDATIONS

    @property
    def routing_weight(self) -> float:
        """``weight``, times ``measured_speed`` when measured and ``weight_measured``."""
        return effective_weight(self.weight, self.measured_speed, self.weight_measured)

    @property
    def load(self) -> float | None:
        """Last load figure from metrics, or None when unknown."""
        data: Any = self.last_seen_load
        if isinstance(data, dict) and isinstance(data.get("load"), int | float):
            return float(data["load"])
        return None


class NodeEvent(models.Model):
    """Something that happened to a node: it went down, came back, was drained. ``actor``
    names who or what did it: an operator's username (``token:<name>`` over the API), ``upgrade
    N``, ``control loop`` (probes), ``proxy`` (failed requests), ``validation``, ``up`` (the
    embedded array's supervisor); blank on events recorded before it was kept."""

    class Kind(models.TextChoices):
        WENT_DOWN = "went_down", "Went down"
        CAME_BACK = "came_back", "Came back"
        DRAINED = "drained", "Drained"
        UNDRAINED = "undrained", "Undrained"
        REGISTERED = "registered", "Registered"
        RESTARTED = "restarted", "Restarted"
        SWITCHED = "switched", "Switched package"
        VALIDATION = "validation", "Validation"
        JOINED = "joined", "Joined with a join token"
        REVOKED = "revoked", "Credential revoked"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    message = models.TextField(blank=True, default="")
    actor = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.node.node_id}: {self.get_kind_display()}"


class NodeJoinToken(models.Model):
    """A one-time token a remote node agent joins the array with (``runnode --join``,
    ``nodes.joining``). Only its SHA-256 is kept; its plaintext is shown once, when it is
    minted. It is refused once ``used_at`` is set or after ``expires_at``."""

    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(
        max_length=16, help_text="The first characters, to tell tokens apart."
    )
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="join_tokens"
    )
    joined_node_id = models.CharField(
        max_length=64, blank=True, default="", help_text="The node it made (kept after removal)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"join token {self.prefix}…"


def _new_token() -> str:
    return uuid.uuid4().hex


class ValidationRun(models.Model):
    """One device validation of a node: a job the control loop advances (queued -> running ->
    passed | warned | failed | error). The node collects its inventory and runs its benchmarks;
    the control plane applies the compatibility matrix (``nodes.devices.matrix``) and compares
    the inventory with the previous run's (``changes``). ``error``: the run itself could not
    finish (node unreachable, restarted, a benchmark failed)."""

    class Trigger(models.TextChoices):
        START = "start", "Agent started"
        CHANGE = "change", "Inventory changed"
        DEMAND = "demand", "On demand"
        RETRY = "retry", "Retry after an error"

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        PASSED = "passed", "Passed"
        WARNED = "warned", "Passed with warnings"
        FAILED = "failed", "Failed"
        ERROR = "error", "Could not run"

    FINISHED = (State.PASSED, State.WARNED, State.FAILED, State.ERROR)
    STATE_COLOURS = {
        State.QUEUED: "grey",
        State.RUNNING: "blue",
        State.PASSED: "green",
        State.WARNED: "orange",
        State.FAILED: "red",
        State.ERROR: "red",
    }

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="validation_runs")
    token = models.CharField(
        max_length=32, default=_new_token, editable=False, help_text="The run's id on the node."
    )
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    package = models.ForeignKey(
        "inference.ModelPackage",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The package the node served when the run was asked for (its figures).",
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    phase = models.CharField(max_length=64, blank=True, default="")
    progress = models.FloatField(default=0.0)
    requested_by = models.CharField(max_length=150, blank=True, default="")
    node_instance = models.CharField(max_length=64, blank=True, default="")
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    inventory = models.JSONField(null=True, blank=True)
    engine = models.JSONField(null=True, blank=True)
    bench = models.JSONField(null=True, blank=True)
    pool = models.JSONField(null=True, blank=True)
    rules = models.JSONField(default=list, blank=True)
    changes = models.JSONField(default=list, blank=True)
    reason = models.TextField(blank=True, default="")
    seconds = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A control loop steps it until then (one at a time)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"validation {self.pk} of {self.node.node_id}: {self.state}"

    @property
    def finished(self) -> bool:
        """True once the run has its verdict (or could not finish)."""
        return self.state in self.FINISHED
