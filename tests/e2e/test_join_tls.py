"""The control plane serving TLS itself (``manage.py serve --endpoint ssl:...``, daphne's TLS
endpoint) and a node joining over ``https://`` with the CA it is told to trust (``runnode
--join-ca``): docs/node-protocol.md, "TLS"."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nodes.agent.joining import JoinFailed, join_array
from tests.support.processes import Proc, free_port, migrated_with_token, spawn

pytestmark = pytest.mark.e2e


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=phalanx-test"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return key, cert


def test_a_node_joins_a_control_plane_that_serves_tls(tmp_path) -> None:
    key, cert = _self_signed(tmp_path)
    env = {"PHALANX_HOME": str(tmp_path), "DATABASE_URL": "", "REDIS_URL": ""}
    full = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    admin = migrated_with_token(full)
    port = free_port()
    endpoint = f"ssl:{port}:interface=127.0.0.1:privateKey={key}:certKey={cert}"
    args = [sys.executable, "manage.py", "serve", "--endpoint", endpoint]
    plane = spawn(args, tmp_path / "daphne.log", env=env)
    url = f"https://127.0.0.1:{port}"
    try:
        _wait_tls(url, cert, plane)
        minted = httpx.post(
            f"{url}/api/nodes/join-tokens",
            json={"ttl_s": 600},
            headers={"Authorization": f"Bearer {admin}"},
            verify=ssl.create_default_context(cafile=str(cert)),
        )
        assert minted.status_code == 201, minted.text
        token = minted.json()["token"]
        with pytest.raises(JoinFailed, match="could not reach"):  # an untrusted certificate
            join_array(url, token=token, node_id="tls-1", address="127.0.0.1:9")
        joined = join_array(
            url, token=token, node_id="tls-1", address="127.0.0.1:9", verify=str(cert)
        )
        assert joined.credential.startswith("phx2.") and joined.proof_key
    finally:
        plane.stop()


def _wait_tls(url: str, cert: Path, proc: Proc) -> None:
    trusted = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, proc.log()[-2000:]
        try:
            if httpx.get(f"{url}/health", verify=trusted, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not up: {proc.log()[-2000:]}")
