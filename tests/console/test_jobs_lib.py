"""The one job mechanism (``console.lib.jobs``), once, on SQLite (the embedded default) and on
the machine's PostgreSQL (the scale-out mode): claimers racing for one job (exactly one
wins), a lease that runs out (the given-up attempt writes nothing), holders racing for one
step job's time lease (exactly one gets it), a hold whose renewal stopped (another holder
takes it after ``lease_s``, not before), a killed job process found dead by the process
runner. The runner of step kinds and periodic work is ``test_steps.py``; the kinds' own tests
(package jobs, load-test runs, upgrades, validations) cover their steps and hooks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.postgres import fresh_database
from tests.support.processes import REPO

# the checks, run in a process of their own against whatever database it is given
CHECKS = textwrap.dedent(
    """
    import threading
    from django.db import connection
    from console.lib.jobs import Lease, claim
    from inference.models import PackageJob

    job = PackageJob.objects.create(kind="build", params={})
    won, lost, start = [], [], threading.Barrier(8)

    def race(pid):
        start.wait()
        try:
            (won if claim(PackageJob, job.pk, pid=pid) else lost).append(pid)
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(p,)) for p in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    job.refresh_from_db()
    print("winners", len(won), "losers", len(lost), "attempts", job.attempts, "state", job.state)

    first = Lease(PackageJob, job.pk, job.attempts)
    PackageJob.objects.filter(pk=job.pk).update(state="queued")  # the loop gave it up
    assert claim(PackageJob, job.pk, pid=99)
    job.refresh_from_db()
    second = Lease(PackageJob, job.pk, job.attempts)
    print("stale writes", first.rows().update(progress=0.5), "holds", first.holds(),
          second.holds())
    """
)


# the time lease of step jobs (``hold``), on a validation run
HOLD_CHECKS = textwrap.dedent(
    """
    import threading, time
    from django.db import connection
    from console.lib.jobs import hold
    from nodes.models import Node, ValidationRun

    node = Node.objects.create(node_id="node-h1", address="127.0.0.1:1")
    run = ValidationRun.objects.create(node=node, trigger="demand")
    got, start, held = [], threading.Barrier(8), threading.Barrier(8)

    def race():
        start.wait()
        try:
            with hold(ValidationRun, run.pk, lease_s=30, renew_s=10) as mine:
                got.append(mine)
                held.wait()  # every racer answers while the winner still holds it
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    after = ValidationRun.objects.get(pk=run.pk).lease_until
    print("holders", got.count(True), "refused", got.count(False), "left", after)

    def other():  # another control loop: a connection of its own
        out = []
        def take():
            try:
                with hold(ValidationRun, run.pk, lease_s=30, renew_s=10) as mine:
                    out.append(mine)
            finally:
                connection.close()
        t = threading.Thread(target=take)
        t.start()
        t.join()
        return out[0]

    with hold(ValidationRun, run.pk, lease_s=0.6, renew_s=0.1) as mine:
        time.sleep(1.5)  # renewed meanwhile: still this holder's
        renewed = other()
    with hold(ValidationRun, run.pk, lease_s=0.6, renew_s=60) as mine:  # no renewal in time
        early = other()
        time.sleep(0.8)
        late = other()
    print("renewed", renewed, "early", early, "run out", late)
    """
)


def run_checks(env: dict[str, str], checks: str = CHECKS) -> str:
    manage = [sys.executable, "manage.py"]
    full = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=full, check=True)
    done = subprocess.run(
        [*manage, "shell", "-v0", "-c", checks], cwd=REPO, env=full, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# every claimer got an answer (none failed on a lock), one won
EXPECTED = "winners 1 losers 7 attempts 1 state running\nstale writes 0 holds False True\n"
# one holder got the step job, the lease is cleared at the end; renewal keeps it, expiry frees it
HOLD_EXPECTED = "holders 1 refused 7 left None\nrenewed False early False run out True\n"


def test_on_sqlite_one_claimer_wins_and_a_given_up_lease_writes_nothing(tmp_path):
    env = {"PHALANX_HOME": str(tmp_path), "DATABASE_URL": ""}  # none: the embedded SQLite
    assert run_checks(env) == EXPECTED


def test_on_sqlite_one_holder_gets_a_step_job_until_its_lease_runs_out(tmp_path):
    env = {"PHALANX_HOME": str(tmp_path), "DATABASE_URL": ""}
    assert run_checks(env, HOLD_CHECKS) == HOLD_EXPECTED


@pytest.fixture
def postgres_database():
    """A fresh database on the machine's PostgreSQL, dropped after."""
    with fresh_database("phalanx_jobs") as url:
        yield url


def test_on_postgresql_one_claimer_wins_and_a_given_up_lease_writes_nothing(
    tmp_path, postgres_database
):
    env = {"PHALANX_HOME": str(tmp_path), "DATABASE_URL": postgres_database}
    assert run_checks(env) == EXPECTED


def test_on_postgresql_one_holder_gets_a_step_job_until_its_lease_runs_out(
    tmp_path, postgres_database
):
    env = {"PHALANX_HOME": str(tmp_path), "DATABASE_URL": postgres_database}
    assert run_checks(env, HOLD_CHECKS) == HOLD_EXPECTED


def test_a_dead_job_process_is_seen_and_a_kill_takes_its_whole_group(settings, tmp_path):
    """``ProcessRunner`` starts ``manage.py <command> <id>`` in a process group of its own
    (its output in ``var/logs``) and sees it exit; a kill ends what a job process started."""
    import psutil

    from console.lib.jobs import ProcessRunner

    settings.VAR_DIR = tmp_path
    runner = ProcessRunner("shell", "test-job")  # ``manage.py shell 7`` exits at once
    runner.start(7).wait(timeout=60)
    assert runner.exited(7) is True and (tmp_path / "logs" / "test-job-7.log").exists()
    spawns = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    job = subprocess.Popen([sys.executable, "-c", spawns], start_new_session=True)
    runner.children[8] = job  # as start() keeps it
    assert runner.exited(8) is False
    deadline = time.monotonic() + 10
    while not psutil.Process(job.pid).children() and time.monotonic() < deadline:
        time.sleep(0.1)
    (started,) = psutil.Process(job.pid).children()  # what the job process started
    runner.kill(8, grace_s=0)
    assert not runner.started(8) and job.poll() is not None
    assert psutil.wait_procs([started], timeout=10)[1] == []  # gone with its group
