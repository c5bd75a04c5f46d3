"""Where a load test's minted token may go (issue 27, "a secret the array mints goes only to the
array"): only to the address that proved it is this control plane, never through a proxy the
environment names, and not past a step after the target stopped proving itself."""

from __future__ import annotations

import asyncio

import pytest

from inference.loadtests import identity, jobs
from inference.loadtests.models import LoadTestRun
from inference.loadtests.runner import LoadRun, Target
from inference.loadtests.scenario import parse_scenario
from inference.models import ApiToken
from tests.inference.loadtests.throwaway import stranger_server

SPEC = {"name": "t", "kind": "agent_sessions", "steps": [1, 2], "turns": 1, "max_s": 30}


def test_it_sends_the_token_straight_to_the_target_never_through_the_environments_proxy(
    monkeypatch,
):
    with stranger_server() as proxy, stranger_server() as target:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        run = LoadRun(
            parse_scenario(SPEC),
            Target(url=target.url, token="phx_secret", model="m"),
            run_tag="1.1",
            should_stop=lambda: _async(False),
            tick=lambda live: _async(None),
            step_done=lambda step, turns, sessions: _async(None),
        )

        async def calls() -> None:
            await run._probe("/api/nodes")
            await run.client.models.list()

        asyncio.run(calls())
    assert proxy.requests == []
    assert target.credentials() == ["Bearer phx_secret", "Bearer phx_secret"]


def test_a_proven_address_pins_the_url_the_token_goes_to():
    proven = identity.Proven(pid=7, address=("127.0.0.1", 8123))
    assert proven.pinned("http://localhost:8000") == "http://127.0.0.1:8123"
    assert proven.pinned("http://localhost:8000/base") == "http://127.0.0.1:8123/base"
    v6 = identity.Proven(pid=7, address=("::1", 8123))
    assert v6.pinned("http://localhost:8000") == "http://[::1]:8123"


@pytest.mark.django_db(transaction=True)
def test_a_run_stops_sending_its_minted_token_once_the_target_no_longer_proves_itself(
    monkeypatch,
):
    with stranger_server() as array:  # stands in for this control plane
        proofs = iter([identity.Proven(pid=1, address=("127.0.0.1", array.port))])

        async def prove(url):
            proven = next(proofs, None)
            if proven is None:  # the port changed hands: no proof any more
                raise identity.NotThisControlPlane(f"{url}/health gave no proof")
            return proven

        monkeypatch.setattr(jobs, "aprove", prove)
        run = LoadTestRun.objects.create(scenario_name="t", scenario=SPEC, target_url=array.url)
        done = jobs.loadtest_execute(run.pk)
    chats = [r for r in array.requests if r[0] == "POST"]
    assert len(done.steps_done) == 1  # the first step ran; the second never started
    assert len(chats) == 1
    assert done.state == "failed" and "is no longer this control plane" in done.error
    assert ApiToken.objects.get().revoked


async def _async(value):
    return value


@pytest.mark.django_db(transaction=True)
def test_another_replica_behind_the_same_address_proves_it_as_well(monkeypatch):
    with stranger_server() as array:  # stands in for two replicas behind one port
        pids = iter(range(1, 10))

        async def prove(url):
            return identity.Proven(pid=next(pids), address=("127.0.0.1", array.port))

        monkeypatch.setattr(jobs, "aprove", prove)
        run = LoadTestRun.objects.create(scenario_name="t", scenario=SPEC, target_url=array.url)
        done = jobs.loadtest_execute(run.pk)
    assert done.state == "succeeded", done.error
    assert len(done.steps_done) == 2
