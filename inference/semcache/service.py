"""The semantic cache of this process: its store (Redis with ``REDIS_URL``, else the embedded
SQLite file ``$PHALANX_HOME/semcache.sqlite3``), the namespaces' rules, the report the console
shows, invalidation, and the minute's sweep of expired entries.

Defaults (``docs/semcache.md``): a namespace without a ``CacheNamespace`` row uses
``DEFAULT_THRESHOLD``, the lowest threshold at which ``bench/semantic_precision.py`` served at
least 99 % paraphrases in both namespaces of our labelled pairs (with the second check; the
floor of ``precision.SIMILARITY_FLOOR``), ``DEFAULT_TTL_S`` and ``DEFAULT_MAX_ENTRIES``.
Answers are cached by default (each request or token still opts in); a tool's results only
once an operator enables its namespace.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from inference.semcache.cache import Rules, SemanticCache
from inference.semcache.models import CacheNamespace
from inference.semcache.precision import SIMILARITY_FLOOR
from inference.semcache.store import COUNTERS, FalseHit, Store

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = SIMILARITY_FLOOR
DEFAULT_TTL_S = 24 * 3600
DEFAULT_MAX_ENTRIES = 10_000
RULES_TTL_S = 2.0  # an operator's change reaches every process within this
ANSWERS, TOOLS = "answers:", "tools:"

_lock = threading.Lock()
_state: dict = {"store": None, "key": None, "caches": {}, "rules": None, "rules_at": 0.0}


def the_store() -> Store:
    """This process's store (built on first use; rebuilt when ``REDIS_URL`` changes)."""
    key = (settings.REDIS_URL, str(settings.VAR_DIR))
    with _lock:
        if _state["store"] is None or _state["key"] != key:
            _state["store"], _state["key"], _state["caches"] = _new_store(), key, {}
        return _state["store"]


def the_cache() -> SemanticCache:
    """This process's cache with the array's encoder (``lookups.array_embedding``: the newest
    approved embedding package). Every partition it looks up or stores in carries that
    package's ``name:version`` (``SemanticCache.encoder``): once another embedding package is
    approved, the entries of the old one are never found again (they expire by their TTL), so
    vectors of two encoders are never compared. Raises ``NoEncoder`` (503) when no embedding
    package is approved."""
    from inference import lookups
    from inference.semcache.encoder import DIMENSIONS
    from inference.semcache.package import embed_with

    model = lookups.array_embedding()
    store = the_store()
    with _lock:
        cache = _state["caches"].get(model.key)
        if cache is None:
            cache = SemanticCache(store, embed_with(model.files), DIMENSIONS, encoder=model.key)
            _state["caches"][model.key] = cache
        return cache


def _new_store() -> Store:
    if settings.REDIS_URL:
        from inference.semcache.redis_store import RedisStore

        return RedisStore(settings.REDIS_URL)
    from inference.semcache.store import SqliteStore

    return SqliteStore(settings.VAR_DIR / "semcache.sqlite3")


def rules_for(namespace: str) -> Rules | None:
    """The rules of ``namespace``, None when it is not cached (a tool nobody enabled, or a
    namespace an operator turned off). Read from the database at most every ``RULES_TTL_S``."""
    now = time.monotonic()
    if _state["rules"] is None or now - _state["rules_at"] > RULES_TTL_S:
        rows = {row.name: row for row in CacheNamespace.objects.all()}
        _state["rules"], _state["rules_at"] = rows, now
    row = _state["rules"].get(namespace)
    if row is None:
        if namespace.startswith(ANSWERS):
            return Rules(DEFAULT_THRESHOLD, DEFAULT_TTL_S, DEFAULT_MAX_ENTRIES)
        return None
    if not row.enabled:
        return None
    return Rules(row.threshold, row.ttl_s, row.max_entries)


def rules_changed() -> None:
    """Forget the rules read (after an operator's change in this process)."""
    _state["rules"] = None


def namespace_save(
    name: str, *, enabled: bool, threshold: float, ttl_s: int, max_entries: int
) -> CacheNamespace:
    """Create or change ``name``'s rules (names checked by the caller)."""
    row, _ = CacheNamespace.objects.update_or_create(
        name=name,
        defaults={
            "enabled": enabled,
            "threshold": threshold,
            "ttl_s": ttl_s,
            "max_entries": max_entries,
        },
    )
    rules_changed()
    return row


def invalidate(
    namespace_prefix: str = "",
    older_than_s: float | None = None,
    why: str = "",
    *,
    exact: bool = False,
) -> int:
    """Remove entries (as ``SemanticCache.invalidate``: whatever encoder made them) and log
    what and why."""
    cutoff = None if older_than_s is None else time.time() - older_than_s
    removed = the_store().remove(namespace_prefix=namespace_prefix, older_than=cutoff, exact=exact)
    log.info(
        "semantic cache invalidated",
        extra={"namespace": namespace_prefix or "*", "removed": removed, "why": why},
    )
    return removed


def package_changed(model: str) -> int:
    """A package of ``model`` (client-facing name) started or stopped serving: its cached
    answers came from another package, so they go. Tool results stay (no model made them)."""
    return invalidate(f"{ANSWERS}{model}", why=f"package change of {model}", exact=True)


def sweep_now() -> int:
    """Remove expired entries (the control loop, every minute)."""
    return the_store().sweep(time.time())


@dataclass
class NamespaceReport:
    name: str
    entries: int
    counters: dict[str, float]
    rules: Rules | None

    @property
    def hit_rate(self) -> float | None:
        lookups = self.counters["lookups"]
        return self.counters["hits"] / lookups if lookups else None


def report() -> tuple[list[NamespaceReport], list[FalseHit]]:
    """Every namespace with entries, counters or rules, and the newest false-hit reports."""
    store = the_store()
    counters, sizes = store.counters(), store.sizes()
    names = sorted(
        set(counters) | set(sizes) | set(CacheNamespace.objects.values_list("name", flat=True))
    )
    rows = [
        NamespaceReport(
            name,
            sizes.get(name, 0),
            counters.get(name, dict.fromkeys(COUNTERS, 0.0)),
            rules_for(name),
        )
        for name in names
    ]
    return rows, store.reports(50)
