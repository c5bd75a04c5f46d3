"""A node agent on another host joins the array with a one-time join token, then has its
credential revoked (issue 30, item 2). The other host is a network namespace this test makes
and removes, joined to this one by a veth pair, with addresses from the benchmarking range
198.18.0.0/15 (RFC 2544): the control plane listens on the host side, the node agent (the real
``runnode --join`` with the bundled model) inside the namespace, and every call crosses the
link. Skipped, saying why, where namespaces cannot be made (not root)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from nodes.agent.auth import parse_credential_file
from nodes.credentials import proof_for
from tests.support.processes import (
    REPO,
    Proc,
    bundled_model_path,
    free_port,
    migrated_with_token,
    spawn,
    start_control_plane,
    wait_healthy,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]

PACKAGE = "smollm2-135m-instruct-q4_1"
NODE = "remote-01"


@dataclass(frozen=True)
class Netns:
    """A network namespace ``name`` linked to this one: ``host_ip`` on this side of the veth
    pair, ``node_ip`` inside."""

    name: str
    host_ip: str
    node_ip: str

    def run(self, *args: str) -> list[str]:
        """``args`` as a command line run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def netns() -> Iterator[Netns]:
    tag = os.getpid() % 10000
    third = os.getpid() % 250 + 1  # 198.18.<third>.0/30: runs in parallel do not collide
    ns = Netns(f"phx-join-{tag}", f"198.18.{third}.1", f"198.18.{third}.2")
    host_end, node_end = f"phxh{tag}", f"phxn{tag}"
    made = subprocess.run(["ip", "netns", "add", ns.name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(
            f"cannot make a network namespace here (`ip netns add`: {made.stderr.strip()}); "
            "this test needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        )
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
        _ip("link", "set", node_end, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", ns.name, "addr", "add", f"{ns.node_ip}/30", "dev", node_end)
        _ip("-n", ns.name, "link", "set", node_end, "up")
        _ip("-n", ns.name, "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


@dataclass
class Array:
    plane: Proc
    token: str
    env: dict[str, str]

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(
            method, f"{self.plane.url}/api{path}", headers=headers, timeout=30, **kwargs
        )

    def chat(self) -> httpx.Response:
        """A four-token chat through the control plane's ``/v1/``."""
        body = {"model": PACKAGE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {self.token}"}
        url = f"{self.plane.url}/v1/chat/completions"
        return httpx.post(url, json=body, headers=headers, timeout=60)

    def control_loop_round(self) -> None:
        """One health-check round (``controlloop --once``) on the array's database."""
        full = {**os.environ, **self.env, "DJANGO_SETTINGS_MODULE": "console.settings"}
        args = [sys.executable, "manage.py", "controlloop", "--once"]
        subprocess.run(args, cwd=REPO, env=full, check=True, capture_output=True, timeout=60)


@pytest.fixture
def array(netns, tmp_path) -> Iterator[Array]:
    """A control plane listening on the host side of the link only."""
    home = tmp_path / "plane"
    home.mkdir()
    env = {
        "PHALANX_HOME": str(home),
        "DJANGO_ALLOWED_HOSTS": f"{netns.host_ip},127.0.0.1,localhost",
    }
    full = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    full.pop("DATABASE_URL", None)
    full.pop("REDIS_URL", None)
    setup = (
        "from inference.models import ModelPackage\n"
        f"ModelPackage.objects.create(name='{PACKAGE}', version='1', "
        f"gguf_path='{bundled_model_path()}', sha256='0' * 64, quantization='Q4_1')"
    )
    token = migrated_with_token(full, setup)
    env.update({"DATABASE_URL": "", "REDIS_URL": ""})
    plane = start_control_plane(free_port(netns.host_ip), home, env=env, host=netns.host_ip)
    try:
        wait_healthy(plane.url, plane, timeout=60)
        yield Array(plane, token, env)
    finally:
        plane.stop()


def _runnode(netns: Netns, array: Array, tmp_path: Path, join_token: str, port: int) -> Proc:
    args = netns.run(
        sys.executable,
        "manage.py",
        "runnode",
        "--join",
        array.plane.url,
        "--join-token",
        join_token,
        "--id",
        NODE,
        "--listen",
        f"{netns.node_ip}:{port}",
        "--model",
        str(bundled_model_path()),
        "--package",
        PACKAGE,
        "--threads",
        "1",
        "--sequences",
        "2",
        "--ctx-per-seq",
        "512",
        "--kv-unified",
        "on",
        "--speculate",
        "off",
        "--credential-file",
        str(tmp_path / "node" / "node.credential"),
    )
    # another host: its own home, and neither the array's secret nor a credential given
    env = {
        "PHALANX_HOME": str(tmp_path / "node"),
        "PHALANX_NODE_SECRET": "",
        "PHALANX_NODE_CREDENTIAL": "",
        "PHALANX_ARRAY_ID": "",
    }
    (tmp_path / "node").mkdir(exist_ok=True)
    return spawn(args, tmp_path / f"node-{time.monotonic_ns()}.log", env=env)


def _from_node(netns: Netns, url: str, credential: str) -> str:
    """The status of ``GET url`` made from inside the namespace (a node-to-control-plane call)."""
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"]
    auth = ["-H", f"Authorization: Bearer {credential}"]
    done = subprocess.run(netns.run(*curl, *auth, url), capture_output=True, text=True)
    return done.stdout.strip()


def _serves_through_the_control_plane(array: Array) -> None:
    """Up after a health-check round, validation waived, and a chat through ``/v1/``."""
    array.control_loop_round()  # up; its new agent instance is queued for validation
    reason = {"reason": "test: a namespace's node, no devices to validate"}
    assert array.api("post", f"/nodes/{NODE}/validation/waive", json=reason).is_success
    assert array.api("get", f"/nodes/{NODE}").json()["state"] == "up"
    chat = array.chat()
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"


def test_it_joins_from_another_namespace_with_a_token_then_is_revoked(
    netns, array, tmp_path
) -> None:
    minted = array.api("post", "/nodes/join-tokens", json={"ttl_s": 600, "note": "netns"})
    assert minted.status_code == 201, minted.text
    port = 9401
    node = _runnode(netns, array, tmp_path, minted.json()["token"], port)
    try:
        node_url = f"http://{netns.node_ip}:{port}"
        wait_healthy(node_url, node, timeout=90)
        credential_file = tmp_path / "node" / "node.credential"
        assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
        grant = parse_credential_file(credential_file.read_text())[0]
        shown = array.api("get", f"/nodes/{NODE}").json()
        assert shown["address"] == f"{netns.node_ip}:{port}" and shown["kind"] == "phalanx"
        # the node proves itself: its answer to a fresh challenge, under its own proof key
        challenge = {"Authorization": f"Bearer {grant.credential}", "X-Phalanx-Challenge": "c-1"}
        answer = httpx.get(f"{node_url}/metrics", headers=challenge)
        assert answer.status_code == 200
        assert answer.headers["X-Phalanx-Proof"] == proof_for(grant.proof_key, "c-1")
        _serves_through_the_control_plane(array)
        self_url = f"{array.plane.url}/api/nodes/self?node_id={NODE}"
        assert _from_node(netns, self_url, grant.credential) == "200"

        revoked = array.api("post", f"/nodes/{NODE}/revoke")
        assert revoked.status_code == 200 and revoked.json()["state"] == "down"
        refused = array.chat()
        assert refused.status_code == 503, refused.text  # out of routing at once
        assert _from_node(netns, self_url, grant.credential) == "401"
        wrong = httpx.get(f"{node_url}/metrics", headers={"Authorization": "Bearer phx2.other"})
        assert wrong.status_code == 401
        array.control_loop_round()  # the node refuses the control plane's new credential
        after = array.api("get", f"/nodes/{NODE}").json()
        assert after["state"] == "down" and "401" in after["last_probe_error"]
        again = _runnode(netns, array, tmp_path, "unused", port + 1)  # a restart: refused
        assert again.popen.wait(60) != 0 and "revoked" in again.log()
    finally:
        node.stop()
