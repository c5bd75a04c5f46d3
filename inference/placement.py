"""A session is placed (or moved) exactly once, even by several control-plane replicas.

Each replica decides in memory and writes the routing table behind the request
(``inference.route_writer``), so two replicas that receive a session's first turns at the same
instant could each place it on another node, and the later write would win. With several
replicas (``REDIS_URL`` set: they share Redis) a replica *claims* a pin change before it sends
the request: ``SET phalanx:pin:<session>:<previous node> <node> NX PX`` in the shared cache
(``cache.add``, atomic in Redis). The first claim wins; every other replica that decided the
same change for the session reads the winner's node and sends its turn there. The key names the
node the session leaves (empty for a new session), so a later move of the same session is a new
claim; it lives ``CLAIM_TTL_S``, far longer than a route takes to be written, and then the
routing table itself says where the session is.

One replica (the embedded default, no ``REDIS_URL``) needs no claim: its decisions are
serialised on its event loop and its ledger (``route_writer``), so this costs it nothing. A
claim that cannot reach Redis is logged and the replica goes on with its own decision (the
routing table's last write wins, as with no claim): placement keeps working while Redis is
down.
"""

from __future__ import annotations

import hashlib
import logging

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

CLAIM_TTL_S = 60


def replicas_share_placements() -> bool:
    """True when several control-plane replicas may decide for one session (``REDIS_URL``)."""
    return bool(getattr(settings, "REDIS_URL", None))


def _key(session_id: str, previous: str | None) -> str:
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:32]
    return f"phalanx:pin:{digest}:{previous or ''}"


def claim_pin(*, session_id: str, previous: str | None, node_id: str) -> str:
    """Claim the pin change of ``session_id`` from ``previous`` (None: a new session) to
    ``node_id``; returns the node that won: ``node_id``, or the node another replica claimed
    first for the same change (send the turn there). Blocks for one Redis round trip."""
    key = _key(session_id, previous)
    try:
        if cache.add(key, node_id, CLAIM_TTL_S):
            return node_id
        return str(cache.get(key) or node_id)
    except Exception:  # Redis down: placement goes on, the table's last write wins
        log.warning("placement claim for a session failed; going on unclaimed", exc_info=True)
        return node_id
