"""Where the semantic cache keeps its entries: the seam for its I/O, with two stores that pass
the same tests (``tests/inference/semcache/test_store.py``).

- ``SqliteStore``: the embedded default, one SQLite file (WAL) under ``$PHALANX_HOME`` that
  every process of the machine shares; no server.
- ``inference.semcache.redis_store.RedisStore``: with ``REDIS_URL``, shared by every
  control-plane replica.

A store keeps entries (text, vector, served value), a generation number per namespace (bumped
whenever entries are removed, so each process's vector index, ``inference.semcache.index``,
knows to rebuild), counters per namespace and the false-hit reports. Vector search itself is
not the store's job: each process mirrors a namespace's vectors into a usearch index and asks
the store only for the entries it finds. No Django here.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

FALSE_HITS_KEPT = 1000  # newest reports kept
COUNTERS = (
    "lookups",
    "hits",
    "exact_hits",
    "refused_by_check",
    "stores",
    "tokens_saved",
    "seconds_saved",
    "false_hits",
)


@dataclass
class Entry:
    """One cached value. ``namespace`` is ``tools:<tool>`` or ``answers:<model>``;
    ``partition`` splits a namespace into sets that never match each other (for answers: the
    system prompt, tools and parameters); ``text`` is what was embedded and what the second
    check compares; ``value`` the JSON text served on a hit. Times are Unix seconds;
    ``tokens``/``seconds`` are what one hit saves."""

    namespace: str
    partition: str
    exact_key: str
    text: str
    value: str
    created: float
    expires: float
    package: str = ""
    tokens: int = 0
    seconds: float = 0.0
    id: int = 0


@dataclass
class Changes:
    """What a namespace's vector index must learn: ``generation`` (when it differs from the
    index's, ``rows`` start from the beginning) and ``rows`` of ``(id, partition, vector)``."""

    generation: int
    rows: list[tuple[int, str, np.ndarray]] = field(default_factory=list)


@dataclass
class FalseHit:
    """A client's report that a served hit was wrong (``POST /v1/cache/false-hits``)."""

    namespace: str
    entry_id: int
    query: str
    cached_text: str
    similarity: float
    note: str
    at: float


class Store(Protocol):
    def add(self, entry: Entry, vector: np.ndarray, max_entries: int) -> int: ...
    def exact(self, namespace: str, partition: str, exact_key: str) -> Entry | None: ...
    def entries(self, ids: list[int]) -> list[Entry]: ...
    def changes(self, namespace: str, after_id: int, generation: int | None) -> Changes: ...
    def remove(
        self, *, namespace_prefix: str, older_than: float | None, exact: bool = False
    ) -> int: ...
    def sweep(self, now: float) -> int: ...
    def remove_ids(self, namespace: str, ids: list[int]) -> int: ...
    def count(self, namespace: str, **amounts: float) -> None: ...
    def counters(self) -> dict[str, dict[str, float]]: ...
    def sizes(self) -> dict[str, int]: ...
    def report(self, false_hit: FalseHit) -> None: ...
    def reports(self, limit: int) -> list[FalseHit]: ...


SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, namespace TEXT NOT NULL, partition TEXT NOT NULL,
    exact_key TEXT NOT NULL, text TEXT NOT NULL, value TEXT NOT NULL, vector BLOB NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL, package TEXT NOT NULL,
    tokens INTEGER NOT NULL, seconds REAL NOT NULL);
CREATE INDEX IF NOT EXISTS entries_exact ON entries (namespace, partition, exact_key);
CREATE INDEX IF NOT EXISTS entries_namespace ON entries (namespace, id);
CREATE INDEX IF NOT EXISTS entries_expires ON entries (expires);
CREATE TABLE IF NOT EXISTS generations (namespace TEXT PRIMARY KEY, generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (
    namespace TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS false_hits (id INTEGER PRIMARY KEY AUTOINCREMENT, report TEXT NOT NULL);
"""
_ENTRY_COLUMNS = (
    "id, namespace, partition, exact_key, text, value, created, expires, package, tokens, seconds"
)


def _entry(row: tuple) -> Entry:
    """An entry from a row of ``_ENTRY_COLUMNS`` (the id first, then ``Entry``'s fields in
    their order)."""
    return Entry(*row[1:], id=row[0])


class SqliteStore:
    """The embedded store: ``path`` (created with its schema), one connection per thread."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._db().executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (taken at once: no upgrade from read to write to deadlock)."""
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def add(self, entry: Entry, vector: np.ndarray, max_entries: int) -> int:
        """Store ``entry`` (its ``id`` set); past ``max_entries`` in its namespace the oldest
        tenth go, and the namespace's generation moves."""
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO entries (namespace, partition, exact_key, text, value, vector,"
                " created, expires, package, tokens, seconds) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    entry.namespace, entry.partition, entry.exact_key, entry.text, entry.value,
                    np.asarray(vector, dtype=np.float32).tobytes(), entry.created,
                    entry.expires, entry.package, entry.tokens, entry.seconds,
                ),
            )  # fmt: skip
            entry.id = int(cursor.lastrowid)
            (held,) = db.execute(
                "SELECT COUNT(*) FROM entries WHERE namespace = ?", (entry.namespace,)
            ).fetchone()
            if held > max_entries:
                drop = held - max_entries + max(1, max_entries // 10)
                db.execute(
                    "DELETE FROM entries WHERE id IN (SELECT id FROM entries WHERE namespace = ?"
                    " ORDER BY id LIMIT ?)",
                    (entry.namespace, drop),
                )
                self._bump(db, [entry.namespace])
            self._count(db, entry.namespace, {"stores": 1})
        return entry.id

    def exact(self, namespace: str, partition: str, exact_key: str) -> Entry | None:
        row = (
            self._db()
            .execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE namespace = ? AND partition = ?"
                " AND exact_key = ? AND expires > ? ORDER BY id DESC LIMIT 1",
                (namespace, partition, exact_key, time.time()),
            )
            .fetchone()
        )
        return _entry(row) if row else None

    def entries(self, ids: list[int]) -> list[Entry]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self._db().execute(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE id IN ({marks})", [int(i) for i in ids]
        )
        return [_entry(row) for row in rows]

    def changes(self, namespace: str, after_id: int, generation: int | None) -> Changes:
        db = self._db()
        db.execute("BEGIN")  # one read transaction: the generation and the rows agree
        try:
            row = db.execute(
                "SELECT generation FROM generations WHERE namespace = ?", (namespace,)
            ).fetchone()
            current = row[0] if row else 0
            start = after_id if current == generation else 0
            rows = db.execute(
                "SELECT id, partition, vector FROM entries WHERE namespace = ? AND id > ?"
                " ORDER BY id",
                (namespace, start),
            ).fetchall()
        finally:
            db.execute("COMMIT")
        return Changes(current, [(i, p, np.frombuffer(v, dtype=np.float32)) for i, p, v in rows])

    def remove(
        self, *, namespace_prefix: str, older_than: float | None, exact: bool = False
    ) -> int:
        """Remove the entries of every namespace starting with ``namespace_prefix`` ("" for
        all; only that namespace with ``exact``), only those created before ``older_than``
        when given; returns how many."""
        if exact:
            where, args = "namespace = ?", [namespace_prefix]
        else:
            where, args = "namespace LIKE ? ESCAPE '\\'", [_like_prefix(namespace_prefix)]
        if older_than is not None:
            where += " AND created < ?"
            args.append(older_than)
        return self._delete(where, args)

    def sweep(self, now: float) -> int:
        """Remove expired entries; returns how many."""
        return self._delete("expires <= ?", [now])

    def remove_ids(self, namespace: str, ids: list[int]) -> int:
        """Remove these entries of ``namespace``; returns how many."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        return self._delete(f"namespace = ? AND id IN ({marks})", [namespace, *map(int, ids)])

    def _delete(self, where: str, args: list) -> int:
        with self._write() as db:
            touched = [
                n
                for (n,) in db.execute(
                    f"SELECT DISTINCT namespace FROM entries WHERE {where}", args
                )
            ]
            removed = db.execute(f"DELETE FROM entries WHERE {where}", args).rowcount
            self._bump(db, touched)
        return removed

    @staticmethod
    def _bump(db: sqlite3.Connection, namespaces: list[str]) -> None:
        for namespace in namespaces:
            db.execute(
                "INSERT INTO generations VALUES (?, 1) ON CONFLICT(namespace)"
                " DO UPDATE SET generation = generation + 1",
                (namespace,),
            )

    def count(self, namespace: str, **amounts: float) -> None:
        with self._write() as db:
            self._count(db, namespace, amounts)

    @staticmethod
    def _count(db: sqlite3.Connection, namespace: str, amounts: dict[str, float]) -> None:
        for name, amount in amounts.items():
            db.execute(
                "INSERT INTO counters VALUES (?, ?, ?) ON CONFLICT(namespace, name)"
                " DO UPDATE SET value = value + excluded.value",
                (namespace, name, amount),
            )

    def counters(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for namespace, name, value in self._db().execute("SELECT * FROM counters"):
            out.setdefault(namespace, dict.fromkeys(COUNTERS, 0.0))[name] = value
        return out

    def sizes(self) -> dict[str, int]:
        rows = self._db().execute(
            "SELECT namespace, COUNT(*) FROM entries WHERE expires > ? GROUP BY namespace",
            (time.time(),),
        )
        return dict(rows.fetchall())

    def report(self, false_hit: FalseHit) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO false_hits (report) VALUES (?)", (json.dumps(asdict(false_hit)),)
            )
            db.execute(
                "DELETE FROM false_hits WHERE id <= (SELECT MAX(id) FROM false_hits) - ?",
                (FALSE_HITS_KEPT,),
            )
            self._count(db, false_hit.namespace, {"false_hits": 1})

    def reports(self, limit: int) -> list[FalseHit]:
        rows = self._db().execute(
            "SELECT report FROM false_hits ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [FalseHit(**json.loads(report)) for (report,) in rows]


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"
