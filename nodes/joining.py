"""Nodes that join from other hosts: one-time join tokens, the credential a joined node
receives, revoking it, and checking a credential a node presents to the control plane.

A join token (``nodes.models.NodeJoinToken``) is minted by an admin (console or REST API), shown
once, and kept only as its SHA-256. A node agent started with ``runnode --join <url>
--join-token <token>`` posts it to ``/api/nodes/join``; the control plane registers the node
(``console.services.node_join``) with a fresh random credential epoch and answers its
``JoinGrant``: the credential the control plane will present, the proof key the node answers
with (``nodes.credentials``), and the array id. Revoking (``node_credential_revoke``) gives the
node a new epoch, marks it down at once (routing reads the state on every decision, on every
replica) and records it; the node still holds the old credential, which the control plane
neither presents nor accepts any more. docs/node-protocol.md, "Joining from another host".
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from console.lib.audit import acting_as, audit_record, diff
from console.lib.errors import ConsoleError, Invalid, NotFound
from nodes.credentials import (
    array_id,
    credential_for,
    forget_epochs,
    new_epoch,
    node_secret,
    proof_key_for,
)
from nodes.live import live_node_changed
from nodes.models import Node, NodeEvent, NodeJoinToken

TOKEN_PREFIX = "phxj_"
DEFAULT_TTL_S = 3600
MAX_TTL_S = 7 * 24 * 3600


class JoinTokenRefused(ConsoleError):
    """A join token that cannot be used: unknown (401 ``join_token_invalid``), expired (403
    ``join_token_expired``) or already used (403 ``join_token_used``)."""

    def __init__(self, message: str, *, code: str, status: int = 403) -> None:
        super().__init__(message, code=code, field="join_token")
        self.status = status


@dataclass(frozen=True)
class JoinGrant:
    """What a node receives when it joins: the ``credential`` the control plane presents to it,
    its ``proof_key``, its ``epoch`` and the ``array_id`` it reports in ``/health``."""

    node_id: str
    credential: str
    proof_key: str
    epoch: str
    array_id: str


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.strip().encode()).hexdigest()


@transaction.atomic
def join_token_mint(
    *, ttl_s: int = DEFAULT_TTL_S, by: str, note: str = ""
) -> tuple[NodeJoinToken, str]:
    """A new join token valid for ``ttl_s`` seconds (1 to 7 days' worth); returns the row and
    the plaintext (``phxj_`` + 43 characters), which is not kept. Audited as
    ``node.join_token_mint``. Raises ``Invalid`` (field ``ttl_s``)."""
    if not 60 <= ttl_s <= MAX_TTL_S:
        raise Invalid(f"ttl_s: between 60 and {MAX_TTL_S} seconds.", field="ttl_s")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = NodeJoinToken.objects.create(
        token_hash=_hash(raw),
        prefix=raw[:10],
        note=note[:200],
        created_by=by[:150],
        expires_at=timezone.now() + timedelta(seconds=ttl_s),
    )
    with acting_as(by):
        audit_record(
            action="node.join_token_mint",
            target=row.prefix,
            changes=[f"expires_at: {row.expires_at.isoformat(timespec='seconds')}"],
        )
    return row, raw


def join_token_take(*, raw: str) -> NodeJoinToken:
    """The unused, unexpired token ``raw``, claimed (``used_at`` set) in the caller's
    transaction (call inside one: a rollback leaves it unused). Raises ``JoinTokenRefused``
    saying why it cannot be used."""
    row = join_token_check(raw=raw, lock=True)
    # claimed by a conditional write, so two joins racing with one token cannot both pass even
    # where SELECT ... FOR UPDATE locks nothing (SQLite); the caller's rollback releases it
    if not NodeJoinToken.objects.filter(pk=row.pk, used_at__isnull=True).update(
        used_at=timezone.now()
    ):
        raise JoinTokenRefused(
            "join_token: already used (by a join at the same moment).", code="join_token_used"
        )
    return row


def join_token_check(*, raw: str, lock: bool = False) -> NodeJoinToken:
    """The token ``raw`` when it is unused and unexpired (not claimed: the join endpoint checks
    it before reading anything else of the body, so a wrong token learns nothing of the
    array). Raises ``JoinTokenRefused`` saying why it cannot be used."""
    rows = NodeJoinToken.objects.select_for_update() if lock else NodeJoinToken.objects
    row = rows.filter(token_hash=_hash(raw or "")).first()
    if row is None:
        raise JoinTokenRefused(
            "join_token: not a join token of this array (mint one on the Nodes page or with "
            "POST /api/nodes/join-tokens).",
            code="join_token_invalid",
            status=401,
        )
    if row.used_at is not None:
        raise JoinTokenRefused(
            f"join_token: already used at {row.used_at.isoformat(timespec='seconds')} "
            f"(by node {row.joined_node_id!r}); a join token is good for one join.",
            code="join_token_used",
        )
    if row.expires_at <= timezone.now():
        raise JoinTokenRefused(
            f"join_token: expired at {row.expires_at.isoformat(timespec='seconds')}; mint a "
            "new one.",
            code="join_token_expired",
        )
    return row


def join_complete(*, token: NodeJoinToken, node: Node) -> JoinGrant:
    """Spend ``token`` on the newly registered ``node``: give the node a fresh epoch, record a
    ``joined`` event and audit ``node.join``; returns its ``JoinGrant``. Call inside the
    transaction that took the token and made the node."""
    node.credential_epoch = new_epoch()
    node.save(update_fields=["credential_epoch", "updated_at"])
    token.used_at = timezone.now()
    token.node = node
    token.joined_node_id = node.node_id
    token.save(update_fields=["used_at", "node", "joined_node_id"])
    event = NodeEvent.objects.create(
        node=node,
        kind=NodeEvent.Kind.JOINED,
        message=f"joined from {node.address} with join token {token.prefix}…",
        actor=f"join token {token.prefix}",
    )
    live_node_changed(node_id=node.node_id, event=event)
    with acting_as(f"join token {token.prefix}"):
        audit_record(action="node.join", target=node.node_id, changes=[f"address: {node.address}"])
    forget_epochs(node.node_id)
    return join_grant(node)


def join_grant(node: Node) -> JoinGrant:
    """The keys ``node`` holds at its current epoch."""
    secret = node_secret()
    epoch = node.credential_epoch
    return JoinGrant(
        node_id=node.node_id,
        credential=credential_for(secret, node.node_id, epoch),
        proof_key=proof_key_for(secret, node.node_id, epoch),
        epoch=epoch,
        array_id=array_id(secret),
    )


@transaction.atomic
def node_credential_revoke(*, node_id: str, by: str) -> NodeEvent:
    """Revoke ``node_id``'s credential: a new random epoch (the old credential is neither
    presented nor accepted any more), state ``down`` at once (routing on every replica reads it
    on its next decision), a ``revoked`` event and a ``node.revoke_credential`` audit entry.
    The node serves again only once given the new keys (join again: remove it, mint a token).
    Raises ``NotFound``."""
    node = Node.objects.select_for_update().filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", code="node_not_found")
    before = {"state": node.state, "credential_epoch": node.credential_epoch or "(derived)"}
    node.credential_epoch = new_epoch()
    node.state = Node.State.DOWN
    node.last_seen_load = None
    node.consecutive_successes = 0
    node.save()
    event = NodeEvent.objects.create(
        node=node,
        kind=NodeEvent.Kind.REVOKED,
        message=f"credential revoked by {by}: the node is refused until it joins again",
        actor=by[:150],
    )
    with acting_as(by):
        after = {"state": node.state, "credential_epoch": node.credential_epoch}
        audit_record(action="node.revoke_credential", target=node_id, changes=diff(before, after))
    forget_epochs(node_id)
    transaction.on_commit(lambda: forget_epochs(node_id))
    live_node_changed(node_id=node_id, event=event)
    return event


def node_presents_own_credential(*, node_id: str, authorization: str | None) -> Node | None:
    """The node ``node_id`` when ``authorization`` (``Bearer <credential>``) is its credential
    at its current epoch (read now: a revoked credential is refused at once); else None."""
    scheme, _, presented = (authorization or "").partition(" ")
    node = Node.objects.filter(node_id=node_id).first()
    if node is None or scheme.lower() != "bearer":
        return None
    expected = credential_for(node_secret(), node_id, node.credential_epoch)
    return node if hmac.compare_digest(expected.encode(), presented.strip().encode()) else None


def join_command(base_url: str, token: str) -> str:
    """The ``runnode --join`` command line an operator runs on the new node's host, with the
    parts only they know in capitals (``NODE_ID``, ``THIS_HOST``, ``MODEL.gguf``). The token
    goes in ``$PHALANX_JOIN_TOKEN``, not on the command line, where ``ps`` shows it to every
    user of the host."""
    return (
        f"PHALANX_JOIN_TOKEN={token} python manage.py runnode --join {base_url} --id NODE_ID "
        "--listen 0.0.0.0:9401 --advertise THIS_HOST:9401 --model MODEL.gguf "
        "--credential-file var/node.credential"
    )


def join_tokens_recent(limit: int = 20) -> list[NodeJoinToken]:
    """The last ``limit`` join tokens, newest first (no plaintext: it is never kept)."""
    return list(NodeJoinToken.objects.select_related("node")[:limit])
