"""The node agent's side of joining (``runnode --join``): register with the control plane with
a one-time join token, keep the credential received, and check at a restart that it still
holds. The control plane's side is ``nodes.joining``; docs/node-protocol.md."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from nodes.agent.auth import parse_credential_file

ENV_JOIN_TOKEN = "PHALANX_JOIN_TOKEN"


class JoinFailed(Exception):
    """The control plane refused the join or could not be reached; the message says why (the
    control plane's own words when it answered)."""


@dataclass(frozen=True)
class Joined:
    """What a join gave the node: its ``credential``, ``proof_key`` and ``array_id``."""

    credential: str
    proof_key: str
    array_id: str


def join_array(
    control_plane: str,
    *,
    token: str,
    node_id: str,
    address: str,
    package: str | None = None,
    timeout: float = 30.0,
    verify: ssl.SSLContext | bool = True,
) -> Joined:
    """``POST <control_plane>/api/nodes/join``; returns what the node received. ``verify``: an
    SSL context trusting the CA of an ``https://`` control plane whose certificate the system's CAs do
    not sign. Raises ``JoinFailed`` (refused: the control plane's message and status; or
    unreachable, a certificate refused)."""
    body: dict[str, Any] = {"join_token": token, "node_id": node_id, "address": address}
    if package:
        body["package"] = package
    url = control_plane.rstrip("/") + "/api/nodes/join"
    try:
        response = httpx.post(url, json=body, timeout=timeout, trust_env=False, verify=verify)
    except httpx.HTTPError as exc:
        raise JoinFailed(f"could not reach the control plane at {url}: {exc}") from exc
    if response.status_code != 201:
        raise JoinFailed(f"the control plane refused the join ({_said(response)})")
    data = response.json()
    return Joined(data["credential"], data["proof_key"], data.get("array_id", ""))


def still_registered(
    control_plane: str, *, node_id: str, credential: str, verify: ssl.SSLContext | bool = True
) -> str:
    """Ask the control plane whether ``credential`` is still ``node_id``'s: "" when it is,
    else why not (revoked: the control plane answered 401). Unreachable counts as yes (the
    node serves; the control plane checks it on every call anyway)."""
    url = control_plane.rstrip("/") + "/api/nodes/self"
    try:
        response = httpx.get(
            url,
            params={"node_id": node_id},
            headers={"Authorization": f"Bearer {credential}"},
            timeout=10.0,
            trust_env=False,
            verify=verify,
        )
    except httpx.HTTPError:
        return ""
    return "" if response.status_code == 200 else _said(response)


def _said(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return f"{response.status_code}: {detail or response.text[:200]}"


def write_credential_file(path: Path, joined: Joined) -> None:
    """Write ``<credential> <proof key>`` to ``path`` (mode 0600, replaced in one step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("# written by runnode --join: this node's credential and proof key\n")
        handle.write(f"{joined.credential} {joined.proof_key}\n")
        if joined.array_id:
            handle.write(f"# array {joined.array_id}\n")
    os.chmod(partial, 0o600)
    partial.replace(path)


def credential_in_file(path: Path) -> str:
    """The first credential in ``path`` ("" when there is none or no file)."""
    try:
        grants = parse_credential_file(path.read_text())
    except OSError:
        return ""
    return grants[0].credential if grants else ""


def array_in_file(path: Path) -> str:
    """The array id ``write_credential_file`` noted in ``path`` ("" when none)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    return next((ln.split()[-1] for ln in lines if ln.startswith("# array ")), "")
