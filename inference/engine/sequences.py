"""Which session owns which KV sequence, and the host-RAM store for idle sessions' KV.

The table only keeps books; the KV cache itself is touched through a ``KvStore`` (the engine's
``LlamaContext``), so these rules are testable without a model.
"""

from __future__ import annotations

import json
import math
import statistics
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class KvStore(Protocol):
    def seq_truncate(self, seq_id: int, keep: int) -> None: ...
    def seq_share(self, src: int, dst: int, count: int) -> None: ...
    def state_export(self, seq_id: int) -> bytes: ...

    def state_import(self, seq_id: int, blob: bytes) -> None:
        """Raises ``RuntimeError`` (``LlamaError``) when the state is refused."""


class SessionBusy(RuntimeError):
    """The session has a request in flight; the operation must wait or be refused."""


@dataclass
class Sequence:
    """One KV sequence of the context. ``tokens`` are exactly the tokens whose KV it holds."""

    seq_id: int
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0


@dataclass
class HostEntry:
    """A session's KV copied out to host RAM (``llama_state_seq_get_data``) with its tokens."""

    tokens: list[int]
    blob: bytes


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share.

    Binary search over slice comparisons (done in C), O(n log n) element compares at worst but
    far faster than a Python loop for the thousands-of-tokens prompts of agent sessions.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


ABANDONED_AFTER_GAPS = 4  # a session not back within 4 of its usual gaps is presumed gone
FORECAST_SESSIONS = 4096  # sessions whose turn gaps are remembered (oldest forgotten first)


class ReuseForecast:
    """When each session is expected back, from the gaps between its own turns.

    Time is counted in turns of the whole node (``note_turn`` per request), so a forecast means
    "about N other turns from now". An agent session comes back after a gap of roughly the
    number of sessions interleaved with it (its reuse distance), and keeps that rhythm; a
    session not back within ``ABANDONED_AFTER_GAPS`` of its gaps is presumed gone. Evicting the
    entry due back last is Belady's rule (L. A. Belady, "A study of replacement algorithms for a
    virtual-storage computer", IBM Systems Journal 5(2), 1966) on this forecast: with sessions
    taking turns round-robin it keeps a fixed set warm instead of dropping each entry just
    before it is needed, which is what least-recently-used does.
    """

    def __init__(self) -> None:
        self.tick = 0
        self._last: OrderedDict[str, int] = OrderedDict()
        self._gap: dict[str, float] = {}

    def note_turn(self, session_id: str) -> None:
        """A request of ``session_id`` starts now."""
        self.tick += 1
        last = self._last.pop(session_id, None)
        if last is not None:
            gap = float(self.tick - last)
            before = self._gap.get(session_id)
            self._gap[session_id] = gap if before is None else (before + gap) / 2
        self._last[session_id] = self.tick
        while len(self._last) > FORECAST_SESSIONS:
            gone, _ = self._last.popitem(last=False)
            self._gap.pop(gone, None)

    def expect(self, session_id: str) -> None:
        """``session_id`` is due now, with a typical gap: a session moved here from another
        node (its state imported) whose next turn is about to come."""
        gap = self.typical_gap()
        self._last.pop(session_id, None)
        self._last[session_id] = self.tick - int(gap)
        self._gap[session_id] = gap

    def due_in(self, session_id: str, typical: float | None = None) -> float:
        """Turns until ``session_id`` is expected back (``inf`` when unknown or presumed gone).

        A session seen once is given the median gap of the others (or the number of sessions
        known, when no gap is); ``typical`` is that figure when the caller already has it."""
        last = self._last.get(session_id)
        if last is None:
            return math.inf
        gap = self._gap.get(session_id) or typical or self.typical_gap()
        since = self.tick - last
        if since > ABANDONED_AFTER_GAPS * gap:
            return math.inf
        return max(gap - since, 0.0)

    def typical_gap(self) -> float:
        """The median gap between turns of the sessions known (their count when none has one)."""
        if self._gap:
            return statistics.median(self._gap.values())
        return float(max(1, len(self._last)))


class StateCodec(Protocol):
    """Cuts a sequence's KV state at a position and joins the parts (``kv_blob``)."""

    def split(self, blob: bytes, position: int) -> tuple[bytes, bytes]: ...
    def join(self, prefix: bytes, suffix: bytes) -> bytes: ...


MIN_SHARED_TOKENS = 32  # a common prefix shorter than this is not worth keeping apart


@dataclass
class SharedPrefix:
    """The KV of a prefix several stored sessions begin with (a system prompt listing tools),
    kept once in host RAM; ``sessions`` are the entries that use it."""

    tokens: list[int]
    blob: bytes
    sessions: set[str] = field(default_factory=set)


@dataclass
class _Stored:
    tokens: list[int]
    own: bytes  # the cells from len(prefix.tokens) on; the whole state when prefix is None
    prefix: SharedPrefix | None = None


class HostStore:
    """Idle sessions' KV in host RAM, within ``budget_bytes``.

    Past the budget the entry due back last (``ReuseForecast.due_in``; the newcomer competes
    too, and is refused when it is the one due last) is dropped; between equals the one stored
    first goes. With no forecast fed, that is least-recently-stored first.

    With a ``codec`` (``inference.engine.kv_blob``), a prefix of at least ``MIN_SHARED_TOKENS``
    tokens that stored sessions have in common is kept once (``SharedPrefix``) and each session
    keeps only its own cells; ``take`` and ``get`` join them back into a whole state. The budget
    counts every byte held once."""

    def __init__(
        self,
        budget_bytes: int,
        forecast: ReuseForecast | None = None,
        codec: StateCodec | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.forecast = forecast or ReuseForecast()
        self.codec = codec
        self._entries: OrderedDict[str, _Stored] = OrderedDict()
        self._prefixes: list[SharedPrefix] = []
        self.used_bytes = 0
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    @property
    def prefixes(self) -> list[SharedPrefix]:
        return list(self._prefixes)

    @property
    def shared_bytes_saved(self) -> int:
        """Bytes not stored twice right now: each prefix once for every user but the first."""
        return sum(len(p.blob) * (len(p.sessions) - 1) for p in self._prefixes)

    def tokens(self, session_id: str) -> list[int] | None:
        """The tokens whose KV is stored for ``session_id`` (no copy of the KV is made)."""
        stored = self._entries.get(session_id)
        return stored.tokens if stored else None

    def stored_bytes(self, session_id: str) -> int:
        """Bytes of ``session_id``'s state once joined (its own cells and its prefix)."""
        stored = self._entries.get(session_id)
        if stored is None:
            return 0
        return len(stored.own) + (len(stored.prefix.blob) if stored.prefix else 0)

    def get(self, session_id: str) -> HostEntry | None:
        """The whole stored state of ``session_id``, left in the store."""
        stored = self._entries.get(session_id)
        return self._whole(stored) if stored else None

    def put(self, session_id: str, entry: HostEntry) -> bool:
        """Store ``entry``; returns False when it is not kept (larger than the whole budget, or
        due back after the entries it would have to displace; then nothing else is dropped)."""
        self.drop(session_id)
        stored, new_prefix = self._shape(entry)
        moved: list[tuple[_Stored, bytes]] = []
        if new_prefix is not None:  # the entries it was found in move onto it first
            self._prefixes.append(new_prefix)
            self.used_bytes += len(new_prefix.blob)
            moved = self._rehome(new_prefix)
        victims = None
        if len(stored.own) <= self.budget_bytes:
            victims = self._victims(session_id, len(stored.own), stored.prefix)
        if victims is None:
            self.dropped_total += 1
            if new_prefix is not None:
                self._unhome(new_prefix, moved)
            return False
        self._add(session_id, stored)  # before the victims go: it may keep their prefix
        for victim in victims:
            self.drop(victim)
            self.dropped_total += 1
        return True

    def _shape(self, entry: HostEntry) -> tuple[_Stored, SharedPrefix | None]:
        """How ``entry`` is stored: on a prefix already kept, on a new prefix it shares with a
        stored entry (returned second, not yet kept), or whole."""
        whole = _Stored(tokens=list(entry.tokens), own=entry.blob)
        if self.codec is None:
            return whole, None
        kept = self._kept_prefix(entry.tokens)
        if kept is not None:
            return self._on(kept, entry) or whole, None
        shared = max(
            (common_prefix_len(s.tokens, entry.tokens) for s in self._entries.values()),
            default=0,
        )
        if shared < MIN_SHARED_TOKENS:
            return whole, None
        prefix_blob, own = self._split(entry.blob, shared)
        if prefix_blob is None:
            return whole, None
        prefix = SharedPrefix(tokens=list(entry.tokens[:shared]), blob=prefix_blob)
        return _Stored(tokens=list(entry.tokens), own=own, prefix=prefix), prefix

    def _kept_prefix(self, tokens: list[int]) -> SharedPrefix | None:
        fitting = [
            p for p in self._prefixes if common_prefix_len(p.tokens, tokens) == len(p.tokens)
        ]
        return max(fitting, key=lambda p: len(p.tokens), default=None)

    def _on(self, prefix: SharedPrefix, entry: HostEntry) -> _Stored | None:
        _, own = self._split(entry.blob, len(prefix.tokens))
        if own is None:
            return None
        return _Stored(tokens=list(entry.tokens), own=own, prefix=prefix)

    def _split(self, blob: bytes, position: int) -> tuple[bytes | None, bytes | None]:
        try:
            return self.codec.split(blob, position)
        except ValueError:  # a state the codec cannot cut is kept whole
            return None, None

    def _rehome(self, prefix: SharedPrefix) -> list[tuple[_Stored, bytes]]:
        """Entries stored whole that begin with ``prefix`` keep only their own cells (in
        place: their order, which breaks ties between victims, stays); returns each moved
        entry with the whole state it had, for ``_unhome``."""
        n = len(prefix.tokens)
        moved = []
        for sid, stored in self._entries.items():
            if stored.prefix is None and common_prefix_len(stored.tokens, prefix.tokens) == n:
                _, own = self._split(stored.own, n)
                if own is not None:
                    moved.append((stored, stored.own))
                    self.used_bytes -= len(stored.own) - len(own)
                    stored.own = own
                    stored.prefix = prefix
                    prefix.sessions.add(sid)
        return moved

    def _unhome(self, prefix: SharedPrefix, moved: list[tuple[_Stored, bytes]]) -> None:
        """Undo ``_rehome`` and forget ``prefix`` (the newcomer that brought it was refused)."""
        for stored, whole in moved:
            self.used_bytes += len(whole) - len(stored.own)
            stored.own, stored.prefix = whole, None
        prefix.sessions.clear()
        self._prefixes.remove(prefix)
        self.used_bytes -= len(prefix.blob)

    def _add(self, session_id: str, stored: _Stored) -> None:
        self._entries[session_id] = stored
        self.used_bytes += len(stored.own)
        if stored.prefix is not None:
            stored.prefix.sessions.add(session_id)

    def _remove(self, session_id: str) -> None:
        stored = self._entries.pop(session_id, None)
        if stored is None:
            return
        self.used_bytes -= len(stored.own)
        prefix = stored.prefix
        if prefix is not None:
            prefix.sessions.discard(session_id)
            if not prefix.sessions:
                self._prefixes.remove(prefix)
                self.used_bytes -= len(prefix.blob)

    def _whole(self, stored: _Stored) -> HostEntry | None:
        """The entry with its prefix joined back; None when the parts do not join (an imported
        state from a node with other cache settings rehomed onto this node's prefix)."""
        blob = stored.own
        if stored.prefix is not None:
            try:
                blob = self.codec.join(stored.prefix.blob, stored.own)
            except ValueError:
                return None
        return HostEntry(tokens=list(stored.tokens), blob=blob)

    def _victims(self, newcomer: str, size: int, uses: SharedPrefix | None) -> list[str] | None:
        """The entries to drop so ``size`` more bytes fit, due-last first; None when the
        newcomer itself would be due back after all of them (it is then not stored). A
        victim frees its own cells, and its prefix once no one else left uses it."""
        excess = self.used_bytes + size - self.budget_bytes
        if excess <= 0:
            return []
        typical = self.forecast.typical_gap()
        order = {sid: i for i, sid in enumerate(self._entries)}
        order[newcomer] = len(order)

        def due_last_first(sid: str) -> tuple[float, int]:
            return (-self.forecast.due_in(sid, typical), order[sid])

        victims: list[str] = []
        users = {id(p): set(p.sessions) for p in self._prefixes}
        for sid in sorted([*self._entries, newcomer], key=due_last_first):
            if excess <= 0:
                break
            if sid == newcomer:
                return None
            victims.append(sid)
            stored = self._entries[sid]
            excess -= len(stored.own)
            prefix = stored.prefix
            if prefix is not None and prefix is not uses:
                users[id(prefix)].discard(sid)
                if not users[id(prefix)]:
                    excess -= len(prefix.blob)
        return victims

    def take(self, session_id: str) -> HostEntry | None:
        """The whole stored state of ``session_id``, removed from the store."""
        stored = self._entries.get(session_id)
        if stored is None:
            return None
        entry = self._whole(stored)
        self._remove(session_id)
        if entry is None:
            self.dropped_total += 1
        return entry

    def drop(self, session_id: str) -> None:
        self._remove(session_id)

    def clear(self) -> None:
        self._entries.clear()
        self._prefixes.clear()
        self.used_bytes = 0


@dataclass(frozen=True)
class Assignment:
    """The sequence a request runs on and how many prompt tokens it reuses from the cache."""

    sequence: Sequence
    cached_tokens: int
    restored_from_host: bool


class SequenceTable:
    """Assigns sequences to sessions: stick, reuse the longest prefix, spill idle KV to host RAM."""

    def __init__(
        self,
        kv: KvStore,
        count: int,
        host: HostStore,
        *,
        prefix_reuse: bool = True,
        clock: Callable[[], float] = time.monotonic,
        prefill_speed: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.kv = kv
        self.sequences = [Sequence(seq_id=i) for i in range(count)]
        self.host = host
        self.prefix_reuse = prefix_reuse
        self.clock = clock
        self.prefill_speed = prefill_speed  # prompt tokens/s the engine prefills at (0: unknown)
        self.restore_speed = 0.0  # bytes/s copied back from host RAM (moving average; 0: unknown)
        self.restores_skipped = 0
        self.restores_failed = 0  # refused by llama.cpp; the prompt was prefilled instead

    def resident(self, session_id: str) -> Sequence | None:
        for seq in self.sequences:
            if seq.session_id == session_id:
                return seq
        return None

    def is_busy(self, session_id: str | None) -> bool:
        seq = self.resident(session_id) if session_id else None
        return bool(seq and seq.busy)

    def acquire(self, session_id: str | None, prompt: list[int]) -> Assignment | None:
        """A sequence for a request, or None when every sequence is busy (or the session is).

        The returned sequence is marked busy and truncated to the reused prefix; at least one
        prompt token is always left to prefill, so the request gets logits to sample from.
        """
        seq = self.resident(session_id) if session_id else None
        if seq is not None and seq.busy:
            return None
        restored = False
        if seq is None:
            seq = self._free_sequence(prompt)
            if seq is None:
                return None
            # the session's own host entry leaves the store before the victim's enters it
            entry = self.host.take(session_id) if session_id else None
            self._spill_to_host(seq)
            seq.session_id = session_id
            if entry is not None and not self._restore_pays(entry, prompt):
                self.restores_skipped += 1
                entry = None
            restored = self._restore(seq, entry)
        keep = self._reuse(seq, prompt) if self.prefix_reuse else 0
        self.kv.seq_truncate(seq.seq_id, keep)
        del seq.tokens[keep:]
        seq.busy = True
        seq.last_used = self.clock()
        if session_id:
            self.host.forecast.note_turn(session_id)
        return Assignment(sequence=seq, cached_tokens=keep, restored_from_host=restored)

    def _reuse(self, seq: Sequence, prompt: list[int]) -> int:
        """Cells of ``seq`` to keep for ``prompt``: its own prefix, or a longer one shared from
        another sequence (a system prompt common to many sessions is prefilled once).

        At least one prompt token is always left to prefill, so the request gets logits."""
        limit = len(prompt) - 1
        own = min(common_prefix_len(seq.tokens, prompt), limit)
        donor, shared = None, own
        for other in self.sequences:
            if other is not seq:
                n = min(common_prefix_len(other.tokens, prompt), limit)
                if n > shared:
                    donor, shared = other, n
        if donor is None:
            return own
        self.kv.seq_truncate(seq.seq_id, 0)
        self.kv.seq_share(donor.seq_id, seq.seq_id, shared)
        seq.tokens[:] = prompt[:shared]
        return shared

    def cached_prefix(self, session_id: str | None, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` could be reused right now (any sequence, or the
        session's own host-RAM entry)."""
        best = max((common_prefix_len(s.tokens, prompt) for s in self.sequences), default=0)
        stored = self.host.tokens(session_id) if session_id else None
        if stored is not None:
            best = max(best, common_prefix_len(stored, prompt))
        return best

    def release(self, seq: Sequence) -> None:
        seq.busy = False
        seq.last_used = self.clock()

    def _free_sequence(self, prompt: list[int]) -> Sequence | None:
        """An idle sequence for a new owner: an unowned one holding the longest prefix of
        ``prompt``, else the least recently used (its session is then spilled to host)."""
        unowned = [s for s in self.sequences if not s.busy and s.session_id is None]
        if unowned:
            return max(unowned, key=lambda s: (common_prefix_len(s.tokens, prompt), -s.last_used))
        idle = [s for s in self.sequences if not s.busy]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def _spill_to_host(self, seq: Sequence) -> None:
        if seq.session_id is None:
            return  # unowned: its cells stay, as a prefix another prompt may share
        if seq.tokens:
            blob = self.kv.state_export(seq.seq_id)
            self.host.put(seq.session_id, HostEntry(tokens=list(seq.tokens), blob=blob))
        self.kv.seq_truncate(seq.seq_id, 0)
        seq.tokens.clear()
        seq.session_id = None

    def _restore_pays(self, entry: HostEntry, prompt: list[int]) -> bool:
        """Whether copying ``entry`` back beats prefilling what of it ``prompt`` can use: its
        bytes at the measured restore speed against the usable prefix at the measured prefill
        speed. Unmeasured speeds restore (optimistic); nothing usable never does."""
        usable = min(common_prefix_len(entry.tokens, prompt), len(prompt) - 1)
        if usable <= 0:
            return False
        prefill_speed = self.prefill_speed()
        if not self.restore_speed or not prefill_speed:
            return True
        return len(entry.blob) / self.restore_speed < usable / prefill_speed

    def _restore(self, seq: Sequence, entry: HostEntry | None) -> bool:
        """Copy ``entry`` into ``seq``; False (the sequence left empty, the prompt prefilled)
        when there is none or llama.cpp refuses it (a state from a node with another model,
        cache type or flash-attention setting)."""
        if entry is None:
            return False
        began = time.perf_counter()
        try:
            self.kv.state_import(seq.seq_id, entry.blob)
        except (RuntimeError, ValueError):
            self.kv.seq_truncate(seq.seq_id, 0)
            self.restores_failed += 1
            return False
        elapsed = time.perf_counter() - began
        if elapsed > 0:
            speed = len(entry.blob) / elapsed
            self.restore_speed = (
                speed if not self.restore_speed else 0.8 * self.restore_speed + 0.2 * speed
            )
        seq.tokens[:] = entry.tokens
        return True

    # Session operations (node API /sessions/<id>) -----------------------------------------

    def locate(self, session_id: str, bytes_per_token: int) -> dict | None:
        """Where a session's KV is: ``{"where": "sequence"|"host", "tokens": n, "bytes": b}``."""
        seq = self.resident(session_id)
        if seq is not None:
            return {
                "where": "sequence",
                "sequence": seq.seq_id,
                "busy": seq.busy,
                "tokens": len(seq.tokens),
                "bytes": len(seq.tokens) * bytes_per_token,
            }
        stored = self.host.tokens(session_id)
        if stored is not None:
            return {
                "where": "host",
                "sequence": None,
                "busy": False,
                "tokens": len(stored),
                "bytes": self.host.stored_bytes(session_id),
            }
        return None

    def export(self, session_id: str) -> HostEntry | None:
        seq = self.resident(session_id)
        if seq is not None:
            if seq.busy:
                raise SessionBusy(session_id)
            return HostEntry(tokens=list(seq.tokens), blob=self.kv.state_export(seq.seq_id))
        return self.host.get(session_id)

    def import_(self, session_id: str, entry: HostEntry) -> bool:
        """Place an exported state in host RAM; the session's next turn restores it (it is
        expected soon: a session is moved when its next turn is routed here)."""
        self.erase(session_id)
        self.host.forecast.expect(session_id)
        return self.host.put(session_id, entry)

    def erase(self, session_id: str) -> bool:
        """Forget a session's KV wherever it is; returns whether there was any."""
        found = session_id in self.host
        self.host.drop(session_id)
        seq = self.resident(session_id)
        if seq is not None:
            if seq.busy:
                raise SessionBusy(session_id)
            self.kv.seq_truncate(seq.seq_id, 0)
            seq.tokens.clear()
            seq.session_id = None
            found = True
        return found


_MAGIC = b"PHXKV1\n"


def pack_state(entry: HostEntry, *, model_sha256: str = "") -> bytes:
    """Serialize a session state: magic, 4-byte header length, JSON header, llama.cpp blob."""
    header = json.dumps({"tokens": entry.tokens, "model_sha256": model_sha256}).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + entry.blob


def unpack_state(data: bytes) -> tuple[HostEntry, str]:
    """Inverse of ``pack_state``; raises ``ValueError`` naming what is wrong with ``data``."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        raise ValueError("not a Phalanx session state (bad magic)")
    start = len(_MAGIC) + 4
    (size,) = struct.unpack("<I", data[len(_MAGIC) : start])
    try:
        header = json.loads(data[start : start + size])
        tokens = [int(t) for t in header["tokens"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"session state header is invalid: {exc}") from exc
    return HostEntry(tokens=tokens, blob=data[start + size :]), str(header.get("model_sha256", ""))
