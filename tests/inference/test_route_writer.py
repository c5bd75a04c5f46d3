"""The route writer's ledger: what this process decided that the database does not show yet."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from inference.route_writer import RouteWriter
from inference.routing import Action, Decision
from inference.services import RouteRow, RouteWrite


def change(session: str, node: str, *, action=Action.PLACED, previous=None) -> RouteWrite:
    decision = Decision(node, action, f"{action} {node}", previous=previous)
    return RouteWrite(session, decision, previous, None, None, True, timezone.now())


class SlowStore:
    """Stands in for the database: records writes, each waiting until released."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.go = threading.Event()

    def record(self, write: RouteWrite) -> None:
        self.go.wait(5)
        self.written.append(write.session_id)


@pytest.fixture
def store():
    store = SlowStore()
    yield store
    store.go.set()


async def test_unwritten_placements_count_on_their_nodes(store):
    writer = RouteWriter(store.record)
    read_at = time.monotonic()
    for i, node in enumerate(["node-01", "node-01", "node-02"]):
        writer.submit(change(f"s{i}", node))
    assert writer.pinned_delta(read_at=read_at) == {"node-01": 2, "node-02": 1}


async def test_a_move_counts_on_the_new_node_and_off_the_old(store):
    writer = RouteWriter(store.record)
    read_at = time.monotonic()
    writer.submit(change("s", "node-02", action=Action.MOVED, previous="node-01"))
    assert writer.pinned_delta(read_at=read_at) == {"node-02": 1, "node-01": -1}


async def test_a_read_after_the_write_needs_no_correction(store):
    writer = RouteWriter(store.record)
    done = writer.submit(change("s", "node-01"))
    store.go.set()
    await done
    assert store.written == ["s"]
    assert writer.pinned_delta(read_at=time.monotonic()) == {}
    stale_row = RouteRow(None, timezone.now() - timedelta(hours=1))
    assert writer.pin_of("s", stale_row, read_at=time.monotonic()) is stale_row


async def test_a_row_read_before_the_write_shows_the_newer_pin(store):
    writer = RouteWriter(store.record)
    read_at = time.monotonic()
    writer.submit(change("s", "node-02"))
    row = writer.pin_of("s", None, read_at=read_at)
    assert row is not None and row.node_id == "node-02"
    assert writer.pin_of("other", None, read_at=read_at) is None


async def test_a_failed_write_is_logged_and_does_not_stop_the_writer(caplog):
    calls: list[str] = []

    def flaky(write: RouteWrite) -> None:
        calls.append(write.session_id)
        if write.session_id == "bad":
            raise RuntimeError("disk full")

    writer = RouteWriter(flaky)
    await writer.submit(change("bad", "node-01"))
    await writer.submit(change("good", "node-01"))
    assert calls == ["bad", "good"]
    assert "could not record the route of session bad" in caplog.text
