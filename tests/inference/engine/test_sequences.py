"""Sequence bookkeeping with a fake KV store: no model needed."""

from __future__ import annotations

import itertools

import pytest

from inference.engine.sequences import (
    HostEntry,
    HostStore,
    SequenceTable,
    SessionBusy,
    common_prefix_len,
    pack_state,
    unpack_state,
)


class FakeKv:
    """Records KV operations; a state blob is the token count as text padded to ``blob_size``."""

    def __init__(self, blob_size: int = 100) -> None:
        self.ops: list[tuple] = []
        self.blob_size = blob_size

    def seq_truncate(self, seq_id: int, keep: int) -> None:
        self.ops.append(("truncate", seq_id, keep))

    def seq_share(self, src: int, dst: int, count: int) -> None:
        self.ops.append(("share", src, dst, count))

    def state_export(self, seq_id: int) -> bytes:
        return b"x" * self.blob_size

    def state_import(self, seq_id: int, blob: bytes) -> None:
        self.ops.append(("import", seq_id, len(blob)))


def table(count: int = 2, budget: int = 1000, blob: int = 100) -> SequenceTable:
    clock = itertools.count()
    return SequenceTable(FakeKv(blob), count, HostStore(budget), clock=lambda: float(next(clock)))


@pytest.mark.parametrize(
    "a, b, n",
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 4], 2),
        ([1, 2], [1, 2, 3], 2),
        ([5], [6], 0),
        (list(range(1000)), list(range(999)) + [0], 999),
    ],
)
def test_it_measures_common_prefixes(a, b, n) -> None:
    assert common_prefix_len(a, b) == n


def test_it_keeps_the_longest_prefix_and_leaves_one_token_to_prefill() -> None:
    t = table()
    first = t.acquire("s", [1, 2, 3, 4])
    first.sequence.tokens.extend([1, 2, 3, 4, 9])
    t.release(first.sequence)
    again = t.acquire("s", [1, 2, 3, 4])
    assert again.sequence is first.sequence and again.cached_tokens == 3
    assert again.sequence.tokens == [1, 2, 3]


def test_it_spills_the_least_recently_used_idle_session_to_host_and_restores_it() -> None:
    t = table(count=1)
    a = t.acquire("a", [1, 2, 3])
    a.sequence.tokens.extend([1, 2, 3])
    t.release(a.sequence)
    b = t.acquire("b", [7, 8])
    assert t.locate("a", 1)["where"] == "host"
    b.sequence.tokens.extend([7, 8])
    t.release(b.sequence)
    back = t.acquire("a", [1, 2, 3, 5])
    assert back.restored_from_host and back.cached_tokens == 3
    assert t.locate("b", 1)["where"] == "host"


def test_it_refuses_a_busy_session_and_waits_when_all_sequences_are_busy() -> None:
    t = table(count=1)
    t.acquire("a", [1, 2])
    assert t.acquire("a", [1, 2, 3]) is None
    assert t.acquire("b", [4]) is None
    with pytest.raises(SessionBusy):
        t.erase("a")


def test_it_shares_a_longer_prefix_from_another_sequence() -> None:
    t = table(count=2)
    a = t.acquire("a", [1, 2, 3, 4, 5])
    a.sequence.tokens.extend([1, 2, 3, 4, 5])
    t.release(a.sequence)
    b = t.acquire("b", [1, 2, 3, 4, 9])
    assert b.sequence is not a.sequence and b.cached_tokens == 4
    assert ("share", a.sequence.seq_id, b.sequence.seq_id, 4) in t.kv.ops


def test_it_drops_the_oldest_host_entries_past_the_budget() -> None:
    store = HostStore(budget_bytes=250)
    for name in "abc":
        assert store.put(name, HostEntry(tokens=[1], blob=b"x" * 100))
    assert "a" not in store and "b" in store and "c" in store and store.used_bytes == 200
    assert not store.put("huge", HostEntry(tokens=[1], blob=b"x" * 300))


def test_it_packs_and_unpacks_session_state() -> None:
    entry = HostEntry(tokens=[3, 1, 4], blob=b"\x00kv-bytes")
    back, sha = unpack_state(pack_state(entry, model_sha256="abc"))
    assert back == entry and sha == "abc"
    with pytest.raises(ValueError, match="magic"):
        unpack_state(b"nonsense")
