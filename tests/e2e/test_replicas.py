"""Two control-plane replicas (two daphne processes) on one PostgreSQL database and one Redis,
as the scale-out mode runs them (issue 30): they behave as one array. Fake nodes stand in for
node agents (what is tested is the control plane). A replica killed under chat load and a job
taken over from a dead replica: ``test_replica_failures.py``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.postgres import fresh_database, redis_url
from tests.support.processes import REPO, bundled_model_path, free_port, wait_healthy
from tests.support.replicas import MODEL, Replicas, replica_array

pytestmark = pytest.mark.e2e

SESSIONS = 24


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[Replicas]:
    """One array for the module: its tests use sessions and tokens of their own."""
    with replica_array(tmp_path_factory.mktemp("replicas")) as array:
        yield array


async def _first_turns_at_once(replicas: Replicas) -> list[tuple[str, str, str]]:
    """Each session's first turn sent to both replicas at the same instant (the second replica
    gets the sessions in the opposite order); returns ``(session, node by A, node by B)``."""
    sessions = [f"race-{i}" for i in range(SESSIONS)]
    async with httpx.AsyncClient(timeout=30) as client:
        a = [replicas.chat(client, 0, s, "hi") for s in sessions]
        b = [replicas.chat(client, 1, s, "hi") for s in reversed(sessions)]
        answers = await asyncio.gather(*a, *b)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers][:3]
    by_a = {
        s: r.headers["x-phalanx-node"] for s, r in zip(sessions, answers[:SESSIONS], strict=True)
    }
    by_b = {
        s: r.headers["x-phalanx-node"]
        for s, r in zip(reversed(sessions), answers[SESSIONS:], strict=True)
    }
    return [(s, by_a[s], by_b[s]) for s in sessions]


def test_concurrent_first_turns_of_one_session_land_on_one_node(replicas):
    placed = asyncio.run(_first_turns_at_once(replicas))
    split = [(s, a, b) for s, a, b in placed if a != b]
    assert split == []  # each session's two first turns went to one node
    auth = {"Authorization": f"Bearer {replicas.token}"}
    for session, node, _ in placed:  # and the routing table says that node, on both replicas
        for plane in replicas.planes:
            shown = httpx.get(f"{plane.url}/api/sessions/{session}", headers=auth).json()
            assert shown["node"] == node, (session, shown)
    spread = {node for _, node, _ in placed}
    assert len(spread) > 1  # placement still spreads sessions over the nodes


def test_a_token_revoked_on_one_replica_is_refused_by_the_other_at_once(replicas):
    auth = {"Authorization": f"Bearer {replicas.token}"}
    planes = replicas.planes
    created = httpx.post(f"{planes[0].url}/api/tokens", json={"name": "agent"}, headers=auth)
    agent = {"Authorization": f"Bearer {created.json()['token']}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for plane in planes:  # each replica has the token in its lookup cache now
        assert httpx.post(f"{plane.url}/v1/chat/completions", json=body, headers=agent).is_success
    revoked = httpx.delete(f"{planes[0].url}/api/tokens/{created.json()['id']}", headers=auth)
    assert revoked.status_code == 200
    time.sleep(1.5)  # one generation check (GENERATION_CHECK_S), far less than the cache's TTL
    other = httpx.post(f"{planes[1].url}/v1/chat/completions", json=body, headers=agent)
    assert other.status_code == 401


def test_up_runs_replicas_behind_one_port(tmp_path):
    """``manage.py up --replicas 2`` on PostgreSQL and Redis: two control-plane processes
    answer on the one port (each proves its own pid in ``/health``); one killed under load, the
    other answers meanwhile and ``up`` starts it again; a stop ends both."""
    import secrets
    import signal

    bundled_model_path()  # fetched once into the checkout's var/models
    (tmp_path / "models").symlink_to(REPO / "var" / "models")
    port = free_port()
    with fresh_database("phalanx_up") as database:
        env = {
            **os.environ,
            "PHALANX_HOME": str(tmp_path),
            "DATABASE_URL": database,
            "REDIS_URL": redis_url(),
        }
        command = [sys.executable, "manage.py", "up", "--nodes", "1", "--replicas", "2"]
        log = tmp_path / "up.log"  # up's own output, shown when it does not come up
        with log.open("w") as out:  # the child holds its own copy once started
            up = subprocess.Popen(
                [*command, "--port", str(port)],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            try:
                wait_healthy(f"http://127.0.0.1:{port}", timeout=120)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\nup's output:\n{log.read_text()[-4000:]}") from exc
            pids = set()
            for _ in range(60):  # each GET a new connection: the kernel picks a replica
                health = httpx.get(
                    f"http://127.0.0.1:{port}/health",
                    params={"challenge": secrets.token_hex(16)},
                    timeout=5,
                ).json()
                pids.add(health["identity"]["pid"])
                if len(pids) == 2:
                    break
            assert len(pids) == 2
            killed = pids.pop()
            os.kill(killed, signal.SIGKILL)  # one replica dies under load
            answered, seen = _requests_through(port, seconds=8.0)
            assert answered == 160  # every request answered (a reset connection retried once)
            assert pids <= seen and killed not in seen
            assert len(seen) == 2  # the dead replica was started again beside the other
            os.killpg(up.pid, signal.SIGTERM)
            assert up.wait(60) == 0
            assert not [pid for pid in pids if _alive(pid)]
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()


def _requests_through(port: int, *, seconds: float) -> tuple[int, set[int]]:
    """160 ``/health`` requests spread over ``seconds``, each retried once on a connection
    error (what a client behind a front proxy gets); returns how many were answered and the
    replica pids that answered them."""
    import secrets

    answered, pids = 0, set()
    for _ in range(160):
        for attempt in range(2):
            try:
                body = httpx.get(
                    f"http://127.0.0.1:{port}/health",
                    params={"challenge": secrets.token_hex(16)},
                    timeout=5,
                ).json()
            except httpx.TransportError:
                if attempt:
                    raise
                continue
            answered += 1
            pids.add(body["identity"]["pid"])
            break
        time.sleep(seconds / 160)
    return answered, pids


def test_up_refuses_replicas_without_postgresql_and_redis(tmp_path):
    env = {**os.environ, "PHALANX_HOME": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "up", "--replicas", "2", "--port", str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--replicas 2 needs DATABASE_URL and REDIS_URL" in done.stderr


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
