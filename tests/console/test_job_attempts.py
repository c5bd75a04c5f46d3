"""A job process takes up the attempt it was started for, never the one its row holds when it
gets there (``console.lib.jobs.adopt``): two control loops (replicas) on one database, the
first claims a job and starts its process, dies; the second gives the silent attempt up,
claims the job again and starts its own process; the first process, late (a slow start, a
paused host), then begins and must do nothing, not run beside the second under its lease.
Both process kinds: load-test runs and package jobs. Processes are started as the control loop
starts them (their command lines are kept, then run here, in this process)."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from console.lib import jobs as mechanism
from inference.loadtests import jobs as loadtests
from inference.loadtests.models import LoadTestRun
from inference.models import PackageJob
from inference.packages import jobs as packagejobs
from tests.fakenode import refused_address


class StartedProcess:
    """What ``subprocess.Popen`` gives the process runner here: the command line, kept."""

    started: list[StartedProcess] = []

    def __init__(self, args: list[str], **kwargs: object) -> None:
        self.args, self.pid = args, 424_240 + len(self.started)
        self.started.append(self)

    def poll(self) -> None:
        return None  # running, as far as the loop that started it knows


@pytest.fixture
def loops(monkeypatch, settings, tmp_path) -> list[StartedProcess]:
    """The job processes the control loops start, by their command lines (none really runs
    until a test runs one); signal handlers a job command installs are not installed here."""
    settings.VAR_DIR = tmp_path
    StartedProcess.started = []
    monkeypatch.setattr(mechanism.subprocess, "Popen", StartedProcess)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    return StartedProcess.started


def _replica_dies_and_another_takes_over(model, tick, runner, stale_s: float) -> None:
    """The first loop's tick claimed the job (attempt 1) and started its process; that loop
    dies (the next tick is another loop's: it started nothing) and once the attempt's beat is
    ``stale_s`` old the other loop's tick gives it up and claims the job again (attempt 2)."""
    runner.children.clear()
    stale = timezone.now() - timedelta(seconds=stale_s + 1)
    model.objects.update(heartbeat_at=stale)
    tick()


@pytest.mark.django_db(transaction=True)
def test_a_late_load_test_worker_of_a_given_up_attempt_does_nothing(loops, settings):
    run = LoadTestRun.objects.create(
        scenario_name="t",
        scenario={"name": "t", "kind": "agent_sessions", "steps": [1], "turns": 1},
        target_url=f"http://{refused_address()}",
        target_token="not-used",
    )
    loadtests.loadtests_tick()
    _replica_dies_and_another_takes_over(
        LoadTestRun, loadtests.loadtests_tick, loadtests.PROCESSES, settings.LOADTEST_STALE_S
    )
    first, second = loops
    run.refresh_from_db()
    assert (run.state, run.attempts, run.pid) == ("running", 2, second.pid)
    call_command(*first.args[2:])  # the first loop's worker begins only now
    run.refresh_from_db()
    assert (run.state, run.attempts, run.pid, run.error) == ("running", 2, second.pid, "")
    assert run.message == "starting"


@pytest.mark.django_db(transaction=True)
def test_a_late_package_job_process_of_a_given_up_attempt_does_nothing(loops, settings):
    job = PackageJob.objects.create(kind="build")
    packagejobs.jobs_tick()
    _replica_dies_and_another_takes_over(
        PackageJob, packagejobs.jobs_tick, packagejobs.PROCESSES, settings.PACKAGE_JOB_STALE_S
    )
    first, second = loops
    job.refresh_from_db()
    assert (job.state, job.attempts, job.pid) == ("running", 2, second.pid)
    call_command(*first.args[2:])  # the first loop's job process begins only now
    job.refresh_from_db()
    assert (job.state, job.attempts, job.pid, job.error) == ("running", 2, second.pid, "")
