"""Sequence bookkeeping with a fake KV store: no model needed."""

from __future__ import annotations

import itertools
import math

import pytest

from inference.engine.host_store import HostEntry, HostStore
from inference.engine.reuse_forecast import ReuseForecast
from inference.engine.sequences import SequenceTable, SessionBusy
from inference.engine.session_state import pack_state, unpack_state
from inference.engine.token_prefix import common_prefix_len


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


class EveryoneDueNow(ReuseForecast):
    """No forecast: every entry ties, so the store drops the least recently stored (LRU)."""

    def due_in(self, session_id: str, typical: float | None = None) -> float:
        return 0.0


def round_robin(sessions: int, sequences: int, host_places: int, forecast=None) -> tuple[int, int]:
    """Sessions taking turns in order for six rounds; (turns that found their KV, turns) after
    the first round. Each session's prompt opens with its own token, so only its own KV helps."""
    clock = itertools.count()
    host = HostStore(host_places * 100, forecast)
    seqs = SequenceTable(FakeKv(100), sequences, host, clock=lambda: float(next(clock)))
    warm = turns = 0
    for turn in range(6):
        for s in range(sessions):
            prompt = [1000 + s, 1, 2, 3, turn]
            got = seqs.acquire(f"s{s}", prompt)
            if turn:
                turns += 1
                warm += got.cached_tokens == 4
            got.sequence.tokens[:] = prompt
            seqs.release(got.sequence)
    return warm, turns


def test_round_robin_over_more_sessions_than_places_keeps_a_fixed_set_warm() -> None:
    # 24 sessions, 16 places (8 sequences + 8 host entries): LRU drops each entry just before
    # its session comes back; the forecast keeps most of the places' worth warm.
    warm, turns = round_robin(24, 8, 8)
    assert warm > turns * (16 / 24) / 2, (warm, turns)  # over half of the best: 16 of 24
    assert round_robin(24, 8, 8, EveryoneDueNow()) == (0, turns)


def test_sessions_that_fit_all_stay_warm() -> None:
    # 24 places for 24 sessions: a session's own host entry leaves before the victim's enters
    assert round_robin(24, 8, 16) == (120, 120)
    assert round_robin(24, 8, 16, EveryoneDueNow()) == (120, 120)


def test_the_forecast_follows_each_session_s_rhythm() -> None:
    f = ReuseForecast()
    for _ in range(3):
        for sid in ("a", "b", "c"):
            f.note_turn(sid)  # each back every 3 turns
    assert f.due_in("a") == 1.0 and f.due_in("b") == 2.0 and f.due_in("c") == 3.0
    assert f.due_in("never-seen") == math.inf
    f.note_turn("new")  # seen once: the others' median gap (3)
    assert f.due_in("new") == 3.0
    for _ in range(12):
        f.note_turn("b")
    assert f.due_in("a") == math.inf  # 14 turns away on a gap of 3: presumed gone


def test_the_store_refuses_a_newcomer_due_after_everything_it_holds() -> None:
    f = ReuseForecast()
    store = HostStore(200, f)
    for sid in ("a", "b", "c", "a", "b", "c"):
        f.note_turn(sid)
    assert store.put("a", HostEntry(tokens=[1], blob=b"x" * 100))  # due in 1
    assert store.put("b", HostEntry(tokens=[1], blob=b"x" * 100))  # due in 2
    assert not store.put("c", HostEntry(tokens=[1], blob=b"x" * 100))  # due in 3: last
    assert "a" in store and "b" in store and store.dropped_total == 1
    for _ in range(20):
        f.note_turn("c")  # a and b stop coming back
    assert store.put("c", HostEntry(tokens=[1], blob=b"x" * 100))
    assert "c" in store and len(store) == 2 and store.used_bytes == 200


def test_a_refused_newcomer_displaces_nothing() -> None:
    f = ReuseForecast()
    store = HostStore(100, f)
    for sid in ["b", "a", "n"] * 2 + ["b"] * 40 + ["n"] * 2 + ["a", "b"]:
        f.note_turn(sid)  # b comes back soonest, then n, then a (a at most 4 gaps out)
    assert store.put("a", HostEntry(tokens=[1], blob=b"x" * 30))
    assert store.put("b", HostEntry(tokens=[1], blob=b"x" * 60))
    due = {sid: f.due_in(sid) for sid in "abn"}
    assert due["b"] < due["n"] < due["a"] or due["a"] == math.inf, due
    # n (70) fits only without a (30) and b (60): it is due after b, so it is refused, and a,
    # which it could not have replaced alone, stays
    assert not store.put("n", HostEntry(tokens=[1], blob=b"x" * 70))
    assert "a" in store and "b" in store and store.used_bytes == 90


def test_an_imported_session_is_expected_soon_and_kept() -> None:
    kv = FakeKv(100)
    host = HostStore(300)
    seqs = SequenceTable(kv, 1, host)
    for turn in range(3):
        for s in range(4):  # four sessions with a steady rhythm, three fit in host RAM
            got = seqs.acquire(f"s{s}", [s, 1, 2, turn])
            got.sequence.tokens[:] = [s, 1, 2, turn]
            seqs.release(got.sequence)
    assert seqs.import_("moved", HostEntry(tokens=[9, 9], blob=b"y" * 100))
    assert "moved" in host and host.used_bytes <= 300


def spilled_table(prefill_speed: float) -> tuple[SequenceTable, list[int]]:
    """One sequence; session "a" (prompt ``[1..8]``) spilled to host by "b"."""
    seqs = SequenceTable(FakeKv(100), 1, HostStore(10_000), prefill_speed=lambda: prefill_speed)
    first = list(range(1, 9))
    got = seqs.acquire("a", first)
    got.sequence.tokens[:] = first
    seqs.release(got.sequence)
    got = seqs.acquire("b", [50, 51])
    got.sequence.tokens[:] = [50, 51]
    seqs.release(got.sequence)
    assert "a" in seqs.host
    return seqs, first


def test_a_restore_happens_while_it_beats_prefilling_what_it_holds() -> None:
    seqs, first = spilled_table(prefill_speed=1000.0)
    seqs.restore_speed = 1e9  # 100 bytes in 0.1 us against 8 tokens in 8 ms
    got = seqs.acquire("a", [*first, 9])
    assert got.restored_from_host and got.cached_tokens == 8 and seqs.restores_skipped == 0


def test_a_restore_slower_than_a_prefill_is_skipped() -> None:
    seqs, first = spilled_table(prefill_speed=1e9)
    seqs.restore_speed = 1.0  # 100 bytes in 100 s against 8 tokens in no time
    got = seqs.acquire("a", [*first, 9])
    assert not got.restored_from_host and got.cached_tokens == 0
    assert seqs.restores_skipped == 1 and "a" not in seqs.host


def test_a_restore_nothing_of_which_the_prompt_uses_is_skipped() -> None:
    seqs, _ = spilled_table(prefill_speed=0.0)  # speeds unknown: restores are optimistic ...
    got = seqs.acquire("a", [99, 98, 97])  # ... but this prompt shares nothing with it
    assert not got.restored_from_host and seqs.restores_skipped == 1


class CellsCodec:
    """A state is one byte per token, the token's value: split and join are cut and paste."""

    @staticmethod
    def split(blob: bytes, position: int) -> tuple[bytes, bytes]:
        return blob[:position], blob[position:]

    @staticmethod
    def join(prefix: bytes, suffix: bytes) -> bytes:
        return prefix + suffix


def cells(tokens: list[int]) -> HostEntry:
    return HostEntry(tokens=tokens, blob=bytes(tokens))


SYSTEM = [t % 200 for t in range(40)]  # a system prompt every session opens with (40 tokens)


def test_a_prefix_sessions_share_is_kept_once() -> None:
    store = HostStore(10_000, codec=CellsCodec())
    sessions = {f"s{i}": cells(SYSTEM + [200 + i] * 10) for i in range(5)}
    for sid, entry in sessions.items():
        assert store.put(sid, entry)
    assert store.used_bytes == 40 + 5 * 10  # not 5 * 50
    assert store.shared_bytes_saved == 4 * 40
    assert [len(p.tokens) for p in store.prefixes] == [40]
    assert store.stored_bytes("s3") == 50 and store.tokens("s3") == sessions["s3"].tokens
    assert store.get("s2") == sessions["s2"]  # whole again, still stored
    for sid, entry in sessions.items():
        assert store.take(sid) == entry
    assert store.used_bytes == 0 and store.prefixes == [] and store.shared_bytes_saved == 0


def test_sharing_lets_more_sessions_fit_the_budget() -> None:
    shared = HostStore(40 + 5 * 10, codec=CellsCodec())
    alone = HostStore(40 + 5 * 10)
    for i in range(5):
        shared.put(f"s{i}", cells(SYSTEM + [200 + i] * 10))
        alone.put(f"s{i}", cells(SYSTEM + [200 + i] * 10))
    assert len(shared) == 5 and len(alone) == 1


def test_a_short_common_prefix_is_not_kept_apart() -> None:
    store = HostStore(10_000, codec=CellsCodec())
    store.put("a", cells(SYSTEM[:8] + [1] * 30))
    store.put("b", cells(SYSTEM[:8] + [2] * 30))
    assert store.prefixes == [] and store.used_bytes == 76


def test_dropping_the_last_user_of_a_prefix_frees_it() -> None:
    store = HostStore(40 + 2 * 10, codec=CellsCodec())
    store.put("a", cells(SYSTEM + [1] * 10))
    store.put("b", cells(SYSTEM + [2] * 10))
    assert store.used_bytes == 60
    # a newcomer with nothing in common fits only once both users and their prefix are gone
    assert store.put("c", cells([250] * 55))
    assert "a" not in store and "b" not in store and store.prefixes == []
    assert store.used_bytes == 55


def test_a_state_the_codec_cannot_cut_is_kept_whole() -> None:
    class Refusing(CellsCodec):
        @staticmethod
        def split(blob: bytes, position: int) -> tuple[bytes, bytes]:
            raise ValueError("two caches")

    store = HostStore(10_000, codec=Refusing())
    store.put("a", cells(SYSTEM + [1] * 10))
    store.put("b", cells(SYSTEM + [2] * 10))
    assert store.prefixes == [] and store.used_bytes == 100
    assert store.take("b") == cells(SYSTEM + [2] * 10)


def test_a_newcomer_keeps_the_prefix_of_the_entry_it_displaces() -> None:
    store = HostStore(40 + 2 * 10, codec=CellsCodec())
    store.put("a", cells(SYSTEM + [1] * 10))
    store.put("b", cells(SYSTEM + [2] * 10))
    store.put("c", cells(SYSTEM + [3] * 10))  # a goes; the prefix stays for b and c
    assert "a" not in store and store.used_bytes == 60 and len(store.prefixes) == 1
    store.drop("b")
    assert store.take("c") == cells(SYSTEM + [3] * 10)
    assert store.used_bytes == 0 and store.prefixes == []


def test_a_refused_newcomer_leaves_the_entries_it_shared_with_whole() -> None:
    f = ReuseForecast()
    f.note_turn("a")
    f.note_turn("a")  # a is due back; b is unknown, so due last
    store = HostStore(50, f, codec=CellsCodec())
    assert store.put("a", cells(SYSTEM + [1] * 10))
    assert not store.put("b", cells(SYSTEM + [2] * 10))
    assert store.prefixes == [] and store.used_bytes == 50
    assert store.take("a") == cells(SYSTEM + [1] * 10)


def test_parts_that_no_longer_join_are_dropped_not_raised() -> None:
    class NoJoin(CellsCodec):
        @staticmethod
        def join(prefix: bytes, suffix: bytes) -> bytes:
            raise ValueError("prefix and suffix come from differently shaped caches")

    store = HostStore(10_000, codec=NoJoin())
    store.put("a", cells(SYSTEM + [1] * 10))
    store.put("b", cells(SYSTEM + [2] * 10))
    assert store.take("a") is None and "a" not in store and store.dropped_total == 1


def test_a_state_llama_cpp_refuses_is_prefilled_instead() -> None:
    class RefusingKv(FakeKv):
        def state_import(self, seq_id: int, blob: bytes) -> None:
            raise RuntimeError("llama_state_seq_set_data refused 100 bytes")

    seqs = SequenceTable(RefusingKv(), 1, HostStore(10_000))
    assert seqs.import_("moved", HostEntry(tokens=[1, 2, 3], blob=b"z" * 100))
    got = seqs.acquire("moved", [1, 2, 3, 4])
    assert got is not None and not got.restored_from_host and got.cached_tokens == 0
    assert seqs.restores_failed == 1 and got.sequence.tokens == []
