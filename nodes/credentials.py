"""The credentials a control plane and its nodes authenticate each other with.

**The control plane to a node** (``Authorization: Bearer <credential>``). Each node has its own
credential, derived from the array's node secret and the node's *credential epoch*
(``Node.credential_epoch``): for the epoch ``""`` (nodes provisioned with ``manage.py
nodecredential`` or started by the embedded array) ``phx1.`` + HMAC-SHA256(secret, node id),
hex; for any other epoch (a node that joined with a join token, or whose credential was revoked)
``phx2.`` + HMAC-SHA256(secret, "credential\\n<node id>\\n<epoch>"). Revoking a node's
credential gives it a new random epoch, so the old credential is neither presented nor accepted
again (``nodes.joining``). The secret is ``$PHALANX_NODE_SECRET`` or, when that is unset, the
file ``$PHALANX_HOME/node-secret`` (made with 32 random bytes, mode 0600, at first use).

**A node back to the control plane** (mutual authentication). Each node and epoch also has a
*proof key*, HMAC-SHA256(secret, "proof\\n<node id>\\n<epoch>"), which the control plane derives
and the node keeps but is never sent on a call. Every call carries a fresh random
``X-Phalanx-Challenge``; the node answers ``X-Phalanx-Proof: HMAC-SHA256(proof key,
"phalanx proof\\n" + challenge)``, which ``nodes.client`` checks: a node cannot answer it by
echoing anything it was sent. The proof is required of nodes with an epoch (joined nodes, which
receive their proof key when they join); of epoch-``""`` nodes a wrong proof is refused, a
missing one tolerated (they may have been given only a credential). docs/node-protocol.md.

Epochs are read from the inventory at most every ``EPOCH_TTL_S`` seconds per process, and fed
for free by routing's own read of the node table (``remember_epochs``), so presenting a
credential costs no database query on the proxy's hot path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ENV_SECRET = "PHALANX_NODE_SECRET"
SECRET_FILE = "node-secret"
PREFIX = "phx1."
PREFIX_EPOCH = "phx2."
CHALLENGE_HEADER = "X-Phalanx-Challenge"
PROOF_HEADER = "X-Phalanx-Proof"
EPOCH_TTL_S = 5.0
MAX_CHALLENGE = 128  # characters; a node ignores a longer challenge


def credential_for(secret: str, node_id: str, epoch: str = "") -> str:
    """The credential of ``node_id`` at ``epoch`` under ``secret`` (pure; 69 characters)."""
    if not epoch:
        digest = hmac.new(secret.encode(), node_id.encode(), hashlib.sha256).hexdigest()
        return PREFIX + digest
    message = f"credential\n{node_id}\n{epoch}".encode()
    return PREFIX_EPOCH + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def proof_key_for(secret: str, node_id: str, epoch: str = "") -> str:
    """The key ``node_id`` proves itself with at ``epoch`` (pure; 64 hex digits)."""
    message = f"proof\n{node_id}\n{epoch}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def proof_for(proof_key: str, challenge: str) -> str:
    """The ``X-Phalanx-Proof`` answering ``challenge`` with ``proof_key`` (64 hex digits)."""
    message = f"phalanx proof\n{challenge}".encode()
    return hmac.new(proof_key.encode(), message, hashlib.sha256).hexdigest()


def new_epoch() -> str:
    """A fresh random credential epoch (16 hex digits): never one a node held before, even
    after its row was deleted and made again."""
    return secrets.token_hex(8)


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


def array_id(secret: str | None = None) -> str:
    """This array's id (16 hex digits, derived from its node secret): each node reports it in
    ``/health``, so a control plane never takes another array's node on the same machine for
    one of its own."""
    secret = node_secret() if secret is None else secret
    return hashlib.sha256(f"phalanx array id:{secret}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class NodeKeys:
    """What the control plane holds for one node at its current epoch: the ``credential`` it
    presents, the ``proof_key`` the node answers with, and whether a proof is required."""

    node_id: str
    epoch: str
    credential: str
    proof_key: str
    proof_required: bool


# node id -> (monotonic expiry, epoch, proof required); credential -> its keys (for the proof)
_epochs: dict[str, tuple[float, str, bool]] = {}
_by_credential: dict[str, NodeKeys] = {}
_lock = threading.Lock()


_fed = {"until": 0.0}  # routing's reads are taken at most every FEED_EVERY_S
FEED_EVERY_S = 1.0


def remember_epochs(rows: Iterable[tuple[str, str, str]]) -> None:
    """Note ``(node id, epoch, kind)`` of nodes just read from the inventory (routing's read
    of the node table calls this on every decision: the epochs stay fresh without a query of
    their own). ``rows`` is consumed at most every ``FEED_EVERY_S`` seconds."""
    now = time.monotonic()
    if now < _fed["until"]:
        return
    expires = now + EPOCH_TTL_S
    with _lock:
        _fed["until"] = now + FEED_EVERY_S
        for node_id, epoch, kind in rows:
            _epochs[node_id] = (expires, epoch or "", bool(epoch) and kind != "external")


def forget_epochs(node_id: str | None = None) -> None:
    """Drop the cached epoch of ``node_id`` (every node's when None): read again next time."""
    with _lock:
        _fed["until"] = 0.0
        if node_id is None:
            _epochs.clear()
        else:
            _epochs.pop(node_id, None)


def _load_epochs() -> bool:
    """Read every node's epoch (one query); False when the inventory cannot be read here (no
    database: a test process, a remote host), in which case epoch ``""`` is used uncached."""
    try:
        from nodes.models import Node

        rows = list(Node.objects.values_list("node_id", "credential_epoch", "kind"))
    except Exception:  # no database here: the legacy derivation, not remembered
        return False
    forget_epochs()
    remember_epochs(rows)
    return True


def _load_epochs_off_loop() -> bool:
    """``_load_epochs`` on a thread of its own, closing the connection it opened."""
    from django.db import connections

    try:
        return _load_epochs()
    finally:
        connections.close_all()


def _epoch(node_id: str) -> tuple[str, bool]:
    entry = _epochs.get(node_id)
    if entry is not None and entry[0] > time.monotonic():
        return entry[1], entry[2]
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loaded = _load_epochs()
    else:  # on an event loop (rare: routing's read feeds the cache): a thread reads
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            loaded = pool.submit(_load_epochs_off_loop).result()
    entry = _epochs.get(node_id)
    if loaded and entry is not None:
        return entry[1], entry[2]
    return "", False


def node_keys(node_id: str) -> NodeKeys:
    """``node_id``'s keys at its current epoch (an unknown node: epoch ``""``)."""
    epoch, required = _epoch(node_id)
    keys = _keys(node_secret(), node_id, epoch, required)
    if keys.credential not in _by_credential:
        with _lock:
            if len(_by_credential) > 4096:
                _by_credential.clear()
            _by_credential[keys.credential] = keys
    return keys


@lru_cache(maxsize=4096)
def _keys(secret: str, node_id: str, epoch: str, required: bool) -> NodeKeys:
    return NodeKeys(
        node_id,
        epoch,
        credential_for(secret, node_id, epoch),
        proof_key_for(secret, node_id, epoch),
        required,
    )


def node_credential(node_id: str) -> str:
    """The credential the control plane presents to ``node_id`` now."""
    return node_keys(node_id).credential


def node_auth_headers(node_id: str) -> dict[str, str]:
    """``{"Authorization": "Bearer <credential>", "X-Phalanx-Challenge": <32 hex>}`` for one
    call to ``node_id`` (a fresh challenge each time: ``nodes.client`` checks the answer)."""
    return {
        "Authorization": f"Bearer {node_credential(node_id)}",
        CHALLENGE_HEADER: secrets.token_hex(16),
    }


def proof_problem(
    authorization: str | None, challenge: str | None, status: int, proof: str | None
) -> str:
    """Why an answer to a call made with ``node_auth_headers`` does not prove the node it went
    to ("" when it does, or when no proof is owed: no challenge, a credential this process did
    not present, a 401, an epoch-``""`` node that sends none)."""
    _scheme, _, credential = (authorization or "").partition(" ")
    keys = _by_credential.get(credential.strip())
    if not challenge or keys is None or status == 401:
        return ""
    if not proof:
        if not keys.proof_required:
            return ""
        return (
            f"node {keys.node_id!r} sent no {PROOF_HEADER}: it cannot prove it is the node that "
            "joined this array (not the node, or an agent too old for joined nodes)"
        )
    expected = proof_for(keys.proof_key, challenge)
    if hmac.compare_digest(expected.encode(), proof.strip().encode()):
        return ""
    return (
        f"node {keys.node_id!r} answered with a wrong {PROOF_HEADER}: it is not the node this "
        "array registered (or holds a revoked credential)"
    )
