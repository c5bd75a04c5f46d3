"""A control-plane replica that dies, on PostgreSQL and Redis (issue 30): real daphne processes
and control loops, fake nodes (``tests.support.replicas``).

- Killed under chat load (SIGKILL while several clients stream through both replicas): nothing
  that had not started streaming is lost (a client retries a request that got no byte of its
  answer on the other replica, and the survivor answers it); the streams it cuts are exactly
  those that were streaming through it; every session, wherever placed, keeps its node.
- A job (a load test) on two control loops: claimed and run by one; when that replica dies
  (its control loop and the job's process, SIGKILL) the other takes it over once its lease (the
  heartbeat's staleness) runs out and finishes it, resuming after the last finished step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.support.replicas import MODEL, Replicas, replica_array

pytestmark = pytest.mark.e2e

CLIENTS, TURNS = 12, 6
STREAM_TOKENS = 40  # 20 ms each: a turn streams for about 0.8 s


@dataclass
class Turn:
    """One chat turn as the client saw it: ``outcome`` "answered" (the stream reached
    ``[DONE]``) or "cut" (it broke after its first byte); ``plane`` the replica that gave the
    outcome; ``retried`` when a first try got no byte and went to the other replica."""

    session: str
    index: int
    plane: int = -1
    node: str = ""
    outcome: str = ""
    retried: bool = False
    ended_at: float = 0.0


@dataclass
class Load:
    """The clients' shared view: which turns are streaming through each replica right now, and
    the moment one replica was killed (with the turns streaming through it then)."""

    replicas: Replicas
    victim: int = 0
    streaming: dict[int, set[tuple[str, int]]] = field(default_factory=lambda: {0: set(), 1: set()})
    answered: int = 0
    killed_at: float | None = None
    streaming_at_kill: set[tuple[str, int]] = field(default_factory=set)

    def kill_when_loaded(self) -> None:
        """SIGKILL the victim once a third of the turns are answered and it streams three."""
        if self.killed_at is None and self.answered >= CLIENTS * TURNS // 3:
            if len(self.streaming[self.victim]) >= 3:
                self.streaming_at_kill = set(self.streaming[self.victim])
                os.kill(self.replicas.planes[self.victim].popen.pid, signal.SIGKILL)
                self.killed_at = time.monotonic()


async def _try(load: Load, client: httpx.AsyncClient, turn: Turn, plane: int) -> bool:
    """One try of ``turn`` on replica ``plane``; True when it has an outcome (answered, or cut
    after its first byte), False when it failed before any byte of the answer."""
    replicas, key, got = load.replicas, (turn.session, turn.index), b""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {**replicas.auth, "X-Session-Id": turn.session}
    url = f"{replicas.planes[plane].url}/v1/chat/completions"
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            turn.node = response.headers["x-phalanx-node"]
            async for chunk in response.aiter_bytes():
                got += chunk
                load.streaming[plane].add(key)
                load.kill_when_loaded()
    except httpx.TransportError:
        if not got:
            return False
    finally:
        load.streaming[plane].discard(key)
    turn.plane, turn.ended_at = plane, time.monotonic()
    turn.outcome = "answered" if got.rstrip().endswith(b"data: [DONE]") else "cut"
    load.answered += turn.outcome == "answered"
    return True


async def _client(load: Load, client: httpx.AsyncClient, c: int) -> list[Turn]:
    """Client ``c``: ``TURNS`` turns of session ``kill-c``, alternating the replica it tries
    first; a try that got no byte is retried once on the other replica."""
    turns = []
    for i in range(TURNS):
        turn, first = Turn(f"kill-{c}", i), (c + i) % 2
        if not await _try(load, client, turn, first):
            turn.retried = True
            assert await _try(load, client, turn, 1 - first), f"{turn} failed on both"
        turns.append(turn)
    return turns


async def _under_load(load: Load) -> list[Turn]:
    async with httpx.AsyncClient(timeout=30) as client:
        per_client = await asyncio.gather(*(_client(load, client, c) for c in range(CLIENTS)))
    return [turn for turns in per_client for turn in turns]


@pytest.fixture
def replicas(tmp_path) -> Iterator[Replicas]:
    with replica_array(tmp_path) as array:
        for node in array.nodes:
            node.tokens = [f"t{i} " for i in range(STREAM_TOKENS)]
        yield array


def test_a_replica_killed_under_load_loses_nothing_that_had_not_started_streaming(replicas):
    """12 clients stream 6 turns each through two replicas; one is SIGKILLed mid-load. Every
    turn has an outcome; the cut ones are only turns streaming through the dead replica at its
    death; every other turn was answered, by the survivor unless it ended before the
    kill; a try that got no byte was retried and answered by the survivor. Every session
    stayed on one node, and the survivor's routing table says that node, placed once, never
    moved, for the sessions the dead replica placed too."""
    load = Load(replicas)
    turns = asyncio.run(_under_load(load))
    assert load.killed_at is not None and len(turns) == CLIENTS * TURNS
    victim, survivor = load.victim, 1 - load.victim
    cut = [t for t in turns if t.outcome == "cut"]
    # cut: only turns that had bytes from the dead replica (those the client saw streaming at
    # the kill, and any whose first bytes were on the wire then but read a moment after)
    assert cut and all(t.plane == victim for t in cut), cut
    for turn in turns:
        if (turn.session, turn.index) in load.streaming_at_kill or turn.outcome == "cut":
            assert turn.plane == victim  # cut, or its last bytes were already on the way
        else:
            before = turn.plane == victim and turn.ended_at < load.killed_at
            assert turn.outcome == "answered" and (before or turn.plane == survivor), turn
    retried = [t for t in turns if t.retried]
    assert retried and all(t.plane == survivor for t in retried)
    _sessions_kept_their_nodes(replicas, turns, survivor)


def _sessions_kept_their_nodes(replicas: Replicas, turns: list[Turn], survivor: int) -> None:
    """Each session's turns all went to one node, and the survivor's routing table pins it
    there: placed once, never moved (sessions whose first turn the dead replica placed too)."""
    placed_by_victim = {t.session for t in turns if t.index == 0 and t.plane != survivor}
    assert placed_by_victim
    url = replicas.planes[survivor].url
    for session in {t.session for t in turns}:
        nodes = {t.node for t in turns if t.session == session}
        assert len(nodes) == 1, (session, nodes)
        shown = httpx.get(f"{url}/api/sessions/{session}", headers=replicas.auth).json()
        assert shown["node"] == nodes.pop() and shown["moves"] == 0, shown
        assert [d["action"] for d in shown["decisions"]] == ["placed"], shown


# --- a job taken over -------------------------------------------------------------------------

STALE_S = "8"  # PHALANX_LOADTEST_STALE_S (default 20): a worker silent this long is dead; a
# worker beats as it starts, then with its live figures each second (gaps up to 3 s seen here)
SCENARIO = {
    "name": "takeover",
    "kind": "ramp",
    "steps": [1, 2, 3],
    "hold_s": 2,
    "turns": 2,
    "think_time_s": 0.1,
    "conversation": "chat",
    "model": MODEL,
    "max_s": 120,
}


def _row(replicas: Replicas, run_id: int) -> dict:
    """The load-test run's row, straight from the shared database."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(replicas.env["DATABASE_URL"], row_factory=dict_row) as db:
        columns = "state, attempts, pid, steps_done, sessions, error"
        query = f"SELECT {columns} FROM inference_loadtestrun WHERE id = %s"
        return db.execute(query, (run_id,)).fetchone()


def _workers(loops: list) -> dict[int, int]:
    """``{worker pid: index of the control loop that started it}``: the ``loadtestjob``
    processes the loops have running now."""
    import psutil

    by_pid = {loop.popen.pid: i for i, loop in enumerate(loops)}
    found = {}
    for proc in psutil.process_iter(["ppid", "cmdline"]):
        if proc.info["ppid"] in by_pid and "loadtestjob" in (proc.info["cmdline"] or []):
            found[proc.pid] = by_pid[proc.info["ppid"]]
    return found


def _watch(replicas, run_id, loops, until, *, timeout: float = 60.0) -> tuple[dict, set]:
    """Poll the run's row until ``until(row)``; returns the row and every ``(attempt, worker
    pid, loop index)`` seen meanwhile."""
    seen: set[tuple[int, int, int]] = set()
    deadline = time.monotonic() + timeout
    while not until(row := _row(replicas, run_id)):
        assert time.monotonic() < deadline, row
        seen |= {(row["attempts"], pid, i) for pid, i in _workers(loops).items()}
        time.sleep(0.2)
    return row, seen


def test_a_job_is_claimed_once_and_taken_over_after_its_replica_dies(tmp_path):
    """A load test queued on an array with two control loops (the replicas' job runners, on
    one PostgreSQL): exactly one claims it and runs it (one worker, one attempt). That replica
    dies mid-run (its loop and the worker, SIGKILL); once the worker's heartbeat is older than
    ``PHALANX_LOADTEST_STALE_S`` the other loop queues it again, claims it (attempt 2) and
    finishes it, resuming after the last finished step: every step recorded once, the steps
    finished before the death kept as they were, none of them sent to a node again."""
    with replica_array(tmp_path, planes=1) as replicas:
        loops = [
            replicas.control_loop(f"loop-{i}", PHALANX_LOADTEST_STALE_S=STALE_S) for i in (0, 1)
        ]
        body = {"spec": SCENARIO, "target_url": replicas.planes[0].url, "token": replicas.token}
        created = httpx.post(
            f"{replicas.planes[0].url}/api/loadtests", json=body, headers=replicas.auth
        )
        assert created.status_code in (200, 201), created.text
        run_id = created.json()["id"]
        row, seen = _watch(replicas, run_id, loops, lambda r: len(r["steps_done"]) >= 1)
        ((worker, holder),) = _workers(loops).items()
        assert row["state"] == "running" and row["attempts"] == 1 and row["pid"] == worker
        assert seen <= {(1, worker, holder)}  # one attempt, one worker, one loop, all along
        logs = [tmp_path / f"loop-{i}" / "logs" / f"loadtest-{run_id}.log" for i in (0, 1)]
        assert [log.exists() for log in logs] == [i == holder for i in (0, 1)]
        kept = row["steps_done"]
        os.killpg(worker, signal.SIGKILL)  # the replica dies: its loop and its job's process
        os.killpg(loops[holder].popen.pid, signal.SIGKILL)
        loops[holder].popen.wait(10)

        ended = ("succeeded", "failed", "stopped")
        row, seen = _watch(replicas, run_id, loops, lambda r: r["state"] in ended)
        assert (row["state"], row["attempts"], row["error"]) == ("succeeded", 2, ""), row
        assert {i for _, pid, i in seen if pid != worker} == {1 - holder}
        assert logs[1 - holder].exists()
        _resumed(replicas, run_id, row, kept)


def _resumed(replicas: Replicas, run_id: int, row: dict, kept: list[dict]) -> None:
    """Every step recorded once; the ``kept`` steps (finished by attempt 1) unchanged and
    never run again; the rest run by attempt 2 (session ids carry ``<run>.<attempt>``)."""
    k = len(kept)
    assert 0 < k < len(SCENARIO["steps"])
    assert [s["step"] for s in row["steps_done"]] == list(range(len(SCENARIO["steps"])))
    assert row["steps_done"][:k] == kept
    for session in row["sessions"]:
        attempt = 1 if session["step"] < k else 2
        assert session["sid"].startswith(f"lt-{run_id}.{attempt}-s{session['step']}-"), session
    sent = {r["session"] for node in replicas.nodes for r in node.requests}
    tag = f"lt-{run_id}.2-s"  # then the step: lt-<run>.<attempt>-s<step>-u<user>-<n>
    again = [s for s in sent if s.startswith(tag) and int(s[len(tag) :].split("-")[0]) < k]
    assert not again  # attempt 2 sent nothing of the steps attempt 1 finished
    assert any(s.startswith(f"lt-{run_id}.2-") for s in sent)
