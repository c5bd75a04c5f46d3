"""Control-plane replicas as the scale-out mode runs them (issue 30): daphne processes (and, for
the jobs, control loops) on one fresh PostgreSQL database and the machine's Redis, in front of
in-process fake nodes (``tests.fakenode``): what is tested is the control plane."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.fakenode import FakeNode
from tests.support.postgres import fresh_database, redis_url
from tests.support.processes import (
    Proc,
    free_port,
    migrated_with_token,
    spawn,
    start_control_plane,
    wait_healthy,
)

MODEL = "smollm2-test"


@dataclass
class Replicas:
    """The running array: its control planes (``planes``), an admin token, the fake nodes, the
    environment additions every process of the array shares (``env``) and its home."""

    planes: list[Proc]
    token: str
    nodes: list[FakeNode]
    env: dict[str, str]
    home: Path
    others: list[Proc] = field(default_factory=list)  # what the test started (stopped at end)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def chat(self, client: httpx.AsyncClient, plane: int, session: str, text: str):
        return client.post(
            f"{self.planes[plane].url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
            headers={**self.auth, "X-Session-Id": session},
        )

    def control_loop(self, name: str, **env: str) -> Proc:
        """Start ``manage.py controlloop`` of this array in a home of its own (``home/name``:
        its job processes' logs under ``var/logs`` tell which loop ran what), with ``env``."""
        home = self.home / name
        home.mkdir()
        extra = {**self.env, "PHALANX_HOME": str(home), **env}
        loop = spawn([sys.executable, "manage.py", "controlloop"], home / "loop.log", env=extra)
        self.others.append(loop)
        return loop


def replica_setup(nodes: list[FakeNode]) -> str:
    """``manage.py shell`` code: a package and the fake nodes, up and validated; a health
    interval of 1 s (a control loop's ticks, when a test starts one)."""
    rows = "\n".join(f"add('{n.node_id}', '{n.address}')" for n in nodes)
    return f"""
from django.utils import timezone
from inference.models import ModelPackage, RoutingPolicy
from nodes.models import Node
policy = RoutingPolicy.load()
policy.health_interval_s = 1.0
policy.save()
package = ModelPackage.objects.create(
    name="{MODEL}", version="1", gguf_path="/tmp/x.gguf", sha256="0" * 64, quantization="Q4_1"
)
def add(node_id, address):
    Node.objects.create(node_id=node_id, address=address, package=package, state="up",
        validation="passed", last_probe_at=timezone.now(), last_seen_load={{"load": 0.0}})
{rows}
"""


@contextmanager
def replica_array(home: Path, *, planes: int = 2, nodes: int = 3) -> Iterator[Replicas]:
    """``planes`` control planes (``manage.py serve``, each in ``home/r<i>``) on one fresh
    database, in front of ``nodes`` fake nodes (20 ms a token); all healthy when it yields,
    every process it or the test started through ``Replicas`` stopped at the end."""
    fakes = [FakeNode(f"node-{i:02d}", token_delay=0.02).start() for i in range(1, nodes + 1)]
    with fresh_database("phalanx_replicas") as database:
        env = {"PHALANX_HOME": str(home), "DATABASE_URL": database, "REDIS_URL": redis_url()}
        full = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "console.settings"}
        token = migrated_with_token(full, replica_setup(fakes))
        array = Replicas([], token, fakes, env, home)
        for i in range(planes):
            (home / f"r{i}").mkdir()
            array.planes.append(start_control_plane(free_port(), home / f"r{i}", env=env))
        try:
            for plane in array.planes:
                wait_healthy(plane.url, plane, timeout=60)
            yield array
        finally:
            for proc in [*array.others, *array.planes]:
                proc.stop()
            for node in fakes:
                node.stop()
