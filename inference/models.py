"""Model packages, the routing policy, the session routing table and API tokens."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class ModelPackage(models.Model):
    """A versioned, immutable model bundle: one GGUF file, what it says of itself, the serving
    settings it is proven with, where it came from and where it stands.

    Once saved, the fields in ``IMMUTABLE_FIELDS`` cannot change; a change is a new version (a
    new row). ``status`` moves ``draft -> evaluating -> approved | rejected -> retired``
    (``STATUS_MOVES``); an evaluation's figures are kept on the version (``evaluation``,
    ``gate``). ``family`` groups the versions of one model across quantizations (the gate
    policy and the side-by-side comparison are per family) and is the OpenAI ``model`` clients
    ask for; a package's ``name`` or ``name:version`` resolves to its family
    (``inference.model_names``).
    """

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        EVALUATING = "evaluating", "Evaluating"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        RETIRED = "retired", "Retired"

    STATUS_COLOURS: ClassVar[dict[str, str]] = {
        Status.DRAFT: "grey",
        Status.EVALUATING: "blue",
        Status.APPROVED: "green",
        Status.REJECTED: "red",
        Status.RETIRED: "grey",
    }
    # status -> the statuses it may move to (an operator's override may approve a rejected one)
    STATUS_MOVES: ClassVar[dict[str, tuple[str, ...]]] = {
        Status.DRAFT: (Status.EVALUATING, Status.APPROVED, Status.REJECTED, Status.RETIRED),
        Status.EVALUATING: (Status.APPROVED, Status.REJECTED, Status.DRAFT),
        Status.APPROVED: (Status.RETIRED,),
        Status.REJECTED: (Status.EVALUATING, Status.APPROVED, Status.RETIRED),
        Status.RETIRED: (),
    }

    class TemplateSource(models.TextChoices):
        GGUF = "gguf", "From the GGUF file"
        OPERATOR = "operator", "Supplied by an operator"
        NONE = "none", "None: completion-only"

    IMMUTABLE_FIELDS: ClassVar[tuple[str, ...]] = (
        "name",
        "version",
        "gguf_path",
        "sha256",
        "quantization",
        "context_window",
        "chat_template",
        "template_source",
        "ctx_per_seq",
        "sequences",
        "sampling",
        "lineage",
    )

    name = models.SlugField(max_length=128)
    version = models.CharField(max_length=64)
    family = models.CharField(
        max_length=128, blank=True, default="", help_text="The model these versions are of."
    )
    gguf_path = models.CharField(max_length=1024)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=32, blank=True, default="")
    architecture = models.CharField(max_length=64, blank=True, default="")
    parameters = models.BigIntegerField(null=True, blank=True)
    context_window = models.PositiveIntegerField(default=2048)
    chat_template = models.TextField(blank=True, default="")
    chat_template_sha256 = models.CharField(max_length=64, blank=True, default="")
    template_source = models.CharField(
        max_length=16, choices=TemplateSource.choices, default=TemplateSource.GGUF
    )
    tensor_types = models.JSONField(
        default=dict, blank=True, help_text='ggml type -> tensor count, {"Q4_K": 120, ...}'
    )
    ctx_per_seq = models.PositiveIntegerField(default=2048, help_text="tokens per sequence")
    sequences = models.PositiveSmallIntegerField(default=8)
    sampling = models.JSONField(default=dict, blank=True, help_text="default sampling")
    lineage = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    build_report = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    status_reason = models.TextField(blank=True, default="")
    evaluation = models.JSONField(null=True, blank=True)
    gate = models.JSONField(null=True, blank=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="package_name_version_unique")
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        """``name:version``."""
        return f"{self.name}:{self.version}"

    @property
    def completion_only(self) -> bool:
        """No chat template: the node refuses chat completions for it."""
        return self.template_source == self.TemplateSource.NONE

    @property
    def deployable(self) -> bool:
        """A node may be given it: not rejected, not retired."""
        return self.status not in (self.Status.REJECTED, self.Status.RETIRED)

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            stored = type(self).objects.filter(pk=self.pk).values(*self.IMMUTABLE_FIELDS).first()
            if stored is not None:
                changed = [f for f in self.IMMUTABLE_FIELDS if stored[f] != getattr(self, f)]
                if changed:
                    raise ValidationError(
                        f"Package {self.key} is immutable; cannot change {', '.join(changed)}."
                    )
        super().save(*args, **kwargs)


class PackagePolicy(models.Model):
    """The gate a package version of one ``family`` must pass to be approved.

    Tool accuracy is the evaluation suite's grammar-mode ``tool_accuracy`` (0..1); regression
    and perplexity are measured against the family's newest approved version."""

    family = models.CharField(max_length=128, unique=True)
    min_tool_accuracy = models.FloatField(
        default=0.5, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    min_schema_valid = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Schema-valid share of tool calls with grammar-constrained decoding.",
    )
    max_regression = models.FloatField(
        default=0.05,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Largest drop in tool accuracy against the approved version (0..1).",
    )
    max_perplexity_increase = models.FloatField(
        default=0.10,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="Largest perplexity rise against the approved version (0.10 = 10 %).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "package policies"

    def __str__(self) -> str:
        return f"Gate for {self.family}"


class PackageJob(models.Model):
    """A long-running package task (import, build, evaluate): a row that a job process
    advances and the control loop starts, watches, cancels and resumes.

    ``progress`` is 0..1; ``log`` keeps the job's output (the newest ``LOG_LIMIT`` characters);
    ``result`` the JSON-able outcome; ``output`` the package it made (import, build).
    """

    class Kind(models.TextChoices):
        IMPORT = "import", "Import"
        BUILD = "build", "Build"
        EVALUATE = "evaluate", "Evaluate"

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    FINISHED: ClassVar[tuple[str, ...]] = (State.SUCCEEDED, State.FAILED, State.CANCELLED)
    STATE_COLOURS: ClassVar[dict[str, str]] = {
        State.QUEUED: "grey",
        State.RUNNING: "blue",
        State.SUCCEEDED: "green",
        State.FAILED: "red",
        State.CANCELLED: "orange",
    }
    LOG_LIMIT = 64_000

    kind = models.CharField(max_length=16, choices=Kind.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    package = models.ForeignKey(
        ModelPackage, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs"
    )
    output = models.ForeignKey(
        ModelPackage, null=True, blank=True, on_delete=models.SET_NULL, related_name="made_by"
    )
    params = models.JSONField(default=dict, blank=True)
    progress = models.FloatField(default=0.0)
    message = models.CharField(max_length=255, blank=True, default="")
    log = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} job {self.pk}"

    @property
    def finished(self) -> bool:
        return self.state in self.FINISHED


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

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Upgrade(models.Model):
    """A rolling upgrade of the nodes serving ``model`` (the name clients ask for) from one
    package version to another: a persisted state machine the control loop drives one step
    per tick (``inference.upgrades``), so a restart resumes it.

    ``nodes`` is the plan and its progress: ``[{"node_id", "batch", "state", "since",
    "detail"}]`` with ``state`` one of ``NODE_STATES``; ``gates`` the gate results in order
    (``{"at", "node_id", "gate", "passed", "detail", "values"}``); ``settings`` the strategy
    (``max_unavailable``, ``canary_share``, ``bake_s``, ``drain_timeout_s``, limits of the bake
    comparison). ``bake`` holds the running comparison's baselines.
    """

    class Step(models.TextChoices):
        """Where one node of an upgrade stands (``nodes[i]["state"]``, and the phase of its
        rollback in ``nodes[i]["revert"]``): the driver's vocabulary, one word each."""

        WAITING = "waiting", "Waiting"
        DRAINING = "draining", "Draining"
        SWITCHING = "switching", "Switching"
        CHECKING = "checking", "Checking"
        DONE = "done", "Done"
        REVERTING = "reverting", "Reverting"
        REVERTED = "reverted", "Reverted"
        STUCK = "stuck", "Stuck"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        ROLLING_BACK = "rolling_back", "Rolling back"
        SUCCEEDED = "succeeded", "Succeeded"
        ROLLED_BACK = "rolled_back", "Rolled back"
        FAILED = "failed", "Failed"

    FINISHED = (State.SUCCEEDED, State.ROLLED_BACK, State.FAILED)
    NODE_STATES = (
        "waiting",
        "draining",
        "switching",
        "checking",
        "baking",
        "done",
        "reverting",
        "reverted",
    )

    model = models.CharField(max_length=128, help_text="The name clients ask for.")
    from_package = models.ForeignKey(
        ModelPackage, on_delete=models.PROTECT, related_name="upgrades_from"
    )
    to_package = models.ForeignKey(
        ModelPackage, on_delete=models.PROTECT, related_name="upgrades_to"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    phase = models.CharField(max_length=32, blank=True, default="")
    paused_from = models.CharField(max_length=16, blank=True, default="")
    settings = models.JSONField(default=dict, blank=True)
    node_settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="Engine settings the nodes take with the switch: threads, sequences, "
        "ctx_per_seq, host_ram_mib (nodes/agent/switch.py).",
    )
    nodes = models.JSONField(default=list, blank=True)
    gates = models.JSONField(default=list, blank=True)
    bake = models.JSONField(default=dict, blank=True)
    promote = models.BooleanField(default=False, help_text="Skip the remaining bake times.")
    new_share = models.FloatField(
        default=0.0, help_text="Share of new sessions routed to the new version now (0..1)."
    )
    reason = models.TextField(blank=True, default="", help_text="Why it ended as it did.")
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A driver steps it until then (one driver at a time)."
    )
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"upgrade {self.pk}: {self.model} {self.from_package} -> {self.to_package}"

    @property
    def finished(self) -> bool:
        return self.state in self.FINISHED


class UpgradeEvent(models.Model):
    """One line of an upgrade's event log."""

    upgrade = models.ForeignKey(Upgrade, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    node_id = models.CharField(max_length=64, blank=True, default="")
    kind = models.CharField(max_length=32)
    message = models.TextField()

    class Meta:
        ordering = ["at", "id"]


class UpgradeSample(models.Model):
    """The traffic split at one tick of an upgrade: sessions active in the last minute and
    nodes up, per version (old = the upgrade's from package, new = its to package)."""

    upgrade = models.ForeignKey(Upgrade, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    old_sessions = models.PositiveIntegerField(default=0)
    new_sessions = models.PositiveIntegerField(default=0)
    old_nodes = models.PositiveIntegerField(default=0)
    new_nodes = models.PositiveIntegerField(default=0)
    new_share = models.FloatField(default=0.0, help_text="Share of new sessions sent to new.")

    class Meta:
        ordering = ["at", "id"]


from inference.loadtests.models import (  # noqa: E402, F401  (registered with this app)
    CostModel,
    LoadScenario,
    LoadTestRun,
    LoadTestSample,
)
