"""Idle sessions' KV in host RAM (``HostStore``), within a budget, with the prefix several
sessions share kept once."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from inference.engine.reuse_forecast import ReuseForecast
from inference.engine.token_prefix import common_prefix_len


@dataclass
class HostEntry:
    """A session's KV copied out to host RAM (``llama_state_seq_get_data``) with its tokens."""

    tokens: list[int]
    blob: bytes


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
