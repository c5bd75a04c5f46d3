"""The semantic cache: look a text up in a namespace, store what was answered, invalidate.

A lookup, in order:

1. **exact**: the same normalized text (``exact_key``) in the same namespace and partition;
2. **semantic**: the text's embedding (``encoder``) against the partition's vectors
   (``index.VectorIndex``, usearch), the nearest ``CANDIDATES`` at or above the namespace's
   similarity ``threshold``, most similar first;
3. **second check**: a candidate is served only when ``guard.disagreement`` finds nothing that
   differs (numbers, units, dates, negation, antonyms, entities, tool arguments). A candidate
   it refuses is passed over for the next one; a lookup where it refused any counts once
   as ``refused_by_check``.

Partitions are the encoder's: a cache made with ``encoder`` (the embedding package's
``name:version``) looks up and stores under ``<encoder>|<partition>``, so the vectors of two
encoders are never compared (a new encoder starts empty; the old entries expire).

Every lookup, hit, store and saving is counted per namespace in the store, so each replica's
hits add up. Thresholds come from ``precision.operating_point`` on our labelled pairs
(``docs/semcache.md``). No Django here.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inference.semcache.guard import compared_text, disagreement
from inference.semcache.index import VectorIndex
from inference.semcache.store import Entry, FalseHit, Store

CANDIDATES = 4  # nearest entries the second check looks at
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Rules:
    """A namespace's settings: ``threshold`` (cosine similarity, 0..1) for a semantic hit,
    ``ttl_s`` seconds an entry lives, ``max_entries`` kept (oldest go first)."""

    threshold: float
    ttl_s: float
    max_entries: int


@dataclass
class Hit:
    entry: Entry
    similarity: float  # 1.0 for an exact hit
    exact: bool

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.entry.created)


@dataclass
class Miss:
    reason: str  # why not: "empty", "below threshold", or what the second check found
    vector: np.ndarray  # the text's embedding, for storing the answer without a second pass
    best_similarity: float | None = None
    encoder: str = ""  # the encoder that made ``vector`` (``SemanticCache.encoder``)


def exact_key(text: str) -> str:
    """sha256 of ``text`` with runs of white space made one space and ends stripped."""
    return hashlib.sha256(_SPACE.sub(" ", text).strip().encode()).hexdigest()


def tool_text(tool: str, arguments: object) -> str:
    """A tool call as the cache compares it: ``name {canonical JSON}`` (keys sorted), the form
    ``guard.disagreement`` reads as a tool call."""
    return f"{tool} {json.dumps(arguments, sort_keys=True, ensure_ascii=False)}"


class SemanticCache:
    """Lookups and stores over ``store`` with ``embed`` (texts -> unit vectors, n x dims), in
    the partitions of ``encoder`` (the key of the model ``embed`` runs; "" for none)."""

    def __init__(
        self,
        store: Store,
        embed: Callable[[list[str]], np.ndarray],
        dimensions: int,
        encoder: str = "",
    ):
        self.store = store
        self.embed = embed
        self.index = VectorIndex(dimensions)
        self.encoder = encoder

    def stored_partition(self, partition: str) -> str:
        """``partition`` as this cache stores it: ``<encoder>|<partition>`` (itself without
        an encoder)."""
        return f"{self.encoder}|{partition}" if self.encoder else partition

    def lookup(self, namespace: str, partition: str, text: str, rules: Rules) -> Hit | Miss:
        """A hit for ``text`` in ``namespace``/``partition``, or a miss that says why."""
        key, partition = exact_key(text), self.stored_partition(partition)
        found = self.store.exact(namespace, partition, key)
        if found is not None:
            return self._served(Hit(found, 1.0, True))
        vector = self.embed([compared_text(text)])[0]
        nearest = self.index.search(self.store, namespace, partition, vector, CANDIDATES)
        close = [(ident, score) for ident, score in nearest if score >= rules.threshold]
        best = nearest[0][1] if nearest else None
        if not close:
            self.store.count(namespace, lookups=1)
            return Miss("empty" if best is None else "below threshold", vector, best, self.encoder)
        entries = {e.id: e for e in self.store.entries([ident for ident, _ in close])}
        refusals = []
        now = time.time()
        for ident, score in close:
            entry = entries.get(ident)
            if entry is None or entry.expires <= now:
                continue
            reason = disagreement(text, entry.text)
            if not reason:
                return self._served(Hit(entry, score, False), refused=int(bool(refusals)))
            refusals.append(reason)
        self.store.count(namespace, lookups=1, refused_by_check=int(bool(refusals)))
        return Miss(refusals[0] if refusals else "expired", vector, best, self.encoder)

    def _served(self, hit: Hit, refused: int = 0) -> Hit:
        self.store.count(
            hit.entry.namespace,
            lookups=1,
            hits=1,
            exact_hits=int(hit.exact),
            refused_by_check=refused,
            tokens_saved=hit.entry.tokens,
            seconds_saved=hit.entry.seconds,
        )
        return hit

    def put(
        self,
        entry: Entry,
        rules: Rules,
        vector: np.ndarray | None = None,
        encoder: str | None = None,
    ) -> Entry:
        """Store ``entry`` in its partition of this cache's encoder (``exact_key``,
        ``partition``, ``created`` and ``expires`` are set here from its text and ``rules``);
        ``vector`` when the lookup already embedded the text, with the ``encoder`` that did
        (``Miss.encoder``): a vector of another encoder is not stored, the text is embedded
        again."""
        if encoder is not None and encoder != self.encoder:
            vector = None
        entry.exact_key = exact_key(entry.text)
        entry.partition = self.stored_partition(entry.partition)
        entry.created = time.time()
        entry.expires = entry.created + rules.ttl_s
        if vector is None:
            vector = self.embed([compared_text(entry.text)])[0]
        self.store.add(entry, vector, rules.max_entries)
        return entry

    def invalidate(
        self, namespace_prefix: str = "", older_than_s: float | None = None, *, exact: bool = False
    ) -> int:
        """Remove entries of namespaces starting with ``namespace_prefix`` ("" for all; the
        one namespace of that name with ``exact``), only those older than ``older_than_s``
        seconds when given; returns how many."""
        cutoff = None if older_than_s is None else time.time() - older_than_s
        return self.store.remove(namespace_prefix=namespace_prefix, older_than=cutoff, exact=exact)

    def report_false_hit(self, entry_id: int, query: str, similarity: float, note: str) -> Entry:
        """Record a client's report that entry ``entry_id`` was a wrong answer to ``query``
        and remove the entry. ``KeyError`` when the store no longer has it."""
        found = self.store.entries([entry_id])
        if not found:
            raise KeyError(entry_id)
        entry = found[0]
        report = FalseHit(
            entry.namespace, entry.id, query, entry.text, similarity, note, time.time()
        )
        self.store.report(report)
        self.store.remove_ids(entry.namespace, [entry.id])
        return entry
