"""Package rows: versions (``ModelPackage``), the gate per family (``PackagePolicy``) and the
package jobs (``PackageJob``). Registered with the ``inference`` app (re-exported by
``inference.models``, so migrations stay where they are)."""

from __future__ import annotations

from typing import ClassVar

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

    ``kind`` says what runs it: ``chat`` (a GGUF that nodes serve) or ``embedding`` (a
    sentence encoder the control-plane processes run with onnxruntime for ``/v1/embeddings``
    and the semantic cache, never a node: ``inference.semcache.package``). An embedding
    package's ``gguf_path`` holds the DIRECTORY of its files (tokenizer.json,
    model.safetensors, config.json, as its Python package installed them), its ``sha256`` is
    model.safetensors'; quantization ``F32``, architecture ``bert``, ``parameters`` counted
    from the safetensors header, ``context_window`` 256 (``encoder.MAX_TOKENS``),
    ``template_source`` ``none``; its ``evaluation`` and ``gate`` are those of
    ``embedding_evaluation`` (the labelled pairs), not the chat suite's.
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

    class Kind(models.TextChoices):
        CHAT = "chat", "Chat (GGUF, served by nodes)"
        EMBEDDING = "embedding", "Embedding (ONNX, served by the control plane)"

    IMMUTABLE_FIELDS: ClassVar[tuple[str, ...]] = (
        "kind",
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

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CHAT)
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
