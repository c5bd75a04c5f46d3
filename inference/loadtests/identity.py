"""Proof that a load test's target is this control plane, before it is given a credential.

A run with no token of its own gets one the worker mints (``jobs.Worker``). That token goes only
to a process that proves it is this array's control plane, never to whatever answers on a
loopback port. The proof is a challenge-response over ``GET /health?challenge=<nonce>``:

- the worker sends a fresh random nonce (32 hex digits) and no credential;
- the control plane answers ``{"status": "ok", "identity": {"pid": P, "proof": H}}`` with
  ``H = HMAC-SHA256(key, "phalanx control plane|<nonce>|<ip>|<port>|<pid>")``, where ``ip`` and
  ``port`` are the local address of the socket the request arrived on (the ASGI ``server``) and
  ``key`` is derived from the array's node secret (``nodes.credentials.node_secret``: only the
  processes this array started share it);
- the worker computes the same from the address it actually connected to and compares.

Binding the address defeats a relay: a stranger on ``127.0.0.1:18799`` that forwards the nonce
to the real control plane gets a proof for the control plane's own port, which does not match
the one the worker connected to. Binding the pid lets the profiler attach to the control plane
it proved (``attested_pid``), never to a process found by its port. The key is not the node
secret itself nor any node's credential (``sha256`` of the secret under its own prefix), so
answering challenges leaks neither.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from dataclasses import dataclass

import httpx

CHALLENGE = re.compile(r"^[0-9a-f]{32,64}$")
TIMEOUT_S = 5.0


class NotThisControlPlane(Exception):
    """The target did not prove it is this control plane; the message says why."""


@dataclass(frozen=True)
class Proven:
    """A target that proved it is this control plane: its pid and the address it answered on."""

    pid: int
    address: tuple[str, int]

    def pinned(self, url: str) -> str:
        """``url`` with its host and port replaced by the address that proved itself
        (``http://localhost:8000/x`` -> ``http://127.0.0.1:8000/x``): a later connection goes
        where the proof came from, not wherever the name resolves then."""
        from urllib.parse import urlsplit, urlunsplit

        host, port = self.address
        shown = f"[{host}]" if ":" in host else host
        return urlunsplit(urlsplit(url)._replace(netloc=f"{shown}:{port}"))


def _key(secret: str) -> bytes:
    return hashlib.sha256(f"phalanx control-plane identity key:{secret}".encode()).digest()


def _ip(host: str) -> str:
    """``host`` as one canonical text (an IPv4-mapped IPv6 address as its IPv4 form)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def proof(secret: str, *, nonce: str, host: str, port: int, pid: int) -> str:
    """The proof (64 hex digits) for ``nonce`` answered on ``host:port`` by process ``pid``."""
    message = f"phalanx control plane|{nonce}|{_ip(host)}|{int(port)}|{int(pid)}"
    return hmac.new(_key(secret), message.encode(), hashlib.sha256).hexdigest()


def answer(nonce: str, *, host: str, port: int) -> dict | None:
    """What this control plane adds to ``/health`` for ``?challenge=nonce`` received on
    ``host:port``: ``{"pid", "proof"}``; None for a nonce of another shape (32 to 64 lower-case
    hex digits) or when the node secret cannot be read."""
    if not CHALLENGE.match(nonce or ""):
        return None
    from nodes.credentials import node_secret

    try:
        secret = node_secret()
    except OSError:
        return None
    pid = os.getpid()
    return {"pid": pid, "proof": proof(secret, nonce=nonce, host=host, port=port, pid=pid)}


def prove(url: str, *, secret: str | None = None, timeout: float = TIMEOUT_S) -> Proven:
    """Check that ``url`` (a base URL) is this control plane: send a fresh challenge to its
    ``/health`` (no credential, no proxy, no redirect) and check the proof against the address
    the connection really went to. Returns ``Proven``; raises ``NotThisControlPlane`` saying
    why (no answer, no proof, a wrong proof)."""
    if secret is None:
        from nodes.credentials import node_secret

        secret = node_secret()
    nonce = secrets.token_hex(16)
    try:
        with httpx.Client(timeout=timeout, trust_env=False, follow_redirects=False) as client:
            with client.stream("GET", f"{url}/health", params={"challenge": nonce}) as response:
                peer = response.extensions["network_stream"].get_extra_info("server_addr")
                response.read()
    except httpx.HTTPError as exc:
        raise NotThisControlPlane(f"{url}/health did not answer ({type(exc).__name__})") from exc
    try:
        said = response.json()["identity"]
        pid, given = int(said["pid"]), str(said["proof"])
    except (ValueError, KeyError, TypeError):
        raise NotThisControlPlane(
            f"{url}/health gave no proof that it is this control plane (HTTP "
            f"{response.status_code})"
        ) from None
    if not peer:
        raise NotThisControlPlane(f"{url}: the address it answered on is unknown")
    host, port = str(peer[0]), int(peer[1])
    wanted = proof(secret, nonce=nonce, host=host, port=port, pid=pid)
    if not hmac.compare_digest(wanted, given):
        raise NotThisControlPlane(
            f"{url}/health answered with a proof that does not match this array's secret for "
            f"{_ip(host)}:{port}"
        )
    return Proven(pid=pid, address=(_ip(host), port))


async def aprove(url: str, *, secret: str | None = None) -> Proven:
    """``prove`` off the event loop (it blocks on one short HTTP request)."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, lambda: prove(url, secret=secret))
