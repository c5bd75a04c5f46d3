"""This process's vector index of the semantic cache: per namespace, one usearch HNSW index
per partition (cosine metric), mirrored from the store (``store.Store.changes``): new entries
are added before each search; when the namespace's generation moved (entries were removed or
invalidated), it is rebuilt from the store. Entries the store no longer has can linger in an
index until then; the cache skips what the store does not return. No Django here.

usearch (Unum, Apache-2.0) is the library: HNSW with SIMD kernels chosen at run time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from inference.semcache.store import Store


def _new_index(dimensions: int):
    from usearch.index import Index

    return Index(ndim=dimensions, metric="cos", dtype="f32")


@dataclass
class _Mirror:
    generation: int | None = None
    last_id: int = 0
    partitions: dict[str, object] = field(default_factory=dict)


class VectorIndex:
    """Mirrors of the namespaces this process has searched. Safe from any thread."""

    def __init__(self, dimensions: int) -> None:
        self.dimensions = dimensions
        self._mirrors: dict[str, _Mirror] = {}
        self._lock = threading.Lock()

    def search(
        self, store: Store, namespace: str, partition: str, vector: np.ndarray, k: int
    ) -> list[tuple[int, float]]:
        """Up to ``k`` ``(entry id, cosine similarity)`` nearest ``vector`` in ``partition``
        of ``namespace``, most similar first (after catching up with ``store``)."""
        with self._lock:
            mirror = self._caught_up(store, namespace)
            index = mirror.partitions.get(partition)
            if index is None or len(index) == 0:
                return []
            found = index.search(np.asarray(vector, np.float32), min(k, len(index)))
        return [
            (int(key), 1.0 - float(distance))
            for key, distance in zip(found.keys, found.distances, strict=True)
        ]

    def _caught_up(self, store: Store, namespace: str) -> _Mirror:
        mirror = self._mirrors.setdefault(namespace, _Mirror())
        changes = store.changes(namespace, mirror.last_id, mirror.generation)
        if changes.generation != mirror.generation:
            mirror = self._mirrors[namespace] = _Mirror(generation=changes.generation)
        by_partition: dict[str, list[tuple[int, np.ndarray]]] = {}
        for ident, partition, vector in changes.rows:
            by_partition.setdefault(partition, []).append((ident, vector))
            mirror.last_id = max(mirror.last_id, ident)
        for partition, rows in by_partition.items():
            index = mirror.partitions.get(partition)
            if index is None:
                index = mirror.partitions[partition] = _new_index(self.dimensions)
            keys = np.array([ident for ident, _ in rows], dtype=np.uint64)
            index.add(keys, np.stack([vector for _, vector in rows]))
        return mirror

    def forget(self) -> None:
        """Drop every mirror (they rebuild on the next search)."""
        with self._lock:
            self._mirrors.clear()
