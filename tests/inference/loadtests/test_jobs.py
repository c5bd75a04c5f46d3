"""The control loop's side of load tests: a dead worker's run resumes after its last step, a
run past its attempts fails, a stop reaches a run whose worker is gone; the live websocket."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.utils import timezone

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
    run = running(stop_requested=True, **MEASURED)
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
    from console.services import token_issue

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
