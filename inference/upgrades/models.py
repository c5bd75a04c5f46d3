"""Upgrade rows: the rolling upgrade, its event log and its traffic samples. Registered with
the ``inference`` app (re-exported by ``inference.models``)."""

from __future__ import annotations

from django.db import models

from inference.packages.models import ModelPackage


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
