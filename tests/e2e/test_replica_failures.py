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
    turn has an outcome; the cut ones are exactly those streaming through the dead replica at
    its death; every other turn was answered, by the survivor unless it ended before the
    kill; a try that got no byte was retried and answered by the survivor. Every session
    stayed on one node, and the survivor's routing table says that node, placed once, never
    moved, for the sessions the dead replica placed too."""
    load = Load(replicas)
    turns = asyncio.run(_under_load(load))
    assert load.killed_at is not None and len(turns) == CLIENTS * TURNS
    victim, survivor = load.victim, 1 - load.victim
    cut = {(t.session, t.index) for t in turns if t.outcome == "cut"}
    assert cut and cut <= load.streaming_at_kill  # cut: only what streamed through the dead
    for turn in turns:
        if (turn.session, turn.index) in load.streaming_at_kill:
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
