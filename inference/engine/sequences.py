"""Which session owns which KV sequence, and the host-RAM store for idle sessions' KV.

The table only keeps books; the KV cache itself is touched through a ``KvStore`` (the engine's
``LlamaContext``), so these rules are testable without a model.
"""

from __future__ import annotations

import json
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
    def state_import(self, seq_id: int, blob: bytes) -> None: ...


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


class HostStore:
    """Idle sessions' KV in host RAM, least recently stored dropped first past ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()
        self.used_bytes = 0
        self.dropped_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def get(self, session_id: str) -> HostEntry | None:
        return self._entries.get(session_id)

    def put(self, session_id: str, entry: HostEntry) -> bool:
        """Store ``entry``; returns False when it alone exceeds the budget (then nothing kept)."""
        self.drop(session_id)
        if len(entry.blob) > self.budget_bytes:
            self.dropped_total += 1
            return False
        while self.used_bytes + len(entry.blob) > self.budget_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.used_bytes -= len(oldest.blob)
            self.dropped_total += 1
        self._entries[session_id] = entry
        self.used_bytes += len(entry.blob)
        return True

    def take(self, session_id: str) -> HostEntry | None:
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self.used_bytes -= len(entry.blob)
        return entry

    def drop(self, session_id: str) -> None:
        self.take(session_id)

    def clear(self) -> None:
        self._entries.clear()
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
    ) -> None:
        self.kv = kv
        self.sequences = [Sequence(seq_id=i) for i in range(count)]
        self.host = host
        self.prefix_reuse = prefix_reuse
        self.clock = clock

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
            seq.session_id = session_id
            restored = self._restore_from_host(seq, session_id)
        keep = self._reuse(seq, prompt) if self.prefix_reuse else 0
        self.kv.seq_truncate(seq.seq_id, keep)
        del seq.tokens[keep:]
        seq.busy = True
        seq.last_used = self.clock()
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
        entry = self.host.get(session_id) if session_id else None
        if entry is not None:
            best = max(best, common_prefix_len(entry.tokens, prompt))
        return best

    def release(self, seq: Sequence) -> None:
        seq.busy = False
        seq.last_used = self.clock()

    def _free_sequence(self, prompt: list[int]) -> Sequence | None:
        unowned = [s for s in self.sequences if not s.busy and s.session_id is None]
        if unowned:
            return max(unowned, key=lambda s: (common_prefix_len(s.tokens, prompt), -s.last_used))
        idle = [s for s in self.sequences if not s.busy]
        if not idle:
            return None
        victim = min(idle, key=lambda s: s.last_used)
        self._spill_to_host(victim)
        return victim

    def _spill_to_host(self, seq: Sequence) -> None:
        if seq.session_id is not None and seq.tokens:
            blob = self.kv.state_export(seq.seq_id)
            self.host.put(seq.session_id, HostEntry(tokens=list(seq.tokens), blob=blob))
        self.kv.seq_truncate(seq.seq_id, 0)
        seq.tokens.clear()
        seq.session_id = None

    def _restore_from_host(self, seq: Sequence, session_id: str | None) -> bool:
        entry = self.host.take(session_id) if session_id else None
        if entry is None:
            return False
        self.kv.state_import(seq.seq_id, entry.blob)
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
        entry = self.host.get(session_id)
        if entry is not None:
            return {
                "where": "host",
                "sequence": None,
                "busy": False,
                "tokens": len(entry.tokens),
                "bytes": len(entry.blob),
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
        """Place an exported state in host RAM; the session's next turn restores it."""
        self.erase(session_id)
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
