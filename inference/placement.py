"""A session is placed (or moved) exactly once, even by several control-plane replicas.

Each replica decides in memory and writes the routing table behind the request
(``inference.route_writer``), so two replicas that receive a session's first turns at the same
instant could each place it on another node, and the later write would win. With several
replicas (``REDIS_URL`` set: they share Redis) a replica *claims* a pin change before it sends
the request: ``SET phalanx:pin:<session>:<pin version> <node> NX EX`` in the shared cache
(``cache.add``, atomic in Redis). The first claim wins; every other replica that decided a
change from the same pin reads the winner's node and makes the same change onto it (the proxy
plans again with every other node kept out, so whichever replica writes first records the same
placement or move). The pin version is the session's route as both replicas read it (its node
and when it was last seen; ``new`` for a session never seen), so any later change of the same
session is a claim of its own; a claim lives ``CLAIM_TTL_S``, far longer than a route takes to
be written.

One replica (the embedded default, no ``REDIS_URL``) needs no claim: its decisions are
serialised on its event loop and its ledger (``route_writer``), so this costs it nothing. A
claim that cannot reach Redis is logged and the replica goes on with its own decision (the
routing table's last write wins, as with no claim): placement keeps working while Redis is
down; after a failure no claim is tried for ``RETRY_AFTER_FAILURE_S`` (the cache's Redis
client gives up after ``console.settings``' socket timeouts, well under a second).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

CLAIM_TTL_S = 30
RETRY_AFTER_FAILURE_S = 5.0
_failed_at = [float("-inf")]  # when a claim last could not reach Redis (time.monotonic())


def replicas_share_placements() -> bool:
    """True when several control-plane replicas may decide for one session (``REDIS_URL``)."""
    return bool(getattr(settings, "REDIS_URL", None))


def pin_version(row: Any) -> str:
    """What a claim is about: the session's route as read (a ``services.RouteRow``: its node and
    when it was last seen), ``new`` for a session with no route."""
    if row is None:
        return "new"
    return f"{row.node_id or '-'}@{row.last_seen_at.timestamp():.6f}"


def _key(session_id: str, pin: str) -> str:
    digest = hashlib.sha256(f"{session_id}\n{pin}".encode()).hexdigest()[:40]
    return f"phalanx:pin:{digest}"


def claim_pin(*, session_id: str, pin: str, node_id: str) -> str:
    """Claim the change of ``session_id``'s pin from ``pin`` (``pin_version``) to
    ``node_id``; returns the node that won: ``node_id``, or the node another replica claimed
    first for a change from the same pin (send the turn there). Blocks for one Redis round
    trip (none for ``RETRY_AFTER_FAILURE_S`` after Redis failed)."""
    if time.monotonic() - _failed_at[0] < RETRY_AFTER_FAILURE_S:
        return node_id
    key = _key(session_id, pin)
    try:
        if cache.add(key, node_id, CLAIM_TTL_S):
            return node_id
        return str(cache.get(key) or node_id)
    except Exception as exc:  # Redis down: placement goes on, the table's last write wins
        _failed_at[0] = time.monotonic()
        log.warning("placement claims skipped for %.0f s: %s", RETRY_AFTER_FAILURE_S, exc)
        return node_id
