"""The credential a control plane presents to its nodes (``Authorization: Bearer <credential>``).

Each node has its own credential, derived from the array's node secret:
``phx1.`` + HMAC-SHA256(secret, node id), hex. The control plane holds only the secret and derives
every node's credential when it calls; a node holds only its own credential, so a node that is
taken over cannot call the others. The secret is ``$PHALANX_NODE_SECRET`` or, when that is unset,
the file ``$PHALANX_HOME/node-secret`` (made with 32 random bytes, mode 0600, at first use).
``manage.py nodecredential --id <node>`` prints a credential for provisioning a remote node;
docs/node-protocol.md says how to rotate.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from functools import lru_cache
from pathlib import Path

ENV_SECRET = "PHALANX_NODE_SECRET"
SECRET_FILE = "node-secret"
PREFIX = "phx1."


def credential_for(secret: str, node_id: str) -> str:
    """The credential of ``node_id`` under ``secret`` (pure; 69 characters)."""
    digest = hmac.new(secret.encode(), node_id.encode(), hashlib.sha256).hexdigest()
    return PREFIX + digest


def node_secret(home: Path | None = None) -> str:
    """The array's node secret: ``$PHALANX_NODE_SECRET``, else the secret file under ``home``
    (default ``settings.VAR_DIR``), created on first use. Raises ``OSError`` when the file can
    be neither read nor made."""
    value = os.environ.get(ENV_SECRET, "").strip()
    if value:
        return value
    if home is None:
        from django.conf import settings

        home = Path(settings.VAR_DIR)
    return _secret_file(home / SECRET_FILE)


@lru_cache(maxsize=8)
def _secret_file(path: Path) -> str:
    """The secret in ``path`` (read once per process: rotating it means a restart)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip()


@lru_cache(maxsize=1024)
def _cached(secret: str, node_id: str) -> str:
    return credential_for(secret, node_id)


def node_credential(node_id: str) -> str:
    """The credential the control plane presents to ``node_id`` (cached per secret)."""
    return _cached(node_secret(), node_id)


def array_id(secret: str | None = None) -> str:
    """This array's id (16 hex digits, derived from its node secret): each node reports it in
    ``/health``, so a control plane never takes another array's node on the same machine for
    one of its own."""
    secret = node_secret() if secret is None else secret
    return hashlib.sha256(f"phalanx array id:{secret}".encode()).hexdigest()[:16]


def node_auth_headers(node_id: str) -> dict[str, str]:
    """``{"Authorization": "Bearer <credential>"}`` for a call to ``node_id``."""
    return {"Authorization": f"Bearer {node_credential(node_id)}"}
