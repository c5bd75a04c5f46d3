"""A real control plane for the routing benchmarks: its own database, daphne and the control loop.

``ControlPlane(nodes, log_dir, policy={...})`` migrates a fresh SQLite database under a temporary
``PHALANX_HOME``, registers the package and the given node processes, sets the routing policy
(and, given ``quota``, the admin role's default quota through ``quotas.quota_set``: the bench
token acts as admin, so its requests are then counted against rate limits as a limited token's
are), then starts ``daphne console.asgi:application`` and ``manage.py controlloop`` on loopback.
Clients call ``url`` with ``headers`` (a Bearer token from ``$PHALANX_API_TOKEN``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness import Proc, free_port, spawn, start_control_plane  # noqa: F401

PACKAGE = "smollm2-135m-instruct-q4_1"
TOKEN = "bench-token"
SET_UP = (  # run with the control plane's environment: argv nodes, policy, quota (JSON)
    "import django, json, sys; django.setup()\n"
    "from django.core.management import call_command\n"
    "from django.utils import timezone\n"
    "call_command('migrate', verbosity=0)\n"
    "from inference.models import ModelPackage, RoutingPolicy\n"
    "from inference.usage.quotas import quota_set\n"
    "from nodes.models import Node\n"
    "nodes, policy, quota = (json.loads(a) for a in sys.argv[1:4])\n"
    "if quota: quota_set(changes=quota, role='admin')\n"
    f"pkg = ModelPackage.objects.create(name={PACKAGE!r}, version='1', gguf_path='x', sha256='')\n"
    "for node_id, address in nodes.items():\n"
    "    Node.objects.create(node_id=node_id, address=address, package=pkg, state='up',\n"
    "                        last_probe_at=timezone.now())\n"
    "p = RoutingPolicy.load()\n"
    "for k, v in policy.items(): setattr(p, k, v)\n"
    "p.full_clean(); p.save()\n"
)


class ControlPlane:
    def __init__(
        self,
        nodes: dict[str, str],
        log_dir: Path,
        *,
        policy: dict | None = None,
        quota: dict | None = None,
        env: dict[str, str] | None = None,
        home: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.home = home or Path(tempfile.mkdtemp(prefix="phalanx-home-"))
        self.env = {
            "PHALANX_HOME": str(self.home),
            "PHALANX_API_TOKEN": TOKEN,
            "DJANGO_SETTINGS_MODULE": "console.settings",
            **(env or {}),
        }
        self._set_up(nodes, policy or {}, quota or {})
        port = port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.headers = {"Authorization": f"Bearer {TOKEN}"}
        self.loop = spawn(
            [sys.executable, "manage.py", "controlloop"], log_dir / "controlloop.log", env=self.env
        )
        self.server = start_control_plane(port, log_dir, env=self.env)
        deadline = time.monotonic() + 60 + 30 * len(nodes)  # the loop validates each node
        while time.monotonic() < deadline:
            if self.server.popen.poll() is not None:
                raise RuntimeError(self.server.log()[-3000:])
            if self._validated():
                time.sleep(2.5)  # let the control loop scrape every node's load once
                return
            time.sleep(0.2)
        raise RuntimeError(f"control plane not ready:\n{self.server.log()[-3000:]}")

    def _set_up(self, nodes: dict[str, str], policy: dict, quota: dict) -> None:
        """Migrate the database and register the package, nodes, policy and quota."""
        subprocess.run(
            [sys.executable, "-c", SET_UP, *(json.dumps(x) for x in (nodes, policy, quota))],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, **self.env},
            check=True,
        )

    def _validated(self) -> bool:
        """True when every node is up and has passed device validation (the control loop
        validates each node before it takes traffic, one per machine at a time)."""
        try:
            listed = httpx.get(f"{self.url}/api/nodes", headers=self.headers, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(listed) and all(
            n.get("state") == "up" and n.get("validation") in ("passed", "warned") for n in listed
        )

    def stop(self) -> None:
        self.server.stop()
        self.loop.stop()
