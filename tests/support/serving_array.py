"""A small real array for tests that send traffic: a control plane (daphne) and control loop on
a fresh SQLite under a temporary ``PHALANX_HOME``, and one node agent with the bundled model,
registered through the API and validated by the control loop, all on loopback."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.processes import Proc, control_plane_at_home, spawn, start_node

PACKAGE = "smollm2-135m-instruct-q4_1"
FAST_LOOP = """
from inference.models import RoutingPolicy
from console.embedded import package_register_bundled
from tests.support.processes import bundled_model_path
policy = RoutingPolicy.load()
policy.health_interval_s = 1.0
policy.probe_timeout_s = 1.0
policy.save()
package_register_bundled(bundled_model_path())
"""


@dataclass
class ServingArray:
    url: str
    token: str
    env: dict[str, str]
    home: Path
    procs: dict[str, Proc] = field(default_factory=dict)

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        kwargs.setdefault("timeout", 10)
        return httpx.request(method, f"{self.url}/api{path}", headers=headers, **kwargs)


@contextmanager
def serving_array(
    home: Path, *, setup: str = "", node_id: str = "node-lt1"
) -> Iterator[ServingArray]:
    """The array, its node up and validated; everything stops at the end."""
    daphne, token, extra = control_plane_at_home(home, setup=FAST_LOOP + setup)
    extra = {**extra, "PHALANX_URL": daphne.url}
    loop = spawn([sys.executable, "manage.py", "controlloop"], home / "controlloop.log", env=extra)
    array = ServingArray(daphne.url, token, extra, home, {"daphne": daphne, "loop": loop})
    try:
        node = start_node(node_id, home)
        array.procs["node"] = node
        body = {"node_id": node_id, "address": node.url.removeprefix("http://"), "package": PACKAGE}
        assert array.api("PUT", f"/nodes/{node_id}", json=body).status_code in (200, 201)
        _wait_validated(array, node_id)
        yield array
    finally:
        for proc in reversed(list(array.procs.values())):
            proc.stop()


def _wait_validated(array: ServingArray, node_id: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        node = array.api("GET", f"/nodes/{node_id}").json()
        if node["state"] == "up" and node["validation"] in ("passed", "warned"):
            return
        assert time.monotonic() < deadline, f"{node_id} did not come up validated: {node}"
        time.sleep(0.3)
