"""The semantic cache's shared store on Redis (``REDIS_URL``): every control-plane replica
reads and writes the same entries. Same contract as ``store.SqliteStore``.

Keys, under ``phalanx:semcache:``:

- ``seq``: the last entry id (INCR);
- ``entry:<id>``: an entry (JSON), expiring with it (Redis's own TTL);
- ``ns:<namespace>:ids``: sorted set of its entry ids (score = id), what an index catches up on;
- ``ns:<namespace>:vectors``: hash id -> partition NUL float32 bytes;
- ``ns:<namespace>:exact``: hash partition NUL exact key -> newest id;
- ``ns:<namespace>:generation``: bumped whenever entries leave the namespace;
- ``namespaces``: the set of namespaces; ``counters:<namespace>``: hash of counters;
- ``false-hits``: list of JSON reports, newest first, ``store.FALSE_HITS_KEPT`` at most.

A lookup costs one round trip when nothing changed (the generation and the new ids,
pipelined), one more for new vectors and one for the entries found. No Django here.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import numpy as np

from inference.semcache.store import COUNTERS, FALSE_HITS_KEPT, Changes, Entry, FalseHit

PREFIX = "phalanx:semcache:"


class RedisStore:
    """The shared store at ``url`` (``redis://host:port/db``), its keys under ``prefix``."""

    def __init__(self, url: str, prefix: str = PREFIX) -> None:
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.prefix = prefix

    def _ns(self, namespace: str, part: str) -> str:
        return f"{self.prefix}ns:{namespace}:{part}"

    def _entry_key(self, ident: int | str) -> str:
        return f"{self.prefix}entry:{ident}"

    def add(self, entry: Entry, vector: np.ndarray, max_entries: int) -> int:
        """Store ``entry`` (its ``id`` set); past ``max_entries`` in its namespace the oldest
        tenth go, and the namespace's generation moves."""
        entry.id = int(self.redis.incr(self.prefix + "seq"))
        ttl_ms = max(1, int((entry.expires - time.time()) * 1000))
        blob = entry.partition.encode() + b"\0" + np.asarray(vector, np.float32).tobytes()
        pipe = self.redis.pipeline()
        pipe.set(self._entry_key(entry.id), json.dumps(asdict(entry)), px=ttl_ms)
        pipe.zadd(self._ns(entry.namespace, "ids"), {str(entry.id): entry.id})
        pipe.hset(self._ns(entry.namespace, "vectors"), str(entry.id), blob)
        pipe.hset(self._ns(entry.namespace, "exact"), _exact_field(entry), entry.id)
        pipe.sadd(self.prefix + "namespaces", entry.namespace)
        pipe.hincrbyfloat(f"{self.prefix}counters:{entry.namespace}", "stores", 1)
        pipe.zcard(self._ns(entry.namespace, "ids"))
        held = pipe.execute()[-1]
        if held > max_entries:
            drop = held - max_entries + max(1, max_entries // 10)
            oldest = self.redis.zrange(self._ns(entry.namespace, "ids"), 0, drop - 1)
            self._forget(entry.namespace, [int(i) for i in oldest])
        return entry.id

    def exact(self, namespace: str, partition: str, exact_key: str) -> Entry | None:
        ident = self.redis.hget(self._ns(namespace, "exact"), f"{partition}\0{exact_key}")
        if ident is None:
            return None
        found = self.entries([int(ident)])
        return found[0] if found and found[0].expires > time.time() else None

    def entries(self, ids: list[int]) -> list[Entry]:
        if not ids:
            return []
        raw = self.redis.mget([self._entry_key(i) for i in ids])
        return [Entry(**json.loads(item)) for item in raw if item is not None]

    def changes(self, namespace: str, after_id: int, generation: int | None) -> Changes:
        pipe = self.redis.pipeline()
        pipe.get(self._ns(namespace, "generation"))
        pipe.zrangebyscore(self._ns(namespace, "ids"), f"({after_id}", "+inf")
        current_raw, ids = pipe.execute()
        current = int(current_raw or 0)
        if current != generation and after_id:
            ids = self.redis.zrangebyscore(self._ns(namespace, "ids"), "-inf", "+inf")
        if not ids:
            return Changes(current)
        blobs = self.redis.hmget(self._ns(namespace, "vectors"), ids)
        rows = []
        for ident, blob in zip(ids, blobs, strict=True):
            if blob is not None:
                partition, _, vector = blob.partition(b"\0")
                rows.append((int(ident), partition.decode(), np.frombuffer(vector, np.float32)))
        return Changes(current, rows)

    def remove(
        self, *, namespace_prefix: str, older_than: float | None, exact: bool = False
    ) -> int:
        """Remove the entries of every namespace starting with ``namespace_prefix`` ("" for
        all; only that namespace with ``exact``), only those created before ``older_than``
        when given; returns how many."""
        removed = 0
        for namespace in self._namespaces(namespace_prefix):
            if exact and namespace != namespace_prefix:
                continue
            ids = [int(i) for i in self.redis.zrange(self._ns(namespace, "ids"), 0, -1)]
            if older_than is not None:
                ids = [e.id for e in self.entries(ids) if e.created < older_than]
            removed += self._forget(namespace, ids)
        return removed

    def sweep(self, now: float) -> int:
        """Drop the ids of entries Redis has expired; returns how many."""
        removed = 0
        for namespace in self._namespaces(""):
            ids = [int(i) for i in self.redis.zrange(self._ns(namespace, "ids"), 0, -1)]
            alive = self.redis.mget([self._entry_key(i) for i in ids]) if ids else []
            gone = [i for i, item in zip(ids, alive, strict=True) if item is None]
            removed += self._forget(namespace, gone)
        return removed

    def remove_ids(self, namespace: str, ids: list[int]) -> int:
        """Remove these entries of ``namespace``; returns how many."""
        return self._forget(namespace, [int(i) for i in ids])

    def _namespaces(self, prefix: str) -> list[str]:
        names = (n.decode() for n in self.redis.smembers(self.prefix + "namespaces"))
        return sorted(n for n in names if n.startswith(prefix))

    def _forget(self, namespace: str, ids: list[int]) -> int:
        if not ids:
            return 0
        found = self.entries(ids)
        pipe = self.redis.pipeline()
        pipe.delete(*[self._entry_key(i) for i in ids])
        pipe.zrem(self._ns(namespace, "ids"), *[str(i) for i in ids])
        pipe.hdel(self._ns(namespace, "vectors"), *[str(i) for i in ids])
        for entry in found:
            pipe.hdel(self._ns(namespace, "exact"), _exact_field(entry))
        pipe.incr(self._ns(namespace, "generation"))
        pipe.execute()
        return len(ids)

    def count(self, namespace: str, **amounts: float) -> None:
        pipe = self.redis.pipeline()
        pipe.sadd(self.prefix + "namespaces", namespace)
        for name, amount in amounts.items():
            pipe.hincrbyfloat(f"{self.prefix}counters:{namespace}", name, amount)
        pipe.execute()

    def counters(self) -> dict[str, dict[str, float]]:
        out = {}
        for namespace in self._namespaces(""):
            raw = self.redis.hgetall(f"{self.prefix}counters:{namespace}")
            values = dict.fromkeys(COUNTERS, 0.0)
            values.update({k.decode(): float(v) for k, v in raw.items()})
            out[namespace] = values
        return out

    def sizes(self) -> dict[str, int]:
        sizes = {}
        for namespace in self._namespaces(""):
            held = int(self.redis.zcard(self._ns(namespace, "ids")))
            if held:
                sizes[namespace] = held
        return sizes

    def report(self, false_hit: FalseHit) -> None:
        pipe = self.redis.pipeline()
        pipe.lpush(self.prefix + "false-hits", json.dumps(asdict(false_hit)))
        pipe.ltrim(self.prefix + "false-hits", 0, FALSE_HITS_KEPT - 1)
        pipe.hincrbyfloat(f"{self.prefix}counters:{false_hit.namespace}", "false_hits", 1)
        pipe.sadd(self.prefix + "namespaces", false_hit.namespace)
        pipe.execute()

    def reports(self, limit: int) -> list[FalseHit]:
        raw = self.redis.lrange(self.prefix + "false-hits", 0, max(0, limit - 1))
        return [FalseHit(**json.loads(item)) for item in raw]


def _exact_field(entry: Entry) -> str:
    return f"{entry.partition}\0{entry.exact_key}"
