"""Cached reads for the proxy's hot path: API token -> caller, model -> client-facing name, routing policy,
sessions pinned per node.

Every request through ``/v1/`` and every websocket turn needs all three; read from the database
each time they cost about 2 ms of time to first token on SQLite. Here each answer is kept
``TTL_S`` seconds in this process. Saving or deleting a token, package or the policy in this
process (console, REST API, ``applyconfig``) clears the cache at once, through model signals.
With several control-plane replicas (``REDIS_URL``) the signal also bumps a generation number
in Redis, which every replica reads at most every ``GENERATION_CHECK_S``: a token revoked on
one replica is refused by all within a second. Another process without Redis (a CLI command
on the embedded array) is seen within ``TTL_S``. A failed lookup (unknown token, unknown
model) is never cached. An answer used in the second half of its ``TTL_S`` is read again in
the background (refresh-ahead), so under steady traffic no request waits for an expired one;
an answer is still never older than its TTL.

The cached ``RoutingPolicy`` is shared by concurrent requests: read it, never change it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from console.lib.bare_http import db_thread
from inference import model_names, node_table, tokens
from inference.models import ApiToken, ModelPackage, Quota, RoutingPolicy
from inference.node_table import PinnedCounts
from inference.usage.quotas import Caller

log = logging.getLogger(__name__)

TTL_S = 10.0
REFRESH_AHEAD = 0.5  # past this share of its TTL, a hit also reads the answer again
PINNED_TTL_S = 5.0  # <= route_writer.KEEP_DONE_S: the ledger covers what the counts miss

T = TypeVar("T")

GENERATION_CHECK_S = 1.0
GENERATION_KEY = "phalanx:lookups:generation"

_entries: dict[tuple[str, str], tuple[float, Any]] = {}
_lock = threading.Lock()
_shared = {"generation": None, "checked_at": 0.0}  # the replicas' generation, as last read
_local = {"generation": 0}  # bumped by every clear: a read begun before it is not kept
_refreshing: dict[tuple[str, str], asyncio.Future[None]] = {}  # background reads under way


def _shared_generation_moved(now: float) -> bool:
    """True when another replica cleared its cache since this process last looked (read from
    Redis at most every ``GENERATION_CHECK_S``; never without ``REDIS_URL``)."""
    if not settings.REDIS_URL or now - _shared["checked_at"] < GENERATION_CHECK_S:
        return False
    _shared["checked_at"] = now
    try:
        generation = cache.get(GENERATION_KEY)
    except Exception:  # Redis down: entries age out by their TTL as without it
        return False
    moved = generation != _shared["generation"]
    _shared["generation"] = generation
    return moved


def _cached(kind: str, key: str, load: Callable[[], T], ttl_s: float = TTL_S) -> T:
    now = time.monotonic()
    if _shared_generation_moved(now):
        _forget()
    entry = _entries.get((kind, key))
    if entry is not None and entry[0] > now:
        return entry[1]
    return _load(kind, key, load, ttl_s)


def _load(kind: str, key: str, load: Callable[[], T], ttl_s: float) -> T:
    """Read an answer and keep it ``ttl_s`` seconds, unless the cache was cleared while it
    was read (the answer may predate the change that cleared it)."""
    generation, started = _local["generation"], time.monotonic()
    value = load()
    with _lock:
        if _local["generation"] == generation:
            _entries[(kind, key)] = (started + ttl_s, value)
    return value


async def _acached(kind: str, key: str, load: Callable[[], T], ttl_s: float = TTL_S) -> T:
    """``_cached`` for the event loop: a hit costs no thread hop, a miss reads in a DB thread.
    A hit in the last ``1 - REFRESH_AHEAD`` of its time also starts a background read, so a
    steady caller never waits for an expired answer (it is never served older than ``ttl_s``
    either way)."""
    now = time.monotonic()
    if _shared_generation_moved(now):  # one Redis read a second at most, on the loop
        _forget()
    entry = _entries.get((kind, key))
    if entry is None or entry[0] <= now:
        return await db_thread(_load)(kind, key, load, ttl_s)
    if entry[0] - now < ttl_s * (1 - REFRESH_AHEAD) and (kind, key) not in _refreshing:
        _refreshing[(kind, key)] = asyncio.ensure_future(_refresh(kind, key, load, ttl_s))
    return entry[1]


async def _refresh(kind: str, key: str, load: Callable[[], Any], ttl_s: float) -> None:
    """Read an answer again ahead of its expiry; one that now fails (a token revoked, a
    package gone) is forgotten, so the next request reads it and gets the error."""
    generation = _local["generation"]
    try:
        await db_thread(_load)(kind, key, load, ttl_s)
    except Exception:
        with _lock:
            if _local["generation"] == generation:  # not an entry read after a clear
                _entries.pop((kind, key), None)
    finally:
        if _local["generation"] == generation:  # a clear forgot this read: leave the new one
            _refreshing.pop((kind, key), None)


def _forget() -> None:
    with _lock:
        _entries.clear()
        _refreshing.clear()  # a read under way is not kept (the generation moved)
        _local["generation"] += 1


def clear(*_args: Any, **_kwargs: Any) -> None:
    """Forget every cached answer (signal receiver; tests), and tell the other replicas to
    forget theirs (a new generation in Redis, when ``REDIS_URL`` is set)."""
    _forget()
    if settings.REDIS_URL:  # once the change is committed, or another replica reloads the old
        transaction.on_commit(_new_generation)


def _new_generation() -> None:
    """A fresh random generation (a counter would repeat after Redis restarts empty)."""
    try:
        cache.set(GENERATION_KEY, secrets.token_hex(8), None)
    except Exception as exc:
        log.warning("could not tell the other replicas to clear their lookups: %s", exc)


def _token(raw: str) -> tuple[str, str, Callable[[], Caller]]:
    """Cache kind, key (the token's hash) and loader of a token lookup."""
    key = hashlib.sha256(raw.encode()).hexdigest()
    return "token", key, lambda: tokens.token_caller(raw=raw)


def _model_lookup(model: str) -> tuple[str, str, Callable[[], str]]:
    return "model", model, lambda: model_names.model_resolve(model=model)


def caller_for_token(raw: str | None) -> Caller:
    """``tokens.token_caller`` (whom the request counts against, with its limits), cached by
    the token's hash (a missing token raises ``AuthError`` without a lookup)."""
    return _cached(*_token(raw)) if raw else tokens.token_caller(raw=raw)


async def acaller_for_token(raw: str | None) -> Caller:
    """``caller_for_token`` for async callers."""
    return await _acached(*_token(raw)) if raw else tokens.token_caller(raw=raw)


def caller_for_user(username: str, role: str) -> Caller:
    """A console user's ``Caller`` (``user:<name>``, the role's default limits), cached."""
    from inference.usage.quotas import limits_for

    return _cached(
        "user",
        username,
        lambda: Caller(f"user:{username}", username, role, limits_for(role=role)),
    )


async def atoken_caches_answers(raw: str | None) -> bool:
    """``tokens.token_caches_answers``, cached by the token's hash (False without a token)."""
    if not raw:
        return False
    key = hashlib.sha256(raw.encode()).hexdigest()
    return await _acached("token-answers", key, lambda: tokens.token_caches_answers(raw=raw))


def model_for_request(model: str) -> str:
    """``model_names.model_resolve`` (the client-facing name a request's ``model`` asks
    for), cached by the ``model`` string. Raises ``UnknownModel``."""
    return _cached(*_model_lookup(model))


async def amodel_for_request(model: str) -> str:
    """``model_for_request`` for async callers."""
    return await _acached(*_model_lookup(model))


async def arouting_policy() -> RoutingPolicy:
    """``RoutingPolicy.load()``, cached; do not modify the returned object."""
    return await _acached("policy", "", RoutingPolicy.load)


def rollout_for(model: str) -> Any:
    """The ``routing.Rollout`` of an upgrade of ``model`` (a client-facing name) under way,
    or None. Read for every turn of a session, not cached (a compiled query of the few upgrades
    under way, about 0.1 ms, inside the routing read's own database hop): a share change
    reaches routing at once, and no request pays for a cache that expired."""
    from inference.upgrades.services import active_rollouts

    # an upgrade's model is the name its nodes are served as; clients ask for its family
    for served_as, rollout in active_rollouts().items():
        if model_names.family_of(served_as) == model:
            return rollout
    return None


EMBEDDING_TTL_S = 2.0  # a newly approved embedding package reaches every process within this


def array_embedding() -> Any:
    """The array's encoder (``inference.semcache.package.array_embedding_load``: the newest
    approved embedding package, an ``EmbeddingModel``), cached ``EMBEDDING_TTL_S`` seconds.
    Raises ``NoEncoder`` (503) when none is approved."""
    from inference.semcache.package import array_embedding_load

    return _cached("embedding", "", array_embedding_load, EMBEDDING_TTL_S)


async def aembedding_for_request(model: str) -> Any:
    """``inference.semcache.package.embedding_for_request`` (the approved embedding package
    a ``/v1/embeddings`` request's ``model`` names), cached ``EMBEDDING_TTL_S`` seconds by the
    ``model`` string. Raises ``UnknownModel`` (404), ``BadRequest`` (400: a chat model)."""
    from inference.semcache.package import embedding_for_request

    return await _acached(
        "embedding-model", model, lambda: embedding_for_request(model), EMBEDDING_TTL_S
    )


def pinned_counts_cached() -> PinnedCounts:
    """``inference.node_table.pinned_counts``, read at most every ``PINNED_TTL_S`` seconds; the
    route writer's ledger adds what this process pinned since (``pinned_delta``)."""
    return _cached("pinned", "", node_table.pinned_counts, PINNED_TTL_S)


for _model in (ApiToken, ModelPackage, Quota, RoutingPolicy):
    post_save.connect(clear, sender=_model, dispatch_uid=f"lookups-save-{_model.__name__}")
    post_delete.connect(clear, sender=_model, dispatch_uid=f"lookups-delete-{_model.__name__}")
