"""Routing decisions recorded off the request path, and what this process decided meanwhile.

The proxy decides a request's node in memory (``services.route_plan``) and hands the change
(``services.RouteWrite``: pin, turn, decision log) to ``route_writer``: one thread writes the
changes to the database in the order they were decided, while the node already works on the
request. A SQLite write transaction costs several milliseconds; this takes it out of the
time to first token. ``Upstream.aclose`` waits for its request's write, so a client that has
read its whole answer finds the route recorded (read-your-writes for the sessions API).

Until the database shows a change, the ledger keeps it, so decisions that follow see it:
``pin_of`` overlays a session's row read before its last change was written (a turn that comes
quickly, or a retry), and ``pinned_delta`` corrects the pinned-session counts of a node table
read before then (a burst of new sessions spreads over the nodes instead of all reading the
same counts). Several control-plane replicas share only the database: each sees the others'
placements once written (milliseconds later), which is what placement needs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection

from inference import services
from inference.services import RouteRow, RouteWrite

log = logging.getLogger(__name__)

KEEP_DONE_S = 10.0  # a written change stays in the ledger this long (reads are never older)


@dataclass
class _Change:
    write: RouteWrite
    previous: str | None  # node the session's pin left (released or moved off), or None
    node_id: str | None  # node the session is pinned to after the change
    done_at: float | None = None  # time.monotonic() when written (None: not yet)

    def unseen_by(self, read_at: float) -> bool:
        """True when a read that started at ``read_at`` cannot have seen this change."""
        return self.done_at is None or self.done_at > read_at


class RouteWriter:
    """One writer thread for routing-table changes, plus the ledger of recent ones.

    ``submit`` is called on the event loop; ``pin_of`` and ``pinned_delta`` from any thread.
    """

    def __init__(self, record: Callable[[RouteWrite], None] = services.route_record) -> None:
        self._record = record
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="route-writer")
        self._changes: list[_Change] = []
        self._latest: dict[str, _Change] = {}  # session id -> its newest change with a pin effect
        self._lock = threading.Lock()

    def hold(self, write: RouteWrite) -> _Change:
        """Enter ``write`` in the ledger (decisions from now on see it) without writing it yet;
        ``commit`` queues it. The proxy holds a request's change until the node's first byte,
        so the write does not compete with the request for CPU before then."""
        change = _Change(write, write.previous, write.decision.node_id)
        if write.decision.pins or write.released:
            with self._lock:
                self._prune()
                self._changes.append(change)
                self._latest[write.session_id] = change
        return change

    def commit(self, change: _Change | None) -> asyncio.Future[None] | None:
        """Queue a held change for the writer thread; the returned future resolves once it is
        in the database (or failed, which is logged: the session is then placed afresh on its
        next turn). ``None`` in, ``None`` out (a request without a session)."""
        if change is None:
            return None
        return asyncio.wrap_future(self._executor.submit(self._write, change))

    def submit(self, write: RouteWrite) -> asyncio.Future[None] | None:
        """``hold`` and ``commit`` at once."""
        return self.commit(self.hold(write))

    def _write(self, change: _Change) -> None:
        try:
            self._record(change.write)
        except Exception:
            log.exception("could not record the route of session %s", change.write.session_id)
            connection.close()  # a broken connection is opened afresh for the next write
        finally:
            change.done_at = time.monotonic()

    def pin_of(self, session_id: str, row: RouteRow | None, *, read_at: float) -> RouteRow | None:
        """``row`` (read at ``read_at``) with this process's newer pin of the session, if any."""
        with self._lock:
            change = self._latest.get(session_id)
        if change is None or not change.unseen_by(read_at):
            return row
        write = change.write
        for_load_at = write.at if write.decision.for_load else (row and row.moved_for_load_at)
        return RouteRow(change.node_id, write.at, for_load_at)

    def pinned_delta(self, *, read_at: float) -> dict[str, int]:
        """``{node_id: +/- sessions}`` this process pinned or unpinned that a node table read at
        ``read_at`` does not show."""
        delta: dict[str, int] = {}
        with self._lock:
            changes = [c for c in self._changes if c.unseen_by(read_at)]
        for change in changes:
            if change.previous == change.node_id:
                continue
            if change.node_id:
                delta[change.node_id] = delta.get(change.node_id, 0) + 1
            if change.previous:
                delta[change.previous] = delta.get(change.previous, 0) - 1
        return delta

    def flush(self, timeout: float = 10.0) -> None:
        """Block until every change submitted so far is written (tests end with it)."""
        self._executor.submit(lambda: None).result(timeout=timeout)

    def _prune(self) -> None:
        cutoff = time.monotonic() - KEEP_DONE_S
        keep = [c for c in self._changes if c.done_at is None or c.done_at > cutoff]
        if len(keep) != len(self._changes):
            self._changes = keep
            self._latest = {
                sid: c for sid, c in self._latest.items() if c.done_at is None or c.done_at > cutoff
            }


route_writer = RouteWriter()
