"""Load-test rows: scenarios, runs (a job the control loop starts in a worker process), the
run's live samples, and the cost model capacity plans use (docs/loadtests.md). Registered
with the ``inference`` app (imported by ``inference.models``)."""

from __future__ import annotations

from django.db import models


class LoadScenario(models.Model):
    """A stored scenario: ``spec`` is the mapping ``inference.loadtests.scenario`` parses.
    Built-in scenarios (``builtin``) are written from the code and cannot be edited."""

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=16)
    spec = models.JSONField()
    builtin = models.BooleanField(default=False)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-builtin", "name"]

    def __str__(self) -> str:
        return self.name


class LoadTestRun(models.Model):
    """One load-test run: queued by a page, the API or ``manage.py loadtest``; run to its end
    by a worker process (``manage.py loadtestjob ID``) that the control loop starts, or by
    the ``loadtest`` command in its own process. The row is the truth: progress and live
    figures while it runs, the records of every finished step (a restarted worker resumes
    after the last one), the report at the end."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"

    FINISHED = (State.SUCCEEDED, State.STOPPED, State.FAILED)
    STATE_COLOURS = {
        "queued": "grey",
        "running": "blue",
        "succeeded": "green",
        "stopped": "orange",
        "failed": "red",
    }

    scenario_name = models.CharField(max_length=64)
    scenario = models.JSONField(help_text="The scenario's spec as it was when the run began.")
    target_url = models.CharField(max_length=300)
    target_token = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="A token for another target; empty: the worker mints one for this array "
        "and revokes it at the end. Never shown.",
    )
    minted_tokens = models.JSONField(
        default=list,
        blank=True,
        help_text="Ids of the API tokens this run's workers minted (inference.loadtests."
        "credentials); revoked when the run ends, is queued again or is given up on.",
    )
    profile = models.BooleanField(default=False, help_text="Take flame graphs during the run.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)
    message = models.CharField(max_length=255, blank=True, default="")
    live = models.JSONField(default=dict, blank=True)
    steps_done = models.JSONField(default=list, blank=True)
    turns = models.JSONField(default=list, blank=True)
    sessions = models.JSONField(default=list, blank=True)
    elapsed_s = models.FloatField(default=0.0, help_text="Seconds run so far, all attempts.")
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    pid = models.PositiveIntegerField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"load test {self.pk}: {self.scenario_name}"

    @property
    def finished(self) -> bool:
        return self.state in self.FINISHED


class LoadTestSample(models.Model):
    """The live figures of a run at one second (``runner.LoadRun.live``)."""

    run = models.ForeignKey(LoadTestRun, on_delete=models.CASCADE, related_name="samples")
    t = models.FloatField(help_text="Seconds since the run began.")
    data = models.JSONField()

    class Meta:
        ordering = ["id"]


class CostModel(models.Model):
    """What a node costs (one row, ``CostModel.load()``): the inputs of capacity plans
    (``inference.loadtests.analysis.CostInputs``). Illustrative defaults; set your own."""

    power_w = models.FloatField(default=250.0, help_text="Average power draw per node, W.")
    electricity_per_kwh = models.FloatField(default=0.20, help_text="Price per kWh.")
    hardware_cost = models.FloatField(default=4000.0, help_text="Purchase price per node.")
    amortization_months = models.FloatField(default=36.0)
    operations_per_month = models.FloatField(default=60.0, help_text="Per node.")
    space_per_month = models.FloatField(default=40.0, help_text="Rack space per node.")
    currency = models.CharField(max_length=8, default="USD")
    updated_at = models.DateTimeField(auto_now=True)

    FIELDS = (
        "power_w",
        "electricity_per_kwh",
        "hardware_cost",
        "amortization_months",
        "operations_per_month",
        "space_per_month",
    )

    @classmethod
    def load(cls) -> CostModel:
        model, _ = cls.objects.get_or_create(pk=1)
        return model

    def inputs(self):
        from inference.loadtests.analysis import CostInputs

        return CostInputs(**{f: getattr(self, f) for f in self.FIELDS})
