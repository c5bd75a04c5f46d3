"""A real two-node array for rolling-upgrade tests, and agent traffic to run through an upgrade.

``upgrade_array`` starts two node agents with the bundled model (each pinned to a CPU, started
as ``manage.py up`` starts them: with the package's sha256), a control plane (daphne) and a
control loop on a fresh SQLite under a temporary ``PHALANX_HOME``, all on loopback. Its
packages: the bundled file (``:1``), the same weights with an equivalent chat template (``:2``:
another file, so a node really loads it) and one whose chat template raises (``:3``: its smoke
chat fails). All are approved (with a recorded override: their evaluation is not the subject).

``AgentTraffic`` runs short agent sessions (streamed, ``X-Session-Id``, a few turns each, then
a new session) through the proxy on a thread of its own and records every turn: which node
answered (``X-Phalanx-Node``), when, and whether it was answered whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from inference.routing import Rollout, version_for_new_session
from tests.support.processes import (
    Proc,
    control_plane_at_home,
    free_port,
    spawn,
    start_node,
)

MODEL = "smollm2-135m-instruct-q4_1"
NODES = ("node-a", "node-b")
BROKEN_TEMPLATE = "{{ raise_exception('deliberately broken: tests/e2e/test_upgrades.py') }}"
SETUP = """
from inference.models import ModelPackage, RoutingPolicy
from inference.packages.services import package_approve, package_with_template
from console.embedded import package_register_bundled
from nodes.models import Node
from tests.support.processes import bundled_model_path
from tests.support.validation import mark_validated
policy = RoutingPolicy.load()
policy.health_interval_s = 1.0
policy.probe_timeout_s = 2.0
policy.save()
v1 = package_register_bundled(bundled_model_path())
# the same weights and an equivalent template: another file (sha256), so a switch really loads
v2 = package_with_template(package_id=v1.pk, chat_template=v1.chat_template + "{# v2 #}")
v3 = package_with_template(package_id=v1.pk, chat_template=BROKEN)
for p in (v1, v2, v3):
    package_approve(package_id=p.pk, override_reason="tests/e2e/test_upgrades.py")
for node_id, url in NODES.items():
    Node.objects.create(node_id=node_id, address=url.removeprefix("http://"), package=v1)
    mark_validated(node_id, url)  # the subject here is upgrades, not validation
"""
TERMINAL = ("succeeded", "rolled_back", "failed")
USER_TURNS = ["Hi, where is my order A-1042?", "Can it arrive before Friday?", "Thanks, bye."]


@dataclass
class UpgradeArray:
    url: str
    token: str
    env: dict[str, str]
    home: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    packages: dict[str, int] = field(default_factory=dict)  # key -> id

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        kwargs.setdefault("timeout", 30)
        return httpx.request(method, f"{self.url}/api{path}", headers=headers, **kwargs)

    def v1_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: what an OpenAI client sees, ``data``."""
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.get(f"{self.url}/v1/models", headers=headers, timeout=30).json()["data"]

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["node_id"]: n for n in self.api("GET", "/nodes").json()}

    def serving(self) -> set[str]:
        """The package keys the nodes serve."""
        return {n["package"] for n in self.nodes().values()}

    def start_loop(self) -> Proc:
        loop = spawn(
            [sys.executable, "manage.py", "controlloop"],
            self.home / f"controlloop-{len(self.procs)}.log",
            env=self.env,
        )
        self.procs[f"loop-{len(self.procs)}"] = loop
        self.procs["loop"] = loop
        return loop

    def kill_loop(self) -> None:
        """SIGKILL the control loop: no cleanup, leases and all left as they were."""
        loop = self.procs["loop"]
        os.kill(loop.popen.pid, signal.SIGKILL)
        loop.popen.wait(30)

    def start_upgrade(self, from_key: str, to_key: str, **settings: float | str) -> int:
        body = {
            "from_package_id": self.packages[from_key],
            "to_package_id": self.packages[to_key],
            "settings": settings,
        }
        r = self.api("POST", "/upgrades", json=body)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def start_paused_canary(
        self, from_key: str, to_key: str, *, share: float, **settings: float | str
    ) -> tuple[int, dict[str, Any]]:
        """Start an upgrade with canary share ``share``, wait for its first batch to take that
        share of new sessions, and pause it there: ``(upgrade id, the paused upgrade)``."""
        upgrade_id = self.start_upgrade(from_key, to_key, canary_share=share, **settings)
        self.wait_upgrade(upgrade_id, lambda u: u["new_share"] == share, what="the canary")
        assert self.api("POST", f"/upgrades/{upgrade_id}/pause").status_code == 200
        return upgrade_id, self.wait_upgrade(
            upgrade_id, lambda u: u["state"] == "paused", what="paused"
        )

    def wait_upgrade_end(self, upgrade_id: int) -> dict[str, Any]:
        """``wait_upgrade`` until the upgrade ends (succeeded, rolled back or failed)."""
        return self.wait_upgrade(upgrade_id, lambda u: u["state"] in TERMINAL, what="end")

    def upgrade(self, upgrade_id: int) -> dict[str, Any]:
        return self.api("GET", f"/upgrades/{upgrade_id}").json()

    def events(self, upgrade_id: int) -> list[dict[str, Any]]:
        return self.api("GET", f"/upgrades/{upgrade_id}/events").json()

    def wait_upgrade(
        self,
        upgrade_id: int,
        until: Callable[[dict[str, Any]], bool],
        *,
        what: str,
        timeout: float = 300.0,
    ) -> dict[str, Any]:
        """Poll the upgrade until ``until(upgrade)``; fails naming ``what`` with the upgrade's
        event log when it does not come, or when the upgrade ends first."""
        deadline = time.monotonic() + timeout
        while True:
            upgrade = self.upgrade(upgrade_id)
            if until(upgrade):
                return upgrade
            if upgrade["state"] in TERMINAL or time.monotonic() > deadline:
                log = "\n".join(
                    f"  {e['at'][11:23]} {e['node_id'] or '-':7} {e['kind']}: {e['message']}"
                    for e in self.events(upgrade_id)
                )
                raise AssertionError(
                    f"upgrade {upgrade_id} did not reach {what} (state {upgrade['state']}, "
                    f"phase {upgrade['phase']!r}, nodes "
                    f"{[(s['node_id'], s['state']) for s in upgrade['nodes']]}):\n{log}"
                )
            time.sleep(0.3)

    def wait_event(
        self, upgrade_id: int, kind: str, starts: str = "", timeout: float = 300.0
    ) -> dict[str, Any]:
        """Poll the event log until an event of ``kind`` whose message starts with ``starts``."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events(upgrade_id):
                if event["kind"] == kind and event["message"].startswith(starts):
                    return event
            state = self.upgrade(upgrade_id)["state"]
            assert state not in TERMINAL, f"the upgrade ended {state} before {kind} {starts!r}"
            assert time.monotonic() < deadline, f"no {kind} event {starts!r}"
            time.sleep(0.3)

    def wait_nodes(
        self, until: Callable[[dict[str, dict[str, Any]]], bool], *, what: str, timeout=90.0
    ) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if until(nodes):
                return nodes
            assert time.monotonic() < deadline, f"nodes did not reach {what}: {nodes}"
            time.sleep(0.3)

    def session(self, session_id: str) -> dict[str, Any]:
        from urllib.parse import quote

        return self.api("GET", f"/sessions/{quote(session_id, safe='')}").json()


def canary_split(rollout: Rollout, prefix: str, count: int = 40) -> tuple[list[str], list[str]]:
    """``count`` new session ids ``{prefix}-{i}`` split by the rollout's stable split of ids:
    ``(those sent to the new version, those sent to the old)``."""
    ids = [f"{prefix}-{i}" for i in range(count)]
    to_new = [i for i in ids if version_for_new_session(i, rollout) == rollout.new_package_id]
    return to_new, [i for i in ids if i not in to_new]


def serving_and_measured(nodes: dict[str, dict[str, Any]]) -> bool:
    return all(n["state"] == "up" and n["load"] is not None for n in nodes.values())


@contextmanager
def upgrade_array(home: Path) -> Iterator[UpgradeArray]:
    """The array, both nodes up and measured; everything stops at the end."""
    from inference.bundled import SMOLLM2_135M

    procs: dict[str, Proc] = {}
    array = None
    try:
        for cpu, node_id in enumerate(NODES):
            procs[node_id] = start_node(
                node_id,
                home,
                port=free_port(),
                cpus=str(cpu % max(1, os.cpu_count() or 1)),
                extra_args=["--sha256", SMOLLM2_135M.sha256, "--sequences", "4"],
                wait=False,
            )
        for proc in procs.values():
            from tests.support.processes import wait_healthy

            wait_healthy(proc.url, proc)
        nodes = {node_id: procs[node_id].url for node_id in NODES}
        setup = f"BROKEN = {BROKEN_TEMPLATE!r}\nNODES = {nodes!r}\n{SETUP}"
        daphne, token, extra = control_plane_at_home(home, setup=setup)
        procs["daphne"] = daphne
        # a killed control loop's upgrade lease runs out in 9 s, not 30 (the resume test waits it)
        env = {**extra, "PHALANX_URL": daphne.url, "PHALANX_UPGRADE_LEASE_S": "9"}
        array = UpgradeArray(daphne.url, token, env, home, procs)
        array.packages = {p["key"]: p["id"] for p in array.api("GET", "/packages").json()}
        array.start_loop()
        array.wait_nodes(serving_and_measured, what="up and measured")
        yield array
    finally:
        for name, proc in reversed(list(procs.items())):
            if name != "loop":  # also listed by its own name
                proc.stop()


# --- traffic ---------------------------------------------------------------------------------


@dataclass
class Turn:
    session: str
    index: int
    node: str
    started: float  # time.time()
    ended: float
    ok: bool
    cut: bool
    error: str = ""
    package: str = ""  # the version the answer says served it (X-Phalanx-Package)
    fingerprints: frozenset[str] = frozenset()  # every chunk's system_fingerprint


@dataclass
class AgentTraffic:
    """``workers`` concurrent agent sessions of ``turns`` turns each, one after another, until
    ``stop()``; session ids are ``{prefix}-{worker}-{n}``."""

    url: str
    token: str
    prefix: str
    workers: int = 3
    turns: int = 3
    max_tokens: int = 12
    think_s: float = 0.2
    turns_done: list[Turn] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> AgentTraffic:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="traffic", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> list[Turn]:
        """Let every session under way finish its turns, then stop; returns the turns."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(300)
        assert not self._thread.is_alive(), "the traffic did not stop within 300 s"
        return self.turns_done

    def wait_turns(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.turns_done) < count:
            assert time.monotonic() < deadline, f"only {len(self.turns_done)} turns answered"
            time.sleep(0.2)

    async def _run(self) -> None:
        timeout = httpx.Timeout(180.0, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.workers)))

    async def _worker(self, client: httpx.AsyncClient, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            session = f"{self.prefix}-{worker}-{n}"
            n += 1
            self.sessions.append(session)
            await self.session(client, session)

    async def session(self, client: httpx.AsyncClient, session: str) -> None:
        """One whole session (its turns run even after ``stop()``: an agent finishes)."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a support agent. Answer briefly."}
        ]
        for index in range(self.turns):
            messages.append({"role": "user", "content": USER_TURNS[index % len(USER_TURNS)]})
            turn, reply = await self._turn(client, session, index, messages)
            self.turns_done.append(turn)
            messages.append({"role": "assistant", "content": reply or "(no answer)"})
            await asyncio.sleep(self.think_s)

    async def _turn(
        self, client: httpx.AsyncClient, session: str, index: int, messages: list
    ) -> tuple[Turn, str]:
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.token}", "X-Session-Id": session}
        started, node, text, done, error = time.time(), "", [], False, ""
        package, fingerprints = "", set()
        try:
            async with client.stream(
                "POST", f"{self.url}/v1/chat/completions", json=body, headers=headers
            ) as r:
                node = r.headers.get("x-phalanx-node", "")
                package = r.headers.get("x-phalanx-package", "")
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                else:
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            if "error" in event:
                                error = str(event["error"])[:300]
                            if event.get("system_fingerprint"):
                                fingerprints.add(event["system_fingerprint"])
                            for choice in event.get("choices") or []:
                                text.append((choice.get("delta") or {}).get("content") or "")
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        ok = done and not error
        cut = not ok and not error.startswith("HTTP")
        turn = Turn(
            session, index, node, started, time.time(), ok, cut, error, package,
            frozenset(fingerprints),
        )  # fmt: skip
        return turn, "".join(text)


def run_sessions(url: str, token: str, session_ids: list[str], *, turns: int = 2) -> list[Turn]:
    """Run the given sessions whole, concurrently; returns their turns."""
    traffic = AgentTraffic(url, token, prefix="", turns=turns)

    async def all_of_them() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(180.0, connect=10.0)) as client:
            await asyncio.gather(*(traffic.session(client, s) for s in session_ids))

    asyncio.run(all_of_them())
    return traffic.turns_done


# --- what served each turn --------------------------------------------------------------------


@dataclass(frozen=True)
class Stint:
    """A node out of service for an upgrade step (drained, ``start`` to ``end``, time.time()),
    serving ``before`` until then and ``after`` since."""

    node_id: str
    start: float
    end: float
    before: str
    after: str


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def stints(events: list[dict[str, Any]], old: str, new: str) -> list[Stint]:
    """Each node's time out of service, from the upgrade's event log: forward from its
    ``draining`` to its ``done`` (old -> new) and back from ``reverting`` to ``reverted``
    (new -> old: a node that was reverted after it took traffic on the new version). A node
    whose stint has not ended by the end of the log is out of service to the end."""
    out, opened = [], {}
    for e in events:
        node = e["node_id"]
        if not node:
            continue
        if e["kind"] == "draining" or (e["kind"] == "reverting" and node not in opened):
            opened[node] = (e["kind"], _at(e["at"]))
        elif e["kind"] in ("done", "reverted") and node in opened:
            kind, start = opened.pop(node)
            if e["kind"] == "done":
                out.append(Stint(node, start, _at(e["at"]), old, new))
            elif kind == "reverting":
                out.append(Stint(node, start, _at(e["at"]), new, old))
            else:  # drained forward, then back without taking traffic: it served old throughout
                out.append(Stint(node, start, _at(e["at"]), old, old))
    for node, (_, start) in opened.items():
        out.append(Stint(node, start, float("inf"), old, old))
    return out


def version_of(turn: Turn, node_stints: list[Stint], old: str) -> str:
    """The package version that answered ``turn``: what its node served when the turn started
    (a node starts a request on the engine it serves then, and finishes it there). A turn that
    started on a node while it was out of service for the upgrade is ``"out of service"``."""
    version = old
    for s in sorted((s for s in node_stints if s.node_id == turn.node), key=lambda s: s.start):
        if turn.started < s.start:
            return version
        if turn.started < s.end:
            return "out of service"
        version = s.after
    return version
