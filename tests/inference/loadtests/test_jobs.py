"""The control loop's side of load tests: a dead worker's run resumes after its last step, a
run past its attempts fails, a stop reaches a run whose worker is gone; the live websocket."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from console.lib.jobs import Lease
from inference.loadtests import jobs
from inference.loadtests.models import LoadTestRun, LoadTestSample
from tests.inference.loadtests.synthetic import turn

SPEC = {
    "name": "t",
    "kind": "agent_sessions",
    "steps": [1, 2],
    "turns": 2,
    "tool_call_fraction": 0.0,
}


def running(**fields) -> LoadTestRun:
    stale = timezone.now() - timedelta(seconds=120)
    values = {"attempts": 1, "heartbeat_at": stale, "started_at": stale, **fields}
    return LoadTestRun.objects.create(
        scenario_name="t", scenario=SPEC, target_url="http://127.0.0.1:1", state="running", **values
    )


@pytest.fixture
def no_spawn(monkeypatch):
    started = []
    monkeypatch.setattr(jobs, "_start", lambda run: started.append(run.pk))
    return started


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_worker_died_is_queued_to_resume_after_its_last_step(no_spawn):
    run = running(steps_done=[{"step": 0, "c": 1, "started": 0, "ended": 5}])
    jobs.loadtests_tick()
    run.refresh_from_db()
    assert run.state == "queued" and run.steps_done[0]["step"] == 0
    assert no_spawn == [run.pk]  # and it is started again at once


@pytest.mark.django_db(transaction=True)
def test_a_run_that_keeps_losing_its_worker_fails_saying_so(no_spawn):
    run = running(attempts=jobs.MAX_ATTEMPTS)
    jobs.loadtests_tick()
    run.refresh_from_db()
    assert run.state == "failed" and "its worker stopped 3 times" in run.error


MEASURED = {
    "steps_done": [{"step": 0, "c": 1, "started": 0.0, "ended": 5.0}],
    "turns": [turn(0, 1, sid="a", turn=k) for k in range(2)],
    "sessions": [
        {
            "step": 0,
            "c": 1,
            "sid": "a",
            "t": 0.0,
            "dur": 2.0,
            "turns": 2,
            "complete": True,
            "nodes": ["node-01"],
        }
    ],
}


@pytest.mark.django_db(transaction=True)
def test_a_stop_reaches_a_run_whose_worker_is_gone_and_keeps_what_it_measured(no_spawn):
    run = running(cancel_requested=True, **MEASURED)
    jobs.loadtests_tick()
    run.refresh_from_db()
    assert run.state == "stopped"
    assert run.report["summary"]["requests"] == 2 and run.report["state"] == "stopped"


@pytest.mark.django_db(transaction=True)
def test_a_run_queued_to_resume_that_is_stopped_keeps_what_it_measured():
    from inference.loadtests.services import loadtest_stop

    run = LoadTestRun.objects.create(
        scenario_name="t", scenario=SPEC, target_url="http://x:1", attempts=1, **MEASURED
    )
    stopped = loadtest_stop(run_id=run.pk)
    assert stopped.state == "stopped" and stopped.report["summary"]["requests"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_live_run_is_left_alone_and_nothing_else_starts(no_spawn):
    run = running()
    LoadTestRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    queued = LoadTestRun.objects.create(scenario_name="t", scenario=SPEC, target_url="http://x:1")
    jobs.loadtests_tick()
    assert LoadTestRun.objects.get(pk=run.pk).state == "running"
    assert no_spawn == [] and LoadTestRun.objects.get(pk=queued.pk).state == "queued"


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_sends_samples_then_the_end():
    from asgiref.sync import sync_to_async

    from console.asgi import application
    from console.models import Role
    from inference.tokens import token_issue

    _, token = await sync_to_async(token_issue)(name="viewer", role=Role.VIEWER)
    run = await sync_to_async(running)()
    await sync_to_async(LoadTestSample.objects.create)(run=run, t=1.0, data={"requests": 3})
    socket = WebsocketCommunicator(
        application,
        f"/ws/loadtests/{run.pk}/?token={token}",
        headers=[(b"origin", b"http://127.0.0.1")],
    )
    connected, _ = await socket.connect()
    assert connected
    first = await socket.receive_json_from(timeout=5)
    assert first["type"] == "run" and first["samples"][0]["data"] == {"requests": 3}
    await sync_to_async(LoadTestRun.objects.filter(pk=run.pk).update)(state="stopped")
    second = await socket.receive_json_from(timeout=5)
    assert second["run"]["state"] == "stopped"
    assert (await socket.receive_json_from(timeout=5)) == {"type": "finished", "state": "stopped"}
    await socket.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_refuses_without_a_token():
    from console.asgi import application

    socket = WebsocketCommunicator(
        application, "/ws/loadtests/1/", headers=[(b"origin", b"http://127.0.0.1")]
    )
    await socket.connect()
    assert (await socket.receive_json_from(timeout=5))["code"] == 4401
    await socket.disconnect()


# --- the credentials a run mints: only for this control plane, and they die with the job --------


def minted(run: LoadTestRun) -> int:
    """A token an attempt minted for ``run`` and recorded on its row (as ``run_token_mint``)."""
    from console.models import Role
    from inference.tokens import token_issue

    token, _ = token_issue(name=f"load test {run.pk}", role=Role.VIEWER)
    LoadTestRun.objects.filter(pk=run.pk).update(minted_tokens=[*run.minted_tokens, token.pk])
    return token.pk


def valid(token_id: int) -> bool:
    from inference.models import ApiToken

    return not ApiToken.objects.get(pk=token_id).revoked


@pytest.mark.django_db(transaction=True)
def test_a_dead_attempt_queued_again_has_its_token_revoked(no_spawn):
    run = running()
    token = minted(run)
    jobs.loadtests_tick()
    assert LoadTestRun.objects.get(pk=run.pk).state == "queued" and not valid(token)


@pytest.mark.django_db(transaction=True)
def test_a_run_given_up_on_has_every_attempts_token_revoked(no_spawn):
    run = running(attempts=jobs.MAX_ATTEMPTS)
    first, last = minted(run), minted(LoadTestRun.objects.get(pk=run.pk))
    jobs.loadtests_tick()
    assert LoadTestRun.objects.get(pk=run.pk).state == "failed"
    assert not valid(first) and not valid(last)


@pytest.mark.django_db(transaction=True)
def test_a_stop_revokes_the_runs_tokens_whether_its_worker_is_gone_or_it_was_queued(no_spawn):
    from inference.loadtests.services import loadtest_stop

    gone = running(cancel_requested=True)
    gone_token = minted(gone)
    jobs.loadtests_tick()
    assert LoadTestRun.objects.get(pk=gone.pk).state == "stopped" and not valid(gone_token)
    queued = LoadTestRun.objects.create(
        scenario_name="t", scenario=SPEC, target_url="http://x:1", attempts=1
    )
    queued_token = minted(queued)  # its first attempt died after minting
    assert loadtest_stop(run_id=queued.pk).state == "stopped" and not valid(queued_token)


@pytest.mark.django_db(transaction=True)
def test_an_attempt_that_lost_its_run_mints_nothing():
    from inference.loadtests.credentials import ClaimLost, run_token_mint
    from inference.models import ApiToken

    run = running(attempts=2)
    with pytest.raises(ClaimLost):
        run_token_mint(
            run.pk, rows=Lease(LoadTestRun, run.pk, 1).rows()
        )  # attempt 1 was given up on
    assert not ApiToken.objects.exists()
    run_token_mint(run.pk, rows=Lease(LoadTestRun, run.pk, 2).rows())
    assert LoadTestRun.objects.get(pk=run.pk).minted_tokens == [ApiToken.objects.get().pk]


@pytest.mark.django_db(transaction=True)
def test_the_control_loop_signals_only_a_worker_it_started_never_a_pid_from_the_row(no_spawn):
    import subprocess
    import sys

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running(pid=bystander.pid)  # a dead worker's pid, now some other process's
        jobs.loadtests_tick()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def queued_run(**fields) -> LoadTestRun:
    spec = {**SPEC, "steps": [1], "turns": 1, "max_s": 30}
    return LoadTestRun.objects.create(scenario_name="t", scenario=spec, **fields)


@pytest.mark.django_db(transaction=True)
def test_a_run_with_no_token_against_a_loopback_stranger_ends_naming_token_and_sends_none():
    from inference.models import ApiToken
    from tests.inference.loadtests.throwaway import stranger_server

    with stranger_server() as stranger:
        run = queued_run(target_url=stranger.url)  # as if queued before it took the port
        done = jobs.loadtest_execute(run.pk)
    assert stranger.credentials() == []
    assert done.state == "failed" and "token: " in done.error
    assert "did not prove it is this control plane" in done.error
    assert "give this target a token of its own" in done.error
    assert not ApiToken.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_run_that_minted_revokes_its_token_when_it_ends(monkeypatch):
    from inference.loadtests import identity
    from inference.models import ApiToken
    from tests.inference.loadtests.throwaway import stranger_server

    with stranger_server() as array:  # stands in for this control plane, proven
        proven = identity.Proven(pid=1, address=("127.0.0.1", array.port))
        monkeypatch.setattr(jobs, "aprove", lambda url: _async(proven))
        done = jobs.loadtest_execute(queued_run(target_url=array.url).pk)
    token = ApiToken.objects.get()
    assert done.minted_tokens == [token.pk] and token.revoked
    assert array.credentials() and all(c.startswith("Bearer phx_") for c in array.credentials())


@pytest.mark.django_db(transaction=True)
def test_flame_graphs_are_taken_only_of_processes_the_array_proved_are_its_own():
    from tests.inference.loadtests.throwaway import stranger_server

    with stranger_server() as stranger:  # listens in this very test process
        run = queued_run(target_url=stranger.url, target_token="its-own", profile=True)
        done = jobs.loadtest_execute(run.pk)
    control_plane = done.report["profiles"]["control_plane"]
    assert "pid" not in control_plane
    assert control_plane["error"] == "the target did not prove it is this control plane"


async def _async(value):
    return value
